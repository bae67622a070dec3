"""Options arrive from Spark as strings with lower-cased keys; they are parsed once into frozen models.

Each backend declares its options as a pydantic model (``BackendOptions`` subclass) whose field aliases are
the user-facing option names (``service.url``, ``maxRecordsPerTrigger``). :func:`parse` matches keys
case-insensitively, and turns every problem into an :class:`~cdc.errors.OptionError` that names the option
and what it accepts. Secret fields are ``SecretStr``: they never show in reprs, logs or errors, whatever
the type of the value given (pydantic reports errors under the option name, so fields are found by alias).

Credentials should come from the environment where the backend reads them (Tablestore:
``ALIBABA_CLOUD_ACCESS_KEY_ID``, ``ALIBABA_CLOUD_ACCESS_KEY_SECRET``, ``ALIBABA_CLOUD_SECURITY_TOKEN``), not
from ``.option(...)``: a driver logging py4j at DEBUG logs every option value it sends to the JVM, and
:func:`cdc.register` warns when it does.
"""

from __future__ import annotations

import difflib
import enum
import json
import logging
import re
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveInt,
    SecretBytes,
    SecretStr,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo

from cdc.errors import OptionError

__all__ = [
    "BackendOptions",
    "Field",
    "OptionDoc",
    "SecretStr",
    "SourceOptions",
    "accepted_options",
    "describe_options",
    "describe_parameters",
    "options_markdown",
    "parse",
    "split_and_parse",
]

M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False, str_strip_whitespace=True)


class BackendOptions(_Model):
    """Base of every backend's options model."""

    scope: ClassVar[str] = "stream, batch"
    """Where the model's options apply, as the option tables show it: ``stream, batch`` (a source's reads),
    ``write`` (a sink's), ``batch``. A field narrows it with ``json_schema_extra={"scope": ...}``."""

    passthrough: ClassVar[Mapping[str, str]] = {}
    """Option-name prefixes (lower case, ending in ``.``) whose options are gathered, prefix removed, into a
    dict field: prefix -> that field's name. For settings handed to a client library as they are."""

    renamed: ClassVar[Mapping[str, str]] = {}
    """Deprecated option names (lower case) of this backend -> the source option that replaced them (its
    alias): the value is taken as that option's, with a logged deprecation warning."""

    aliases: ClassVar[Mapping[str, str]] = {}
    """Other names (lower case) this backend accepts for a source option, as its ecosystem spells it (Kafka's
    ``maxOffsetsPerTrigger`` for ``maxRecordsPerTrigger``) -> that option's alias: taken as it, no warning."""


def _passthrough(model: type[BaseModel], key: str) -> tuple[str, str] | None:
    """(dict field, key without the prefix) when ``key`` falls under one of the model's pass-through prefixes."""
    prefixes: Mapping[str, str] = getattr(model, "passthrough", {})
    for prefix, field in prefixes.items():
        if key.lower().startswith(prefix) and len(key) > len(prefix):
            return field, key[len(prefix):]
    return None


