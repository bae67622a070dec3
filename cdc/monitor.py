"""Watch running queries: a ``StreamingQueryListener`` that logs each cdc source's lag per channel at every
progress event and, when asked, serves it as Prometheus metrics. One line attaches it::

    monitor = cdc.monitor.attach(spark, prometheus_port=9464)   # metrics on http://127.0.0.1:9464/metrics

The figures come from the source's ``latestOffset`` in query progress (see :mod:`cdc.lag`: a Python source
cannot report custom metrics there). Metrics, labelled ``query`` (name, else id), ``source`` (its index in
the query plan) and ``channel``:

``cdc_records_behind``         records from the query's position to the channel's head
``cdc_time_behind_seconds``    how long ago the last change the query delivered was committed (0 caught up)
``cdc_backend_lag``            the system's own measures, with a ``measure`` label (``rpoMs``, ``backlog``)
``cdc_input_rows_per_second``  the query's input rate (labels ``query`` only)

The endpoint listens on 127.0.0.1 unless ``prometheus_addr`` says otherwise: exposing it is the user's call.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from cdc.errors import requires_extra

with requires_extra("monitor", "cdc.monitor"):
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.core import GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
from pyspark.sql.streaming.listener import StreamingQueryListener

from cdc.lag import ChannelLag, from_report

log = logging.getLogger(__name__)


@dataclass
class QueryLag:
    """The last progress of one query as the monitor saw it."""

    query: str
    batch_id: int
    input_rows_per_second: float
    sources: dict[int, list[ChannelLag]] = field(default_factory=dict)


def summary(q: QueryLag) -> str:
    """One line per progress event: ``query 'orders' batch 7: c0 8 behind (2.1 s), c1 0 behind``."""
    parts = []
    for index, lags in sorted(q.sources.items()):
        for lag in lags:
            behind = "?" if lag.behind is None else str(lag.behind)
            text = f"{lag.channel} {behind} behind"
            if lag.time_behind_ms:
                text += f" ({lag.time_behind_ms / 1000:.1f} s)"
            text += "".join(f", {k} {v:g}" for k, v in sorted(lag.measures.items()))
            parts.append(text if len(q.sources) == 1 else f"#{index} {text}")
    return f"query {q.query!r} batch {q.batch_id}: " + ("; ".join(parts) or "no cdc source")


class _LagCollector(Collector):
    def __init__(self, monitor: LagMonitor) -> None:
        self.monitor = monitor

    def collect(self) -> Iterator[Metric]:
        behind = GaugeMetricFamily(
            "cdc_records_behind",
            "Records from the query's position to the channel's head.",
            labels=["query", "source", "channel"],
        )
        late = GaugeMetricFamily(
            "cdc_time_behind_seconds",
            "Age of the last change the query delivered while records are behind.",
            labels=["query", "source", "channel"],
        )
        own = GaugeMetricFamily(
            "cdc_backend_lag",
            "The change-log system's own lag measures (Tablestore rpoMs, Pulsar backlog).",
            labels=["query", "source", "channel", "measure"],
        )
        rate = GaugeMetricFamily("cdc_input_rows_per_second", "The query's input rate.", labels=["query"])
        for q in self.monitor.queries():
            rate.add_metric([q.query], q.input_rows_per_second)
            for index, lags in q.sources.items():
                for lag in lags:
                    labels = [q.query, str(index), lag.channel]
                    if lag.behind is not None:
                        behind.add_metric(labels, lag.behind)
                    if lag.time_behind_ms is not None:
                        late.add_metric(labels, lag.time_behind_ms / 1000)
                    for name, value in lag.measures.items():
                        own.add_metric([*labels, name], value)
        yield from (behind, late, own, rate)


class LagMonitor(StreamingQueryListener):
    """Logs every cdc source's lag per channel at each progress event; keeps the last one per query."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queries: dict[str, QueryLag] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_LagCollector(self))
        self._server: Any = None
        self.port: int | None = None

    def queries(self) -> list[QueryLag]:
        with self._lock:
            return list(self._queries.values())

    def serve(self, port: int, addr: str = "127.0.0.1") -> int:
        """Serve the metrics at ``http://addr:port/metrics`` (port 0: any free one); returns the port."""
        server, _ = start_http_server(port, addr=addr, registry=self.registry)
        self._server = server
        self.port = int(server.server_port)
        log.info("cdc metrics on http://%s:%d/metrics", addr, self.port)
        return self.port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ------------------------------------------------------------------ listener events
    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        p = event.progress
        sources: dict[int, list[ChannelLag]] = {}
        for index, source in enumerate(p.sources):
            lags = from_report(source.latestOffset)
            if lags:
                sources[index] = lags
        if not sources:
            return  # a query without cdc source: nothing to say
        key = str(p.id)
        q = QueryLag(p.name or key, int(p.batchId), float(p.inputRowsPerSecond or 0.0), sources)
        with self._lock:
            self._queries[key] = q
        log.info("%s", summary(q))

    def onQueryTerminated(self, event: Any) -> None:
        with self._lock:
            self._queries.pop(str(event.id), None)


def attach(spark: Any, prometheus_port: int | None = None, prometheus_addr: str = "127.0.0.1") -> LagMonitor:
    """Attach a :class:`LagMonitor` to ``spark``'s queries; with ``prometheus_port``, serve its metrics."""
    monitor = LagMonitor()
    if prometheus_port is not None:
        monitor.serve(prometheus_port, prometheus_addr)
    spark.streams.addListener(monitor)
    return monitor
