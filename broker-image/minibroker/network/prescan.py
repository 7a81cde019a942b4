"""Walks a message's layout before kio's native reader sees it.

kio's reader reserves memory for an array before reading its elements: a compact array
length of 2**32 makes it ask for 32 GiB and the allocation failure aborts the process.
One garbled frame must not kill the broker, so every message is first walked here, in
Python, against the same schema: each length is checked against the bytes that are
actually left, and a frame that claims more fails with ``Underflow`` before any
allocation. The walk builds no objects, so it costs a few microseconds per message.

The same walk bounds a request's work (``max.request.elements``): it counts the array
elements and tagged fields as it meets their counts, and stops with ``TooManyElements`` at
the count that goes past the bound, before it walks those elements and before kio or a
handler sees them. The broker serves requests on the event loop that also sends its
heartbeats, so no request may hold it for long, whatever its size on the wire.

It also refuses a null array where the schema has no null (``NullField``), which kio's
reader would hand to the handler as None.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import Field, fields
from functools import cache
from types import UnionType
from typing import Union, get_origin

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

__all__ = ["NullField", "TooManyElements", "Underflow", "check_layout"]


class _Budget:
    """Array elements and tagged fields the rest of the walk may meet."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int) -> None:
        self.left = self.limit = limit

    def spend(self, count: int, what: str, pos: int) -> None:
        self.left -= count
        if self.left < 0:
            raise TooManyElements(f"{count} {what} at byte {pos} take the message past "
                                  f"{self.limit} array elements and tagged fields")


_UNBOUNDED = sys.maxsize

# (frame, position, budget) -> position after the value
Skip = Callable[[memoryview, int, _Budget], int]

_FIXED_SIZES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4, "int64": 8, "uint64": 8, "float64": 8,
    "timedelta_i64": 8, "datetime_i64": 8, "uuid": 16,
}
_VARIABLE_TYPES = ("string", "bytes", "records")


class Underflow(ValueError):
    """The message claims more bytes than the frame holds, or a tagged field's value does
    not fill the size it declares."""


class NullField(ValueError):
    """A null length where the schema allows none. kio's reader turns a null array into
    None whatever the schema says, and a handler iterating it would fail; Kafka's generated
    readers refuse it ("non-nullable field topics was serialized as null")."""


class TooManyElements(Exception):
    """The message holds more array elements and tagged fields than the walk allows.

    Not a ValueError: the message may be well formed, and the broker says which bound it
    broke rather than calling it malformed."""


def check_layout(entity_type: type, buf: bytes | memoryview, offset: int,
                 max_elements: int | None = None) -> int:
    """Walk one ``entity_type`` in ``buf`` from ``offset``; return where it ends. With
    ``max_elements``, raise ``TooManyElements`` at the array or tagged-field count that
    takes the message past that many."""
    budget = _Budget(_UNBOUNDED if max_elements is None else max_elements)
    return _entity_skip(entity_type)(memoryview(buf), offset, budget)


def _advance(buf: memoryview, pos: int, size: int) -> int:
    end = pos + size
    if size < 0 or end > len(buf):
        raise Underflow(f"{size} bytes claimed at byte {pos}, only {len(buf) - pos} left")
    return end


def _uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise Underflow(f"varint runs past the end of the frame at byte {pos}")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise Underflow(f"varint longer than 10 bytes before byte {pos}")


def _int(buf: memoryview, pos: int, size: int) -> tuple[int, int]:
    end = _advance(buf, pos, size)
    return int.from_bytes(buf[pos:end], "big", signed=True), end


def _length(buf: memoryview, pos: int, flexible: bool, legacy_size: int) -> tuple[int, int]:
    """A length prefix; -1 means null. Compact lengths are stored plus one."""
    if flexible:
        value, pos = _uvarint(buf, pos)
        return value - 1, pos
    return _int(buf, pos, legacy_size)