class SourceOptions(_Model):
    """Options of the ``cdc`` source itself, whatever the backend."""

    backend: str = Field(
        "local",
        alias="backend",
        description="Which backend reads the change log: required, as for writes. Without it a read still takes "
        "`local`, with a deprecation warning; the next release refuses it.",
    )
    starting_offsets: str = Field(
        "earliest",
        alias="startingOffsets",
        description="`earliest`, `latest`, `snapshot` (the table's rows at a consistent cut, then every change "
        "after it; backends that support it), or JSON `{channel: position, ...}` (a position may also be "
        "\"earliest\" or \"latest\"); channels not named start at earliest.",
    )
    ending_offsets: str = Field(
        "latest",
        alias="endingOffsets",
        description="Batch reads only: `latest` or JSON `{channel: position}`.",
        json_schema_extra={"scope": "batch"},
    )
    max_records_per_trigger: PositiveInt | None = Field(
        None, alias="maxRecordsPerTrigger", description="Most records a micro-batch takes (all channels)."
    )
    max_bytes_per_trigger: PositiveInt | None = Field(
        None,
        alias="maxBytesPerTrigger",
        description="Soft limit on the bytes a micro-batch takes (all channels): turned into a record count "
        "through the backend's average record size (local: the log's recent segment files; pulsar: the payloads "
        "the driver indexed; tablestore: the PlainBuffer records read while planning). With maxRecordsPerTrigger "
        "the smaller count wins.",
    )
    max_records_per_channel: PositiveInt | None = Field(
        None, alias="maxRecordsPerChannel", description="Most records a micro-batch takes from one channel."
    )
    min_partitions: PositiveInt | None = Field(
        None,
        alias="minPartitions",
        description="Fewest Spark tasks a batch is read in (Spark's Kafka option). A batch with fewer channel "
        "ranges shares this many tasks among them by size, cutting a range only where its backend finds a position "
        "without reading it: local (segment boundaries), pulsar (ledger entries; needs admin.url); tablestore and "
        "postgres refuse it. A key's changes may then be read by several tasks: order them by `_seq`.",
    )
    fail_on_data_loss: bool = Field(
        True,
        alias="failOnDataLoss",
        description="Fail the query when a needed position is no longer held; when false, log and skip ahead.",
    )
    min_records_per_trigger: PositiveInt | None = Field(
        None,
        alias="minRecordsPerTrigger",
        description="Fewest records a micro-batch waits for (all channels), until maxTriggerDelay has passed since "
        "the last batch (Kafka's minOffsetsPerTrigger). Trigger.AvailableNow ignores it.",
        json_schema_extra={"scope": "stream"},
    )
    max_trigger_delay: str = Field(
        "15m",
        alias="maxTriggerDelay",
        description="With minRecordsPerTrigger: the longest a batch waits for the minimum (`500ms`, `30s`, `15m`, "
        "`1h`, `1d`).",
        json_schema_extra={"scope": "stream"},
    )
    starting_timestamp: str | None = Field(
        None,
        alias="startingTimestamp",
        description="Start every channel at its first record committed at or after this time (epoch milliseconds "
        "or ISO-8601 with zone); not with startingOffsets. Backends local, tablestore (base-data channels, "
        "which carry no commit time, start at their beginning) and pulsar (publish time).",
    )
    ending_timestamp: str | None = Field(
        None,
        alias="endingTimestamp",
        description="Batch reads only: end every channel before its first record committed at or after this time; "
        "not with endingOffsets.",
        json_schema_extra={"scope": "batch"},
    )

    @field_validator("max_trigger_delay")
    @classmethod
    def _check_delay(cls, v: str) -> str:
        parse_duration_s(v)
        return v

    @field_validator("starting_timestamp", "ending_timestamp")
    @classmethod
    def _check_time(cls, v: str | None) -> str | None:
        if v is not None:
            parse_time(v)
        return v

    @property
    def max_trigger_delay_s(self) -> float:
        return parse_duration_s(self.max_trigger_delay)

    @property
    def starting_time(self) -> datetime | None:
        return None if self.starting_timestamp is None else parse_time(self.starting_timestamp)

    @property
    def ending_time(self) -> datetime | None:
        return None if self.ending_timestamp is None else parse_time(self.ending_timestamp)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|min|h|d)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration_s(value: str) -> float:
    """``500ms``, ``30s``, ``15m``, ``1h``, ``1d`` (Spark's time strings) in seconds."""
    m = _DURATION.match(value.strip().lower())
    if m is None:
        raise ValueError(f"expected a duration such as 500ms, 30s, 15m, 1h or 1d, got {value!r}")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def parse_time(value: str) -> datetime:
    """Epoch milliseconds or an ISO-8601 time with a zone, as an aware UTC datetime."""
    text = value.strip()
    if text.lstrip("-").isdigit():
        return datetime.fromtimestamp(int(text) / 1000, UTC)
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"expected epoch milliseconds or an ISO-8601 time with a zone, got {value!r}") from None
    if t.tzinfo is None:
        raise ValueError(f"time {value!r} has no zone; add one (e.g. 2026-01-01T00:00:00Z)")
    return t.astimezone(UTC)


def _check_exclusive(source: SourceOptions, given_as: Mapping[str, str] | None = None) -> None:
    """Options that say the same thing twice are refused, naming both (as the user named them: ``given_as``
    maps a source option to the deprecated name it came under)."""
    for time_field, offsets_field in (("starting_timestamp", "starting_offsets"), ("ending_timestamp", "ending_offsets")):
        if getattr(source, time_field) is not None and offsets_field in source.model_fields_set:
            a, b = _alias(SourceOptions, time_field), _alias(SourceOptions, offsets_field)
            a = (given_as or {}).get(a, a)
            raise OptionError(f"options {a!r} and {b!r} cannot be given together; accepted: one of them", a)
    low, high = source.min_records_per_trigger, source.max_records_per_trigger
    if low is not None and high is not None and low > high:
        raise OptionError(
            f"option 'minRecordsPerTrigger' ({low}) is above 'maxRecordsPerTrigger' ({high}); accepted: at most it",
            "minRecordsPerTrigger",
        )


def _unknown(key: str, what: str, accepted: list[str]) -> OptionError:
    close = difflib.get_close_matches(key.lower(), [a.lower() for a in accepted], n=1, cutoff=0.75)
    hint = ""
    if close:
        hint = " (did you mean " + repr(next(a for a in accepted if a.lower() == close[0])) + "?)"
    return OptionError(f"unknown option {key!r} for {what}{hint}; accepted options: {', '.join(sorted(accepted))}", key)


