from __future__ import annotations

from pydantic import PositiveInt

from cdc.options import BackendOptions, Field


class LocalOptions(BackendOptions):
    """Options of ``backend=local``."""

    path: str = Field(alias="path", description="Directory of the local change log.")
    snapshot_chunk_rows: PositiveInt = Field(
        100_000, alias="snapshotChunkRows", description="Rows per snapshot chunk (`startingOffsets=snapshot`)."
    )
