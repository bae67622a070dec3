"""Options of ``backend=tablestore``.

Credentials come from ``access.key.id`` / ``access.key.secret`` (and ``sts.token``), else from the standard
environment variables ``ALIBABA_CLOUD_ACCESS_KEY_ID`` / ``ALIBABA_CLOUD_ACCESS_KEY_SECRET`` /
``ALIBABA_CLOUD_SECURITY_TOKEN``. They are ``SecretStr``: never in reprs, logs, errors or offsets.

``catalog`` is the EMR connector's JSON schema of the columns to read, e.g.
``{"columns": {"id": {"type": "long"}, "name": {"type": "string"}}}``; types: ``string``, ``long``,
``double``, ``boolean``, ``binary``. The primary-key columns come from DescribeTable (a catalog entry for
a key column must agree with it); the other catalog columns are the value columns, in catalog order.
"""

from __future__ import annotations

import json
import os
from typing import Literal

import pyarrow as pa
from pydantic import PositiveInt, field_validator, model_validator

from cdc.errors import OptionError
from cdc.options import BackendOptions, Field, SecretStr

ENV_ACCESS_KEY_ID = "ALIBABA_CLOUD_ACCESS_KEY_ID"
ENV_ACCESS_KEY_SECRET = "ALIBABA_CLOUD_ACCESS_KEY_SECRET"
ENV_SECURITY_TOKEN = "ALIBABA_CLOUD_SECURITY_TOKEN"

CATALOG_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "long": pa.int64(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
    "binary": pa.binary(),
}


