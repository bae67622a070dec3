CREATE ROLE cdc WITH LOGIN REPLICATION PASSWORD 'change-me';
GRANT CONNECT ON DATABASE shop TO cdc;
GRANT USAGE ON SCHEMA public TO cdc;
GRANT SELECT ON public.orders, public.customers TO cdc;        -- the snapshot reads the tables
-- Either let the query create its publication (it must then own the tables, or be a superuser) ...
GRANT CREATE ON DATABASE shop TO cdc;
-- ... or create it once as the tables' owner, and give the query .option("publication.name", "cdc_shop"):
CREATE PUBLICATION cdc_shop FOR TABLE public.orders, public.customers;