def _primitive_skip(kafka_type: str, flexible: bool, legacy_string: bool) -> Skip:
    fixed = _FIXED_SIZES.get(kafka_type)
    if fixed is not None:
        return lambda buf, pos, _budget: _advance(buf, pos, fixed)
    if kafka_type not in _VARIABLE_TYPES:
        raise TypeError(f"no layout rule for Kafka type {kafka_type!r}")
    compact = flexible and not legacy_string
    legacy_size = 2 if kafka_type == "string" else 4

    def skip_variable(buf: memoryview, pos: int, _budget: _Budget) -> int:
        size, pos = _length(buf, pos, compact, legacy_size)
        return pos if size == -1 else _advance(buf, pos, size)

    return skip_variable


def _array_skip(item: Skip, flexible: bool, nullable: bool, name: str) -> Skip:
    def skip_array(buf: memoryview, pos: int, budget: _Budget) -> int:
        count, pos = _length(buf, pos, flexible, 4)
        if count == -1 and not nullable:
            raise NullField(f"non-nullable field {name} was serialized as null")
        if count < -1 or count > len(buf) - pos:
            raise Underflow(f"array of {count} items claimed at byte {pos}")
        if count > 0:
            budget.spend(count, "array elements", pos)
        for _ in range(count):
            pos = item(buf, pos, budget)
        return pos

    return skip_array


def _nullable_skip(entity: Skip) -> Skip:
    def skip_nullable(buf: memoryview, pos: int, budget: _Budget) -> int:
        marker, pos = _int(buf, pos, 1)
        return pos if marker == -1 else entity(buf, pos, budget)

    return skip_nullable


def _nullable_array(field: Field) -> bool:
    """Whether the schema lets the array itself be null: ``tuple[...] | None``."""
    return get_origin(field.type) in (UnionType, Union)


def _field_skip(field: Field, flexible: bool, is_header: bool, is_tag: bool) -> Skip:
    # RequestHeader.client_id keeps the legacy string form even in flexible headers.
    legacy_string = is_header and field.name == "client_id"
    match classify_field(field):
        case PrimitiveField():
            return _primitive_skip(get_schema_field_type(field), flexible, legacy_string)
        case PrimitiveTupleField():
            item = _primitive_skip(get_schema_field_type(field), flexible, False)
            return _array_skip(item, flexible, _nullable_array(field), field.name)
        case EntityField(nested):
            skip = _entity_skip(nested)
            return _nullable_skip(skip) if is_optional(field) and not is_tag else skip
        case EntityTupleField(nested):
            return _array_skip(_entity_skip(nested), flexible, _nullable_array(field),
                               field.name)
    raise TypeError(f"unclassifiable field {field.name}")


@cache
def _entity_skip(entity_type: type) -> Skip:
    flexible: bool = entity_type.__flexible__
    is_header = entity_type.__name__ == "RequestHeader"
    steps: list[Skip] = []
    tagged: dict[int, Skip] = {}
    for field in fields(entity_type):
        tag = get_field_tag(field)
        skip = _field_skip(field, flexible, is_header, tag is not None)
        if tag is None:
            steps.append(skip)
        else:
            tagged[tag] = skip

    def skip_entity(buf: memoryview, pos: int, budget: _Budget) -> int:
        for step in steps:
            pos = step(buf, pos, budget)
        if flexible:
            pos = _skip_tagged_fields(buf, pos, tagged, budget)
        return pos

    return skip_entity


def _skip_tagged_fields(buf: memoryview, pos: int, known: dict[int, Skip],
                        budget: _Budget) -> int:
    count, pos = _uvarint(buf, pos)
    if count > len(buf) - pos:  # each takes two bytes at least
        raise Underflow(f"{count} tagged fields claimed at byte {pos}")
    if count > 0:
        budget.spend(count, "tagged fields", pos)
    for _ in range(count):
        tag, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        end = _advance(buf, pos, size)
        skip = known.get(tag)
        # kio reads a known tag's value and goes on from where the value ends, whatever size
        # the tag declared (as Kafka's generated readers do), so the value must fill exactly
        # the bytes it declares: else kio would read on from a byte this walk never checked.
        if skip is not None and skip(buf[:end], pos, budget) != end:
            raise Underflow(f"tagged field {tag} does not fill the {size} bytes it declares")
        pos = end
    return pos