def parse_catalog(text: str) -> list[tuple[str, pa.DataType]]:
    """``[(column, arrow type), ...]`` from the EMR-style catalog JSON; raises OptionError naming the column."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option 'catalog': not valid JSON ({exc})", "catalog") from None
    columns = data.get("columns") if isinstance(data, dict) else None
    if not isinstance(columns, dict):
        raise OptionError(
            'option \'catalog\': expected {"columns": {"<name>": {"type": "<type>"}, ...}}', "catalog"
        )
    out = []
    for name, spec in columns.items():
        kind = spec.get("type") if isinstance(spec, dict) else spec
        arrow = CATALOG_TYPES.get(str(kind).lower()) if kind is not None else None
        if arrow is None:
            raise OptionError(
                f"option 'catalog': column {name!r} has type {kind!r}; accepted types: {', '.join(CATALOG_TYPES)}",
                "catalog",
            )
        out.append((str(name), arrow))
    return out


class TablestoreConnection(BackendOptions):
    """What every Tablestore reader needs to reach a table: the instance, credentials, the HTTP settings, and
    the EMR-style ``catalog`` of value columns (its description is the reader's own)."""

    endpoint: str = Field(
        alias="endpoint", description="Instance endpoint, e.g. https://inst.cn-hangzhou.ots.aliyuncs.com."
    )
    instance_name: str = Field(alias="instance.name", description="Tablestore instance name.")
    access_key_id: SecretStr | None = Field(
        None, alias="access.key.id", description=f"Else ${ENV_ACCESS_KEY_ID}."
    )
    access_key_secret: SecretStr | None = Field(
        None, alias="access.key.secret", description=f"Else ${ENV_ACCESS_KEY_SECRET}."
    )
    sts_token: SecretStr | None = Field(
        None, alias="sts.token", description=f"Else ${ENV_SECURITY_TOKEN} (optional)."
    )
    catalog: str | None = Field(None, alias="catalog", description="EMR-style JSON schema of the value columns.")
    socket_timeout: float = Field(30.0, alias="socket.timeoutSeconds", description="HTTP socket timeout.")
    max_attempts: PositiveInt = Field(
        6,
        alias="retry.maxAttempts",
        description="Tries of a call that fails transiently (server unavailable).",
    )

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @field_validator("catalog")
    @classmethod
    def _check_catalog(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_catalog(v)
            except OptionError as exc:
                raise ValueError(str(exc).removeprefix("option 'catalog': ")) from None
        return v

    def credentials(self) -> tuple[str, str, str | None]:
        """``(access key id, secret, sts token or None)``: options first, then the environment."""
        return resolve_credentials(self.access_key_id, self.access_key_secret, self.sts_token)

    def value_columns(self) -> list[tuple[str, pa.DataType]]:
        return parse_catalog(self.catalog) if self.catalog else []


class TablestoreOptions(TablestoreConnection):
    """Options of ``backend=tablestore``."""

    table_name: str = Field(alias="table.name", description="The table whose changes are read.")
    tunnel_name: str | None = Field(None, alias="tunnel.name", description="Tunnel name (or give tunnel.id).")
    tunnel_id: str | None = Field(None, alias="tunnel.id", description="Tunnel id (or give tunnel.name).")
    tunnel_type: Literal["BaseData", "Stream", "BaseAndStream"] = Field(
        "BaseAndStream",
        alias="tunnel.type",
        description="Type of a tunnel created by createTunnelIfMissing: BaseData, Stream or BaseAndStream.",
    )
    create_tunnel: bool = Field(
        False,
        alias="createTunnelIfMissing",
        description="Create the tunnel (named by tunnel.name) if it does not exist.",
    )
    catalog: str | None = Field(
        None, alias="catalog", description='EMR-style JSON schema of the value columns: {"columns": {...}}.'
    )
    ots_columns: bool = Field(
        True,
        alias="otsColumns",
        description="Add the EMR connector's columns __ots_record_type__, __ots_record_timestamp__ and "
        "__ots_column_type_<col>.",
    )
    on_malformed: Literal["fail", "quarantine"] = Field(
        "fail",
        alias="onMalformed",
        description="A record that cannot be decoded or does not fit the catalog: fail the query (naming the "
        "channel and record), or quarantine it (a JSON file under quarantine.path) and go on.",
    )
    quarantine_path: str | None = Field(
        None,
        alias="quarantine.path",
        description="Directory for quarantined records (onMalformed=quarantine).",
    )
    client_timeout: PositiveInt = Field(
        300,
        alias="tunnel.client.timeoutSeconds",
        description="Tunnel client expiry after its last call. A query restarted after a crash cannot move "
        "the checkpoints of channels the crashed run's client still holds (children of split/merged channels "
        "then wait) until that client expired, unless the restart can take them over: a client of a process "
        "on the same host that is gone, or of another process with the same tunnel.client.tag.",
    )
    client_tag: str | None = Field(
        None,
        alias="tunnel.client.tag",
        pattern=r"^[A-Za-z0-9._-]{1,64}$",
        description="A name for this query (letters, digits, '.', '_', '-'). A restarted run then shuts down "
        "the tunnel clients an earlier run of the same tag left behind, even on another host, instead of "
        "waiting tunnel.client.timeoutSeconds for them to expire. Never give two queries running at the "
        "same time the same tag.",
    )
    @model_validator(mode="after")
    def _check_tunnel(self) -> TablestoreOptions:
        if not self.tunnel_name and not self.tunnel_id:
            raise ValueError("one of the options 'tunnel.name' or 'tunnel.id' is required")
        if self.on_malformed == "quarantine" and not self.quarantine_path:
            raise ValueError("option 'onMalformed=quarantine' needs 'quarantine.path'")
        if self.create_tunnel and not self.tunnel_name:
            raise ValueError("option 'createTunnelIfMissing' needs 'tunnel.name'")
        return self



def resolve_credentials(
    key_id_option: SecretStr | None, secret_option: SecretStr | None, token_option: SecretStr | None
) -> tuple[str, str, str | None]:
    """``(access key id, secret, sts token or None)``: the options first, then the environment."""
    key_id = key_id_option.get_secret_value() if key_id_option else os.environ.get(ENV_ACCESS_KEY_ID)
    secret = secret_option.get_secret_value() if secret_option else os.environ.get(ENV_ACCESS_KEY_SECRET)
    token = token_option.get_secret_value() if token_option else os.environ.get(ENV_SECURITY_TOKEN)
    if not key_id or not secret:
        raise OptionError(
            "Tablestore credentials are missing: set the options 'access.key.id' and 'access.key.secret' or "
            f"the environment variables {ENV_ACCESS_KEY_ID} and {ENV_ACCESS_KEY_SECRET}",
            "access.key.id",
        )
    return key_id, secret, token or None
