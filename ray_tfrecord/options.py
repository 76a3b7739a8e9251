"""The option types that several entry points share, each validated here and nowhere else.

Every public function that takes one of these calls the matching checker, so the Python API, the
CLI (whose ``choices`` come from the same tuples) and the Ray adapters agree on the spelling and
on the message a wrong value gets::

    >>> from ray_tfrecord import options
    >>> options.record_type("SequenceExample")
    'SequenceExample'
    >>> options.compression("auto", allow_auto=True) is None
    False
    >>> options.mode("overwrite")
    'overwrite'

This module imports neither Ray nor the native codec: the codec layer validates with it too.
"""

from __future__ import annotations

from typing import Literal, get_args

RecordType = Literal["Example", "SequenceExample", "ByteArray"]
Compression = Literal["gzip", "zlib"]
OnCorrupt = Literal["raise", "skip"]
Mode = Literal["error", "overwrite", "append", "ignore"]

RECORD_TYPES: tuple[RecordType, ...] = get_args(RecordType)
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)
ON_CORRUPT: tuple[OnCorrupt, ...] = get_args(OnCorrupt)
MODES: tuple[Mode, ...] = get_args(Mode)


def _one_of(name: str, value: object, allowed: tuple) -> None:
    if value not in allowed:
        spelled = ", ".join(repr(a) for a in allowed)
        raise ValueError(f"{name} must be one of {spelled}; got {value!r}")


def record_type(value: object) -> RecordType:
    """Return ``value`` if it names a record type, else raise ``ValueError``."""
    _one_of("record_type", value, RECORD_TYPES)
    return value  # type: ignore[return-value]


def compression(value: object, *, allow_auto: bool = False) -> Compression | Literal["auto"] | None:
    """Return ``value`` if it is ``None``, ``"gzip"``, ``"zlib"`` (or ``"auto"`` where allowed)."""
    _one_of("compression", value, (*(("auto",) if allow_auto else ()), None, *COMPRESSIONS))
    return value  # type: ignore[return-value]


def on_corrupt(value: object) -> OnCorrupt:
    """Return ``value`` if it is ``"raise"`` or ``"skip"``."""
    _one_of("on_corrupt", value, ON_CORRUPT)
    return value  # type: ignore[return-value]


def mode(value: object) -> Mode:
    """Return the save mode's name; accepts the names and Ray's ``SaveMode`` members alike."""
    name = getattr(value, "value", value)
    _one_of("mode", name, MODES)
    return name  # type: ignore[return-value]
