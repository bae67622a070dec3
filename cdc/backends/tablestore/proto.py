"""Protobuf message classes built at import time from a compact spec: no generated code, no protoc.

:mod:`.tunnel_pb` (the Tunnel service) and :mod:`.table_pb` (the table API) declare their messages as
``{name: [(field, number, label, type), ...]}`` with the field numbers of the service's public ``.proto``
files, so bytes made here are read by the real service and by the official SDKs, and vice versa. Each spec
lives in a private :class:`DescriptorPool`, so it never clashes with another copy of the same messages
(an official SDK's generated modules) in the process.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

Field = tuple[str, int, str, str]
"""(name, number, label, type); label ``req`` | ``opt`` | ``rep``; type a scalar name or a message/enum name."""

_FD = descriptor_pb2.FieldDescriptorProto
SCALARS = {
    "string": _FD.TYPE_STRING,
    "bytes": _FD.TYPE_BYTES,
    "bool": _FD.TYPE_BOOL,
    "int32": _FD.TYPE_INT32,
    "int64": _FD.TYPE_INT64,
    "uint32": _FD.TYPE_UINT32,
    "uint64": _FD.TYPE_UINT64,
    "sint64": _FD.TYPE_SINT64,
    "fixed64": _FD.TYPE_FIXED64,
    "double": _FD.TYPE_DOUBLE,
    "float": _FD.TYPE_FLOAT,
}
_LABELS = {"req": _FD.LABEL_REQUIRED, "opt": _FD.LABEL_OPTIONAL, "rep": _FD.LABEL_REPEATED}


def build(
    file_name: str,
    package: str,
    enums: Mapping[str, Sequence[tuple[str, int]]],
    messages: Mapping[str, Sequence[Field]],
) -> dict[str, Any]:
    """The message classes of a proto2 file described by ``enums`` and ``messages``, by name."""
    f = descriptor_pb2.FileDescriptorProto(name=file_name, package=package, syntax="proto2")
    for name, values in enums.items():
        e = f.enum_type.add(name=name)
        for vname, number in values:
            e.value.add(name=vname, number=number)
    for name, fields in messages.items():
        m = f.message_type.add(name=name)
        for fname, number, label, ftype in fields:
            fd = m.field.add(name=fname, number=number, label=_LABELS[label])
            if ftype in SCALARS:
                fd.type = SCALARS[ftype]
            else:
                fd.type = _FD.TYPE_ENUM if ftype in enums else _FD.TYPE_MESSAGE
                fd.type_name = f".{package}.{ftype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(f)
    fd = pool.FindFileByName(file_name)
    return {name: message_factory.GetMessageClass(fd.message_types_by_name[name]) for name in messages}
