"""Turning Pulsar messages into Arrow rows: raw bytes, JSON or Avro by schema, or Debezium change envelopes.

Schemas are given the way Pulsar's schema registry stores JSON and Avro schemas: an Avro record
definition (see :mod:`cdc.formats.rows`, which this shares with every backend, as it shares the Debezium
decoding of :mod:`cdc.formats.debezium`).

``valueFormat=avro`` decodes each payload as one Avro binary-encoded record (what Pulsar's AVRO schema
producers send: no header, no schema id) with fastavro; a payload that does not decode, or that holds
bytes past the record, is malformed.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from cdc.backends.pulsar.errors import SequenceRangeError
from cdc.errors import OptionError
from cdc.formats import debezium
from cdc.formats.rows import (
    TS,
    Malformed,
    RowField,
    decode_avro,
    decode_object,
    parse_avro_schema,
    parse_record_schema,
    row_values,
)
from cdc.model import ChangeSchema

__all__ = ["METADATA_FIELDS", "TS", "Decoder", "Malformed", "RowField", "parse_avro_schema", "parse_record_schema",
           "sequence_of"]

KEY, TOPIC, MESSAGE_ID, PUBLISH_TIME, EVENT_TIME, PROPERTIES = (
    "__key",
    "__topic",
    "__messageId",
    "__publishTime",
    "__eventTime",
    "__properties",
)
METADATA_FIELDS: tuple[pa.Field, ...] = (
    pa.field(KEY, pa.string()),
    pa.field(TOPIC, pa.string()),
    pa.field(MESSAGE_ID, pa.binary()),
    pa.field(PUBLISH_TIME, TS),
    pa.field(EVENT_TIME, TS),
    pa.field(PROPERTIES, pa.map_(pa.string(), pa.string())),
)


class Decoder:
    """Decodes one partition's messages into Arrow batches for one value format. A Debezium decoder keeps
    the channel's last delete, so it reads one channel's messages in order."""

    def __init__(
        self,
        value_format: str,
        value_schema: str | None,
        change_keys: str | None,
        events_schema: bool = False,
        envelope_avro: str | None = None,
        placeholder: str = debezium.DEFAULT_PLACEHOLDER,
    ) -> None:
        self.value_format = value_format
        self.fields: list[RowField] = parse_record_schema(value_schema) if value_schema else []
        self._avro: Any = None
        if value_format == "avro":
            if not value_schema:
                raise OptionError("option 'valueSchema' is required with valueFormat=avro", "valueSchema")
            self._avro = parse_avro_schema(value_schema)
        self.changes: debezium.ChangeDecoder | None = None
        self.change: ChangeSchema | None = None
        if value_format == "debezium":
            self.changes = debezium.ChangeDecoder(value_schema, change_keys, events_schema, envelope_avro,
                                                  placeholder)
            self.change, self.fields = self.changes.change, self.changes.fields

    def schema(self) -> pa.Schema:
        if self.change is not None:
            return self.change.arrow()
        if self.value_format in ("json", "avro"):
            return pa.schema([pa.field(f.name, f.arrow) for f in self.fields] + list(METADATA_FIELDS))
        return pa.schema([pa.field("value", pa.binary()), *METADATA_FIELDS])

    # -- per message: returns the row's values (excluding metadata) or raises Malformed
    def decode_value(self, payload: bytes) -> list[Any]:
        if self.value_format == "json":
            return row_values(self.fields, decode_object(payload), "")
        if self.value_format == "avro":
            record = decode_avro(payload, self._avro)
            return [record.get(f.name) for f in self.fields]
        return [payload]

    def decode_change(self, payload: bytes, publish_ms: int) -> debezium.Change | None:
        """The change of a Debezium envelope, also inside a Pulsar KeyValue (see
        :class:`cdc.formats.debezium.ChangeDecoder`); ``None`` for a tombstone."""
        assert self.changes is not None
        return self.changes.decode(debezium.value_of(payload), publish_ms)


# Sequence numbers of change records come from message ids: (ledger, entry, batch) packed into 63 bits.
# Ledger ids are cluster-wide BookKeeper counters that only grow, so they get the most room (4.29 billion);
# entries per ledger are capped by the broker's rollover (managedLedgerMaxEntriesPerLedger, 50,000 by
# default: 10x headroom); a batch holds at most 4,094 messages (producers batch 1,000 by default).
_LEDGER_BITS, _ENTRY_BITS, _BATCH_BITS = 32, 19, 12


def sequence_of(ledger: int, entry: int, batch: int) -> int:
    """A long that orders a partition's messages like their ids do (batch index -1: not in a batch)."""
    if not (0 <= ledger < 1 << _LEDGER_BITS and 0 <= entry < 1 << _ENTRY_BITS and -2 <= batch < (1 << _BATCH_BITS) - 2):
        raise SequenceRangeError(
            f"message id ({ledger}, {entry}, {batch}) does not fit the change model's 63-bit sequence "
            f"(ledger < 2^{_LEDGER_BITS}, entry < 2^{_ENTRY_BITS}, batch index < 2^{_BATCH_BITS} - 2); keep the "
            "broker's managedLedgerMaxEntriesPerLedger and the producers' batchingMaxMessages below those limits"
        )
    return (ledger << (_ENTRY_BITS + _BATCH_BITS)) | (entry << _BATCH_BITS) | (batch + 2)
