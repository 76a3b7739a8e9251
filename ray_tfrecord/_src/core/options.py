"""The option types that several entry points share, each validated here and nowhere else.

Every public function that takes one of these calls the matching checker, so the Python API, the
CLI (whose ``choices`` come from the same tuples) and the Ray adapters agree on the spelling and
on the message a wrong value gets::

    >>> from ray_tfrecord._src.core import options
    >>> options.record_type("SequenceExample")
    'SequenceExample'
    >>> options.compression("auto", allow_auto=True) is None
    False
    >>> options.mode("overwrite")
    'overwrite'
    >>> options.compression_level(9, "gzip")
    9

This module imports neither Ray nor the native codec: the codec layer validates with it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypedDict, get_args

from .public import public

RecordType = Literal["Example", "SequenceExample", "ByteArray"]
"""What each record holds: a ``tf.train.Example``, a ``tf.train.SequenceExample`` (its
``feature_lists`` are ``list<list<T>>`` columns), or ``"ByteArray"``: raw payloads, read as one
``binary`` column, ``record`` ([`BYTE_ARRAY_SCHEMA`][ray_tfrecord.BYTE_ARRAY_SCHEMA])."""
Compression = Literal["gzip", "zlib"]
OnCorrupt = Literal["raise", "skip"]
Mode = Literal["error", "overwrite", "append", "ignore"]
#: zlib's levels: 0 stores, 1 is fastest, 9 smallest, -1 zlib's default (6).
COMPRESSION_LEVELS = range(-1, 10)

RECORD_TYPES: tuple[RecordType, ...] = get_args(RecordType)
COMPRESSIONS: tuple[Compression, ...] = get_args(Compression)
ON_CORRUPT: tuple[OnCorrupt, ...] = get_args(OnCorrupt)
MODES: tuple[Mode, ...] = get_args(Mode)



@public("ray_tfrecord")
class RayTaskOptions(TypedDict, total=False):
    """Ray's options for the read or write tasks, by name, as Ray 2.60's ``ray.data.read_datasource`` takes
    them. Only the ones given reach Ray; a Ray release whose call does not name one yet gets it inside
    ``ray_remote_args``."""

    num_cpus: float
    num_gpus: float
    memory: float
    resources: dict[str, float]
    accelerator_type: str
    runtime_env: dict[str, Any]
    label_selector: dict[str, str]
    fallback_strategy: list[dict[str, Any]]
    max_calls: int


RAY_TASK_OPTIONS: frozenset[str] = frozenset(RayTaskOptions.__optional_keys__)

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


def compression_level(value: object, compression: object) -> int | None:
    """Return ``value`` if it is ``None`` (zlib's default) or a zlib level for a gzip/zlib write.

    A level given for an uncompressed write is refused rather than ignored.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value not in COMPRESSION_LEVELS:
        raise ValueError(f"compression_level must be an integer from 0 (fastest) to 9 (smallest), or -1 for "
                         f"zlib's default; got {value!r}")
    if compression is None:
        raise ValueError(f"compression_level={value} applies to compressed files only; pass compression='gzip' "
                         "or 'zlib' as well, or leave compression_level unset")
    return value


def ray_task_options(function: str, given: Mapping[str, Any]) -> RayTaskOptions:
    """``given`` (a function's ``**task_options``) if it names only Ray task options, else the
    ``TypeError`` Python raises for an unexpected keyword."""
    for name in given:
        if name not in RAY_TASK_OPTIONS:
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}")
    return given  # type: ignore[return-value]
