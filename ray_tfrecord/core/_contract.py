"""The named contract with the native codec (``ray_tfrecord.core._native``), in one place.

The enums are built from the values the extension exports, so Python never re-types a native
number; results come back as named struct sequences (``ScanResult``, ``DecodedColumn``, ...) and
specs go in as the NamedTuples below, which the extension reads by field name.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any, NamedTuple

from . import _native

#: Every way a native call fails. ``MALFORMED_*``: a protobuf wire-format violation.
Status = IntEnum("Status", _native.STATUS, module=__name__)
#: A feature's kind (``NONE``: no kind set); the column's leaf type.
Kind = IntEnum("Kind", _native.KINDS, module=__name__)
#: A column's shape: scalar, list, fixed-size list, or SequenceExample feature_list (list of lists).
Shape = IntEnum("Shape", _native.SHAPES, module=__name__)
#: Which map of a record a feature lives in.
Section = IntEnum("Section", _native.SECTIONS, module=__name__)
#: The native code of each record type.
RecordTypeCode = IntEnum("RecordTypeCode", _native.RECORD_TYPES, module=__name__)


def is_malformed(status: int) -> bool:
    """Whether ``status`` says a record's protobuf is malformed."""
    return Status(status).name.startswith("MALFORMED_")


class DecodeSpec(NamedTuple):
    """One column for ``_native.Decoder``."""

    name: bytes
    kind: Kind
    shape: Shape
    fixed_size: int
    section: Section
    nullable: bool


class EncodeColumn(NamedTuple):
    """One column's Arrow buffers for ``_native.encode`` (offsets and bytes offsets as int64)."""

    name: bytes
    kind: Kind
    shape: Shape
    validity: Any
    validity_offset: int
    row_offsets: Any
    inner_offsets: Any
    values: Any
    data: Any