def accepted_options(model: type[BaseModel]) -> dict[str, str]:
    """Lower-cased option name -> field name."""
    out = {}
    for name, info in model.model_fields.items():
        alias = info.alias or name
        out[alias.lower()] = name
    return out


def _alias(model: type[BaseModel], field: str) -> str:
    info = model.model_fields.get(field)
    return (info.alias or field) if info else field


def _holds_secret(annotation: Any) -> bool:
    """``SecretStr`` anywhere in a field's type (``SecretStr | None``, ``dict[str, SecretStr]``...)."""
    if isinstance(annotation, type) and issubclass(annotation, (SecretStr, SecretBytes)):
        return True
    return any(_holds_secret(arg) for arg in get_args(annotation))


def _field_of(model: type[BaseModel], key: str) -> FieldInfo | None:
    """The field an error location names: models are validated by alias, so pydantic reports the alias."""
    by_alias = {info.alias or name: info for name, info in model.model_fields.items()}
    return by_alias.get(key) or model.model_fields.get(key)


def _describe(model: type[BaseModel], err: Mapping[str, Any]) -> str:
    if not err.get("loc"):  # a rule over several options (a model validator): its message names them
        return str(err.get("msg", "invalid options")).removeprefix("Value error, ")
    key = str(err["loc"][0])
    info = _field_of(model, key)
    alias = _alias(model, key)
    # An option that is not a field cannot be told apart from a mistyped secret: keep its value out too.
    secret = info is None or _holds_secret(info.annotation)
    msg = str(err.get("msg", "invalid value"))
    if err.get("type") == "missing":
        return f"option {alias!r} is required"
    if err.get("type", "").startswith("bool"):
        msg += "; accepted values: true, false"
    got = "" if secret else f" (got {err.get('input')!r})"
    return f"option {alias!r}: {msg}{got}"


def parse(model: type[M], raw: Mapping[str, Any], *, what: str) -> M:
    """Parse ``raw`` (case-insensitive keys) into ``model``; raise OptionError naming the option."""
    names = accepted_options(model)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        field = names.get(key.lower())
        if field is None and (under := _passthrough(model, key)) is not None:
            values.setdefault(_alias(model, under[0]), {})[under[1]] = value
            continue
        if field is None:
            raise _unknown(key, what, [_alias(model, f) for f in names.values()])
        values[_alias(model, field)] = value
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        first = errors[0]
        option = _alias(model, str(first["loc"][0])) if first.get("loc") else None
        text = "; ".join(_describe(model, e) for e in errors)
        raise OptionError(f"invalid options for {what}: {text}", option) from None


def split_and_parse(
    raw: Mapping[str, Any], backend_model: type[M], backend_name: str
) -> tuple[SourceOptions, M]:
    """Split raw options into the source's own and the backend's, and parse both.

    An option that neither model knows is reported with both sets of accepted names.
    """
    core_names = accepted_options(SourceOptions)
    backend_names = accepted_options(backend_model)
    core_raw: dict[str, Any] = {}
    backend_raw: dict[str, Any] = {}
    renamed: Mapping[str, str] = getattr(backend_model, "renamed", {})
    aliases: Mapping[str, str] = getattr(backend_model, "aliases", {})
    given_as: dict[str, str] = {}
    for key, value in raw.items():
        k = key.lower()
        if k in renamed or k in aliases:
            new = renamed.get(k) or aliases[k]
            if any(other.lower() == new.lower() for other in raw):
                what = "a deprecated name" if k in renamed else "another name"
                raise OptionError(
                    f"options {key!r} and {new!r} cannot be given together ({key!r} is {what} of "
                    f"{new!r}); accepted: one of them",
                    key,
                )
            if k in renamed:
                log.warning("option %r of backend %r is deprecated; use %r", key, backend_name, new)
            core_raw[new] = value
            given_as[new] = key
        elif k in core_names:
            core_raw[key] = value
        elif k in backend_names or _passthrough(backend_model, key) is not None:
            backend_raw[key] = value
        else:
            accepted = [_alias(SourceOptions, f) for f in core_names.values()] + [
                _alias(backend_model, f) for f in backend_names.values()
            ]
            raise _unknown(key, f"backend {backend_name!r}", accepted)
    source = parse(SourceOptions, core_raw, what="the cdc source")
    _check_exclusive(source, given_as)
    return source, parse(backend_model, backend_raw, what=f"backend {backend_name!r}")



# ---------------------------------------------------------------------------------------------- describing
# `cdc options` and the documentation's option tables are both made here, from the models, so they cannot
# drift from what `parse` accepts.


