ALTER TABLE public.orders REPLICA IDENTITY FULL;   -- applies to changes logged from now on
SELECT relname, relreplident FROM pg_class WHERE relname = 'orders';  -- 'f' full, 'd' default
