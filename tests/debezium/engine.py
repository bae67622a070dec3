"""Running Debezium's embedded engine (tests/debezium/engine, built by ``make debezium-engine``) against a
PostgreSQL server, and publishing what it emits to Pulsar as Debezium's Pulsar producers do."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest

from tests.debezium.conftest import Database

ENGINE = Path(__file__).parent / "engine"


@dataclass(frozen=True)
class Event:
    """One change event as Debezium's JSON converter wrote it; ``value`` is empty for a tombstone."""

    key: bytes
    value: bytes


def classpath() -> str:
    listed = ENGINE / "target" / "classpath.txt"
    if not listed.exists():
        pytest.fail("the Debezium engine is not built: run `make debezium-engine` (needs Maven and a JDK 17)")
    return listed.read_text().strip() + os.pathsep + str(ENGINE / "target" / "classes")


class DebeziumEngine:
    """One engine process: a replication slot and publication of its own, events read from its stdout."""

    def __init__(self, workdir: Path, db: Database, table: str, slot: str, *, schemas: bool,
                 transactions: bool = False) -> None:
        props = workdir / f"{slot}.properties"
        props.write_text("\n".join([
            "name=" + slot,
            "connector.class=io.debezium.connector.postgresql.PostgresConnector",
            "offset.storage=org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
            "offset.flush.interval.ms=0",
            "database.hostname=127.0.0.1",
            f"database.port={db.port}",
            f"database.user={db.user}",
            "database.password=unused",
            f"database.dbname={db.name}",
            "topic.prefix=pg",
            "plugin.name=pgoutput",
            f"slot.name={slot}",
            "slot.drop.on.stop=true",
            f"publication.name={slot}",
            "publication.autocreate.mode=filtered",
            f"table.include.list={table}",
            "snapshot.mode=initial",
            "skipped.operations=none",  # Debezium skips truncates unless told otherwise
            f"converter.schemas.enable={'true' if schemas else 'false'}",
            # BEGIN/END events (to pg.transaction, interleaved on stdout: is_transaction_event tells them
            # apart) and a transaction block in every envelope
            f"provide.transaction.metadata={'true' if transactions else 'false'}",
        ]) + "\n")
        self.schemas = schemas
        self.log = workdir / f"{slot}.log"
        self._stderr: IO[bytes] = self.log.open("wb")
        self.proc = subprocess.Popen(
            ["java", "-XX:TieredStopAtLevel=1", "-Xshare:auto", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
             "-cp", classpath(), "cdctunnel.DebeziumToLines", str(props)],
            stdout=subprocess.PIPE, stderr=self._stderr,
        )
        self.events: list[Event] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            key, _, value = line.rstrip(b"\n").partition(b"\t")
            self.events.append(Event(base64.b64decode(key), base64.b64decode(value)))

    def wait_for(self, count: int, timeout_s: float = 120.0) -> list[Event]:
        """The first ``count`` events, waiting for them; fails with the engine's log if they do not come."""
        deadline = time.monotonic() + timeout_s
        while len(self.events) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log.read_text(errors="replace")[-3000:]
                pytest.fail(f"Debezium engine gave {len(self.events)} of {count} events; its log:\n{tail}")
            time.sleep(0.05)
        return self.events[:count]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
        self._stderr.close()


def is_transaction_event(event: Event) -> bool:
    """Whether an event is a BEGIN or END of the transaction topic (``provide.transaction.metadata``)."""
    if not event.value:
        return False
    doc = json.loads(event.value)
    doc = doc.get("payload", doc) if "status" not in doc else doc
    return isinstance(doc, dict) and doc.get("status") in ("BEGIN", "END")


def publish(url: str, topic: str, events: Sequence[Event]) -> list[Any]:
    """Publish as Debezium Server's Pulsar sink does: the JSON key as the message key, the value as payload
    (empty for a tombstone). Returns the message ids."""
    from tests.backends.pulsar.helpers import produce

    return produce(url, topic, [e.value for e in events], [e.key.decode() or None for e in events])


def engines(workdir: Path, db: Database, table: str, *names: tuple[str, bool]) -> Iterator[DebeziumEngine]:
    for slot, schemas in names:
        yield DebeziumEngine(workdir, db, table, slot, schemas=schemas)
