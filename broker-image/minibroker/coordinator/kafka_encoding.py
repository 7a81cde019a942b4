"""The primitives of Kafka's generated record schemas that the coordinators' log records use
(``__transaction_state``, a consumer group's records in ``__consumer_offsets``): int16-length
strings of non-flexible versions, and the flexible versions' unsigned varints and compact
strings (length plus one; 0 for null)."""

from __future__ import annotations

import struct

__all__ = ["compact_string", "string16", "uvarint"]

_I16 = struct.Struct(">h")


def string16(value: str) -> bytes:
    data = value.encode()
    return _I16.pack(len(data)) + data


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(value: str | None) -> bytes:
    if value is None:
        return uvarint(0)
    data = value.encode()
    return uvarint(len(data) + 1) + data
