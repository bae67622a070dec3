"""Debezium transaction metadata on Pulsar (``debezium.transactionTopic``): the transaction topic read by an
id index on the driver. The design (complete transactions, the frontier, one cut per round over every
partition, the soft budget, bounds that move the end back) is the backends' shared one:
:mod:`cdc.formats.transactions`. The data topics' id indexes (:class:`~cdc.backends.pulsar.index.TopicIndex`)
mark each message with its transaction key, so a partition of the index is the cut's
:class:`~cdc.formats.transactions.IndexedMessages`.

The cost: the driver reads every message of the data topics (the id index, as with a record budget) and
parses its transaction block; see ``benchmarks/debezium_transactions.py``.
"""

from __future__ import annotations

from typing import Any

from cdc.backends.pulsar.index import TopicIndex
from cdc.formats import transactions as shared
from cdc.formats.transactions import (
    INF,
    IndexedMessages,
    Messages,
    OrderList,
    transaction_cut,
    transaction_end,
    transaction_of,
)

__all__ = ["INF", "IndexedMessages", "Messages", "OrderList", "TransactionLog", "transaction_cut", "transaction_end",
           "transaction_of"]


class TransactionLog(shared.TransactionLog):
    """The shared transaction log, fed by an id index of the transaction topic (one partition)."""

    def __init__(self, client: Any, topic: str, *, receiver_queue_size: int, catch_up_ms: int) -> None:
        super().__init__()
        self.topic = topic
        self.index = TopicIndex(client, topic, receiver_queue_size=receiver_queue_size, catch_up_ms=catch_up_ms,
                                mark=self.read_end)

    def catch_up(self, partitions: list[int]) -> None:
        """Read the END events published so far (before the data topics are caught up: see the module)."""
        self.index.partitions = partitions
        self.index.catch_up()
        for p in partitions:
            self.index.trim(p, self.index.ids(p).last)

    def close(self) -> None:
        self.index.close()
