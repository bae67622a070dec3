from __future__ import annotations

from cdc.options import BackendOptions, Field


class LocalOptions(BackendOptions):
    """Options of ``backend=local``."""

    path: str = Field(alias="path", description="Directory of the local change log.")
