"""Hand-made protobuf wire bytes, for records no encoder would write."""

from __future__ import annotations


def varint(n: int) -> bytes:
    """A varint; negative numbers as protobuf writes int64 (ten bytes, two's complement)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def ld(field: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def entry(key: bytes | None, value: bytes | None) -> bytes:
    """A Features map entry; None leaves the key or the value out."""
    return ld(1, (ld(1, key) if key is not None else b"") + (ld(2, value) if value is not None else b""))


def example(*entries: bytes) -> bytes:
    return ld(1, b"".join(entries))


def ints(*values: int) -> bytes:
    """A Feature holding an int64_list."""
    return ld(3, ld(1, b"".join(varint(v) for v in values)))