@dataclass(frozen=True)
class OptionDoc:
    """One option as the tables show it (``cdc options``, the documentation site)."""

    name: str
    type: str
    default: str
    """The default as a user writes it (``true``, ``100000``, ``earliest``); empty when there is none."""
    required: bool
    scope: str
    """``stream, batch``, ``stream``, ``batch`` or ``write``."""
    description: str
    secret: bool


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _type_name(info: FieldInfo) -> str:
    annotation = _unwrap_optional(info.annotation)
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{v}`" for v in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, (SecretStr, SecretBytes)):
        return "string (secret)"
    if get_origin(annotation) is dict or annotation is dict:
        return "prefix"
    names = {bool: "boolean", int: "integer", float: "number", str: "string"}
    base = names.get(annotation, getattr(annotation, "__name__", str(annotation)))
    positive = any(getattr(m, "gt", None) == 0 for m in info.metadata)
    return f"{base} > 0" if positive else base


def _default_text(info: FieldInfo) -> str:
    if info.is_required():
        return ""
    value = info.get_default(call_default_factory=True)
    if value is None or value == {}:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def describe_options(model: type[BaseModel]) -> list[OptionDoc]:
    """Every option of ``model`` in declaration order, as :class:`OptionDoc` rows."""
    default_scope = getattr(model, "scope", "stream, batch")
    rows = []
    for name, info in model.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        rows.append(
            OptionDoc(
                name=info.alias or name,
                type=_type_name(info),
                default=_default_text(info),
                required=info.is_required(),
                scope=str(extra.get("scope", default_scope)),
                description=" ".join((info.description or "").split()),
                secret=_holds_secret(info.annotation),
            )
        )
    return rows


def describe_parameters(cls: type, scope: str = "write") -> list[OptionDoc]:
    """Every keyword parameter of ``cls`` (its ``__init__``) as :class:`OptionDoc` rows: the type and default
    from the signature, the meaning from the class docstring's numpy-style ``Parameters`` section (``name :
    text``, continued on more indented lines). For options given to a Python class rather than as Spark options
    (a sink's). A parameter the docstring does not describe gets an empty description."""
    import inspect

    doc = inspect.getdoc(cls) or ""
    described: dict[str, list[str]] = {}
    current: list[str] | None = None
    section = doc.split("Parameters\n----------\n", 1)[1] if "Parameters\n----------\n" in doc else ""
    for line in section.splitlines():
        if line and not line[0].isspace():
            name, sep, text = line.partition(" : ")
            if not sep:
                break  # the section ended
            current = described.setdefault(name.strip(), [])
            current.append(text)
        elif current is not None:
            current.append(line.strip())
    rows = []
    for name, param in list(inspect.signature(cls.__init__).parameters.items())[1:]:  # type: ignore[misc]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        required = param.default is param.empty
        annotation = param.annotation if isinstance(param.annotation, str) else getattr(
            param.annotation, "__name__", str(param.annotation))
        text = " ".join(" ".join(described.get(name, [])).split())
        text = re.sub(r":(?:func|meth|class|mod|attr):`~?([^`]+)`", r"`\1`", text).replace("``", "`")
        rows.append(OptionDoc(name=name, type=f"`{annotation}`", default="" if required else repr(param.default),
                              required=required, scope=scope, description=text, secret=False))
    return rows


def options_markdown(rows: Iterable[OptionDoc]) -> str:
    """A Markdown table of options: option, type, default, required, where it applies, meaning."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    lines = ["| option | type | default | required | applies to | meaning |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        default = f"`{cell(r.default)}`" if r.default else ""
        lines.append(
            f"| `{cell(r.name)}` | {cell(r.type)} | {default} | {'yes' if r.required else 'no'} | {r.scope} | "
            f"{cell(r.description)} |"
        )
    return "\n".join(lines)


def per_channel(
    spec: str,
    option: str,
    accepted: str,
    channels: Iterable[str],
    translate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The JSON object ``{"<channel>": <value>}`` of ``startingOffsets`` or ``endingOffsets`` (``option``);
    anything else, or a channel not among ``channels``, raises an :class:`OptionError` that names the option
    and what it accepts. ``translate`` reads a backend's own form of the object first
    (:meth:`~cdc.backend.Backend.channel_positions`)."""
    try:
        given = json.loads(spec)
    except json.JSONDecodeError:
        given = None
    if not isinstance(given, dict):
        raise OptionError(f"option {option!r}: accepted values are {accepted}; got {spec!r}", option)
    if translate is not None:
        try:
            given = translate(given)
        except (ValueError, TypeError) as exc:  # PositionError is a ValueError
            raise OptionError(f"option {option!r}: {exc}; accepted values are {accepted}", option) from None
    known = set(channels)
    unknown = sorted(set(given) - known)
    if unknown:
        raise OptionError(f"option {option!r}: unknown channels {unknown}; channels: {sorted(known)}", option)
    out: dict[str, Any] = given
    return out
