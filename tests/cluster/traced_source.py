"""The ``cdc`` source with its executor-side ``read()`` traced, for the cluster tests: each read appends the
reading process's id and its parent chain to a file in ``$CDC_TRACE_READS`` (set on executors through
``spark.executorEnv``), so a test can tell which machine-level process read which channel, and
``$CDC_TRACE_READ_DELAY`` seconds of sleep make a batch long enough for a worker to be killed in it."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from cdc.source import CdcDataSource, CdcStreamReader

TRACE_ENV = "CDC_TRACE_READS"
DELAY_ENV = "CDC_TRACE_READ_DELAY"


def parent_chain(pid: int) -> list[int]:
    chain = [pid]
    while pid > 1:
        status = Path(f"/proc/{pid}/status").read_text()
        pid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        chain.append(pid)
    return chain


class TracedStreamReader(CdcStreamReader):
    def read(self, partition: InputPartition) -> Iterator[Any]:
        trace = os.environ.get(TRACE_ENV)
        if trace:
            with open(Path(trace) / f"{os.getpid()}.jsonl", "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "chain": parent_chain(os.getpid()), "t": time.time(),
                                    "channel": getattr(partition, "channel", None)}) + "\n")
        time.sleep(float(os.environ.get(DELAY_ENV, "0")))
        yield from super().read(partition)


class TracedCdcDataSource(CdcDataSource):
    @classmethod
    def name(cls) -> str:
        return "cdc-traced"

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TracedStreamReader(self._config, schema)
