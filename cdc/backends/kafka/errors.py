"""Errors of ``backend=kafka`` (each under :class:`cdc.errors.CdcError`)."""

from __future__ import annotations

from cdc.errors import TransientError


class FetchTimeoutError(TransientError):
    """An executor's read got nothing from the broker for ``kafkaConsumer.pollTimeoutMs`` short of its
    planned end; the message names the partition and offsets."""
