"""Corruptions of an encoded request at its layout map: where the encoder put each length,
count, tag, boolean, nullable-struct marker, string and int64 duration (``Slot``), and
what a hostile or broken peer would write there instead, beyond the field's type.

A corruption targets one place of the frame, chosen from its map, and writes what the
field's type does not allow or what does not match the rest of the frame: a length or count
that lies (null where the schema has none, negative, past the frame, off by a few), a
varint that never ends, is 35 bits or takes more bytes than it needs, a tagged-field
section that claims more fields, holds an unknown or repeated tag or mis-sizes one, a
boolean of 7, a marker of 2, invalid UTF-8, an int64 duration kio cannot hold. Or it
changes the frame as a whole: a cut at a field's start, trailing bytes, an unsupported
version or API key, bit flips, a size prefix that lies. Each returns what it did, in words,
so a failure names its frame's fault.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from minibroker.network.codec import SUPPORTED_API_VERSIONS, ApiKey

__all__ = ["MAX_I64_DURATION_MS", "Kind", "Slot", "mutate", "read_uvarint", "uvarint"]

_I16, _I32, _I64 = (struct.Struct(f">{c}") for c in "hiq")
# kio's reader turns an int64 duration into microseconds in an int64 and refuses one that
# does not fit (Kafka takes any int64): valid frames keep inside this, corruptions go past.
MAX_I64_DURATION_MS = (2**63 - 1) // 1000


class Kind(Enum):
    """What lies at a place of the frame that a corruption may target."""

    LEN16 = "int16 string length"
    LEN32 = "int32 length or count"
    ULEN = "compact length or count"
    TAG_COUNT = "tagged field count"
    TAG = "tag"
    TAG_SIZE = "tagged field size"
    BOOL = "boolean"
    MARKER = "nullable struct marker"
    TEXT = "string bytes"
    DURATION64 = "int64 duration"


@dataclass(frozen=True, slots=True)
class Slot:
    kind: Kind
    start: int
    end: int
    nullable: bool = False


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(0x80 | (value & 0x7F))
        value >>= 7
    out.append(value)
    return bytes(out)


Mutation = Callable[[bytearray, Slot, random.Random], str]


def _replace(buf: bytearray, slot: Slot, data: bytes) -> None:
    buf[slot.start:slot.end] = data


def _lie_length(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    if slot.kind is Kind.ULEN:
        stored, _ = read_uvarint(buf, slot.start)
        value = rng.choice((0, stored + rng.randint(1, 8), max(stored - 1, 1), 2**31, 2**32 + 5,
                            len(buf) - slot.end + 2, 2**35 - 1))
        _replace(buf, slot, uvarint(value))
        what = "null" if value == 0 else f"{value - 1}"
    else:
        packer = _I16 if slot.kind is Kind.LEN16 else _I32
        (stored,) = packer.unpack_from(buf, slot.start)
        high = (1 << (packer.size * 8 - 1)) - 1
        value = rng.choice((-1, -2, -high - 1, high, stored + rng.randint(1, 8),
                            max(stored, 0) - 1, min(len(buf) - slot.end + 1, high)))
        _replace(buf, slot, packer.pack(value))
        what = "null" if value == -1 else f"{value}"
    nullable = " (nullable)" if slot.nullable else ""
    return f"{slot.kind.value}{nullable} at byte {slot.start} says {what}"


def _overlong_varint(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    stored, _ = read_uvarint(buf, slot.start)
    r = rng.random()
    if r < 0.4:
        _replace(buf, slot, b"\xff" * 12)
        return f"{slot.kind.value} at byte {slot.start}: a varint that never ends"
    if r < 0.7:
        # the same value in more bytes than it needs (Kafka's readers take it)
        encoded = bytearray(uvarint(stored))
        encoded[-1] |= 0x80
        _replace(buf, slot, bytes(encoded) + b"\x80" * rng.randint(0, 2) + b"\x00")
        return f"{slot.kind.value} at byte {slot.start}: a non-minimal varint"
    _replace(buf, slot, b"\xff\xff\xff\xff\x7f")
    return f"{slot.kind.value} at byte {slot.start}: a 35-bit varint"


def _bad_tags(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    stored, _ = read_uvarint(buf, slot.start)
    r = rng.random()
    if r < 0.3:
        _replace(buf, slot, uvarint(stored + rng.choice((1, 2, 1000, 2**28))))
        return f"tagged field count at byte {slot.start} claims more than are sent"
    if r < 0.7:
        tag = rng.choice((rng.randint(0, 3), 99, 2**31 - 1))
        value = rng.randbytes(rng.randint(0, 6))
        _replace(buf, slot, uvarint(stored + 1) + uvarint(tag) + uvarint(len(value)) + value)
        return f"tagged field {tag} (of {len(value)} bytes) inserted at byte {slot.start}"
    size = rng.choice((0, 50, 2**31))
    _replace(buf, slot, uvarint(stored + 1) + uvarint(0) + uvarint(size))
    return f"tagged field 0 claiming {size} bytes inserted at byte {slot.start}"


def _bad_tag(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    tag = rng.choice((0, 1, 2, 7, 99, 2**31 - 1))
    _replace(buf, slot, uvarint(tag))
    return f"tag at byte {slot.start} rewritten to {tag}"


def _bad_tag_size(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    stored, _ = read_uvarint(buf, slot.start)
    size = rng.choice((0, max(stored - 1, 0), stored + 1, stored + 100, 2**31 - 1))
    _replace(buf, slot, uvarint(size))
    return f"tagged field size at byte {slot.start} says {size}, not {stored}"


def _bad_bool(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    value = rng.randint(2, 255)
    buf[slot.start] = value
    return f"boolean at byte {slot.start} is {value}"


def _bad_marker(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    value = rng.choice((0, 2, 127, -2))
    buf[slot.start] = value & 0xFF
    return f"nullable struct marker at byte {slot.start} is {value}"


def _bad_text(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    invalid = rng.choice((b"\xff", b"\x80", b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80"))
    position = rng.randrange(slot.start, slot.end)
    buf[position:position + len(invalid)] = invalid[:slot.end - position]
    return f"invalid UTF-8 in the string at byte {slot.start}"


def _bad_duration(buf: bytearray, slot: Slot, rng: random.Random) -> str:
    value = rng.choice((-(2**63), 2**63 - 1, MAX_I64_DURATION_MS * 2))
    _replace(buf, slot, _I64.pack(value))
    return f"int64 duration at byte {slot.start} is {value} ms"


_BY_KIND: dict[Kind, tuple[Mutation, ...]] = {
    Kind.LEN16: (_lie_length,),
    Kind.LEN32: (_lie_length,),
    Kind.ULEN: (_lie_length, _lie_length, _overlong_varint),
    Kind.TAG_COUNT: (_bad_tags, _overlong_varint),
    Kind.TAG: (_bad_tag, _overlong_varint),
    Kind.TAG_SIZE: (_bad_tag_size, _overlong_varint),
    Kind.BOOL: (_bad_bool,),
    Kind.MARKER: (_bad_marker,),
    Kind.TEXT: (_bad_text,),
    Kind.DURATION64: (_bad_duration,),
}

_UNSUPPORTED_KEYS = (*(k for k in range(-1, 80) if k not in set(ApiKey)), 32767)


def read_uvarint(buf: bytes | bytearray, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def mutate(buf: bytearray, slots: list[Slot], api_key: int, api_version: int,
           rng: random.Random) -> tuple[bytes, str, bool]:
    """Corrupt ``buf`` (a request without its size prefix; ``slots`` its layout map):
    (the frame with its size prefix, what was done, whether it is single-use: a size
    prefix that lies leaves nothing else readable on its connection)."""
    r = rng.random()
    if r < 0.6 and slots:
        slot = rng.choice(slots)
        how = rng.choice(_BY_KIND[slot.kind])(buf, slot, rng)
    elif r < 0.68:
        cut = rng.choice([s.start for s in slots] or [len(buf)]) if rng.random() < 0.7 \
            else rng.randrange(len(buf))
        del buf[cut:]
        how = f"cut to {cut} bytes"
    elif r < 0.74:
        buf += rng.randbytes(rng.randint(1, 64))
        how = "trailing bytes"
    elif r < 0.8:
        low, high = SUPPORTED_API_VERSIONS[ApiKey(api_key)]
        version = rng.choice((high + 1, high + 7, low - 1, -1, 32767))
        _I16.pack_into(buf, 2, version)
        how = f"version {version}"
    elif r < 0.84:
        key = rng.choice(_UNSUPPORTED_KEYS)
        _I16.pack_into(buf, 0, key)
        how = f"API key {key}"
    elif r < 0.92:
        how = ""
        for _ in range(rng.randint(1, 3)):
            position = rng.randrange(8, len(buf)) if len(buf) > 8 else 0
            bit = rng.randrange(8)
            buf[position] ^= 1 << bit
            how += f"bit {bit} of byte {position} flipped; "
        how = how.rstrip("; ")
    else:
        size = rng.choice((len(buf) + rng.randint(1, 100), max(len(buf) - rng.randint(1, 8), 0),
                           -1, -(2**31), 100 * 1024 * 1024 + 1))
        return _I32.pack(size) + bytes(buf), f"size prefix says {size} of {len(buf)}", True
    return _I32.pack(len(buf)) + bytes(buf), how, False
