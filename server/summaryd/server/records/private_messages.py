"""Private protobuf messages the daemon builds for reading many events in one C call.

A message of only repeated fields, parsed from many records joined (or from a batch re-wrapped), hands every
record's field to Python as one list: what a loop over each record's fields would cost microseconds a record
for, protobuf's C parser does at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

Kind = descriptor_pb2.FieldDescriptorProto
Field = tuple[str, int, "Kind.Type.ValueType", str]
"""a repeated field: name, number, kind, and the full name of its message type (for TYPE_MESSAGE; else "")"""


def repeated_messages(
    file_name: str, package: str, shapes: Mapping[str, Sequence[Field]], depends_on: Sequence[str] = ()
) -> tuple[type[Message], ...]:
    """The classes of messages `shapes` (name → its repeated fields), in order, built once into the default
    descriptor pool under `file_name` (a second call finds them there)."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(file_name)
    except KeyError:
        file = descriptor_pb2.FileDescriptorProto(
            name=file_name, package=package, syntax="proto3", dependency=list(depends_on)
        )
        for message, fields in shapes.items():
            added = file.message_type.add(name=message)
            for name, number, kind, type_name in fields:
                added.field.add(
                    name=name, number=number, label=Kind.LABEL_REPEATED, type=kind, type_name=type_name or None
                )
        pool.Add(file)
    return tuple(message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{package}.{m}")) for m in shapes)
