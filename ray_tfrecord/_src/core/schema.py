"""Schema inference: an Arrow schema from a sample of TFRecord records.

Rules (a sample never silently changes what the data means):

- ``int64_list`` -> ``int64``, ``float_list`` -> ``float32``, ``bytes_list`` -> ``binary``.
- Absence does not vote (as in Spark-TFRecord): a feature is a scalar when every sampled record
  that holds it holds exactly one value, ``list<T>`` otherwise; records that lack it read as
  null either way. A record holding it with no values (``int64_list {}``, or a ``Feature`` with
  no kind) holds it, so the column is a list. With ``fixed_size_lists=True``, a feature with the
  same number (> 1) of values in every sampled record that holds it becomes
  ``fixed_size_list<T>[n]``.
- SequenceExample ``feature_lists`` -> ``list<list<T>>``.
- Kinds never merge: a feature that is ``int64_list`` in one record and ``float_list`` in another
  is a ``SchemaError`` naming both records.
- A feature that never has a kind set in the sample (every occurrence an empty ``Feature``) is
  ``list<null>``: it reads back as empty lists and writes back as empty ``Feature`` s, so it
  round-trips exactly. An empty list *with* a kind (``int64_list {}``) keeps its kind.
- Columns are sorted by name, so the schema does not depend on map order within records.

Example::

    import io
    import pyarrow as pa
    from ray_tfrecord._src.core import codec
    from ray_tfrecord._src.core.framing import iter_chunks
    from ray_tfrecord._src.core.schema import infer_schema

    enc = codec.encode(pa.record_batch({"x": pa.array([[1], [2, 3]])}))
    schema = infer_schema(iter_chunks(io.BytesIO(bytes(enc.data)), path="<memory>"))
    assert schema == pa.schema([("x", pa.list_(pa.int64()))])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from . import _native
from ._contract import Kind, RecordTypeCode, Section, Status
from ._tensors import sampled_tensors, tensor_hint
from .codec import BYTE_ARRAY_SCHEMA
from .errors import DecodeError, SchemaError
from .framing import RecordChunk
from .layout import SCHEMA_FILE
from .manifest import Manifest, read_manifest
from .options import RecordType
from .public import public
from .types import KIND_NAMES, NATIVE_LEAF, record_type_code

#: The recorded schema's metadata key naming its records' type (Example or SequenceExample).
RECORD_TYPE_KEY = b"ray_tfrecord.record_type"


def stored_schema(fields: Iterable[pa.Field], record_type: RecordType) -> pa.Schema:
    """The schema to record for records of ``record_type`` with these fields."""
    return pa.schema([f.remove_metadata() for f in fields], metadata={RECORD_TYPE_KEY: record_type.encode()})


class _Latest:
    """``read_stored_schema``'s default version: the dataset's latest, read for the call."""


LATEST = _Latest()


def read_stored_schema(filesystem, root: str, record_type: RecordType | None = None, *,
                       version: Manifest | None | _Latest = LATEST) -> pa.Schema | None:
    """The schema recorded for the dataset directory ``root``, if any (and if for ``record_type``): the one
    ``version`` states (the version a read planned against; ``None``: the dataset has no log), else, for a
    version from before versions held their schema, the ``SCHEMA_FILE`` beside it."""
    if isinstance(version, _Latest):
        try:
            version = read_manifest(filesystem, root)
        except OSError:  # not a directory, or not there: nothing is recorded
            version = None
    if version is not None and version.states_schema:
        schema = version.schema
    else:
        try:
            with filesystem.open_input_stream(f"{root.rstrip('/')}/{SCHEMA_FILE}", compression=None) as f:
                schema = pa.ipc.read_schema(pa.py_buffer(f.read()))
        except (FileNotFoundError, OSError, pa.ArrowInvalid):
            return None
    if schema is None:
        return None
    if record_type is not None and (schema.metadata or {}).get(RECORD_TYPE_KEY) != record_type.encode():
        return None
    return schema


def merge_recorded(recorded: pa.Schema, appended: pa.Schema, *, path: str | None = None) -> pa.Schema:
    """The schema of a dataset recorded as ``recorded`` once records of schema ``appended`` are
    added: every recorded column keeps its type, new columns follow, and a column that some
    records lack is nullable. Raises ``SchemaError`` when a column changes type (``path``,
    the dataset, goes in the message)."""
    kind, new_kind = ((s.metadata or {}).get(RECORD_TYPE_KEY) for s in (recorded, appended))
    if kind != new_kind:
        raise SchemaError(f"the dataset holds {_decoded(kind)} records, not {_decoded(new_kind)}; pass "
                          f"record_type={_decoded(kind)!r} or write to another path", path=path)
    fields = {f.name: f for f in appended}
    merged = []
    for old in recorded:
        new = fields.pop(old.name, None)
        if new is not None and pa.types.is_null(new.type):
            new = None  # null-typed in these rows (all null): they lack the feature, whatever its type
        elif new is not None and pa.types.is_null(old.type):
            old = new.with_nullable(True)  # the column was null-typed (all null) in the rows recorded so far
        if new is not None and not new.type.equals(old.type):
            raise SchemaError(f"the dataset stores it as {old.type}, the rows appended have {new.type}; cast the "
                              f"column to {old.type} before appending, or write with mode='overwrite'",
                              path=path, column=old.name)
        merged.append(old.with_nullable(new is None or old.nullable or new.nullable))
    merged += [f.with_nullable(True) for f in fields.values()]
    return pa.schema(merged, metadata=recorded.metadata)


def _decoded(record_type: bytes | None) -> str:
    return record_type.decode() if record_type else "unknown"


@dataclass
class _Stats:
    section: Section
    kind: Kind
    kind_place: tuple[str, int] | None
    min_count: int = 1 << 62
    max_count: int = -1


def _place(p: tuple[str, int] | None) -> str:
    return f"{p[0]} at offset {p[1]}" if p else "?"


def _inspect(chunk: RecordChunk, rtype: int) -> list[_native.InspectedColumn]:
    try:
        return _native.inspect(chunk.buffer, chunk.positions, chunk.lengths, rtype)
    except _native.CodecError as e:
        name = e.column.decode("utf-8", "replace") if e.column is not None else None
        if e.status == Status.KIND_MISMATCH:
            raise SchemaError(f"feature is {KIND_NAMES[Kind(e.actual)]} here but {KIND_NAMES[Kind(e.expected)]} in the "
                              f"record at offset {chunk.offset(e.other_record)}; kinds never merge", path=chunk.path,
                              offset=chunk.offset(e.record), column=name) from None
        raise DecodeError(f"malformed record: {e} (at byte {e.offset} of the record)", path=chunk.path,
                          offset=chunk.offset(e.record), column=name) from None


@public("ray_tfrecord")
def infer_schema(chunks: Iterable[RecordChunk], record_type: RecordType = "Example", *,
                 fixed_size_lists: bool = False) -> pa.Schema:
    """Infer the schema of the records in ``chunks`` (all of them: the caller bounds the sample)."""
    rtype = record_type_code(record_type)
    if rtype == RecordTypeCode.BYTE_ARRAY:
        return BYTE_ARRAY_SCHEMA
    stats: dict[tuple[Section, bytes], _Stats] = {}
    for chunk in chunks:
        for col in _inspect(chunk, rtype):
            section, kind = Section(col.section), Kind(col.kind)
            s = stats.get((section, col.name))
            place = (chunk.path, chunk.offset(col.kind_record)) if col.kind_record >= 0 else None
            if s is None:
                s = stats[(section, col.name)] = _Stats(section, kind, place)
            elif kind != Kind.NONE and s.kind == Kind.NONE:
                s.kind, s.kind_place = kind, place
            elif kind != Kind.NONE and kind != s.kind:
                raise SchemaError(f"feature is {KIND_NAMES[kind]} in {_place(place)} but {KIND_NAMES[s.kind]} in "
                                  f"{_place(s.kind_place)}; kinds never merge", column=_name(col.name))
            s.min_count = min(s.min_count, col.min_count)
            s.max_count = max(s.max_count, col.max_count)
    fields = []
    names = {}
    for (section, raw), s in sorted(stats.items(), key=lambda kv: kv[0][1]):
        name = _name(raw)
        if name in names:
            raise SchemaError("name is both a context feature and a feature_list; Arrow columns need distinct names",
                              column=name)
        names[name] = section
        fields.append(pa.field(name, _type(s, fixed_size_lists)))
    return pa.schema(fields)


def _name(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SchemaError(f"feature name {raw!r} is not UTF-8") from None


def _type(s: _Stats, fixed_size_lists: bool) -> pa.DataType:
    # The native counts cover only the records that hold the feature: a record lacking it is null
    # whatever the shape, so it does not decide the shape.
    leaf = pa.null() if s.kind == Kind.NONE else NATIVE_LEAF[s.kind]
    if s.section == Section.FEATURE_LISTS:
        return pa.list_(pa.list_(leaf))
    if s.kind != Kind.NONE and s.min_count == s.max_count == 1:
        return leaf
    if fixed_size_lists and s.kind != Kind.NONE and s.min_count == s.max_count > 1:
        return pa.list_(leaf, s.max_count)
    return pa.list_(leaf)


def tensor_hints(schema: pa.Schema, rows: Sequence[Mapping[str, object]]) -> list[str]:
    """A line for each binary column of ``schema`` whose values in the sampled ``rows`` are serialized tensors
    of one dtype and shape, naming the ``schema=`` field that reads them as tensors (the CLI's inspect)."""
    hints = []
    for field in schema:
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            found = sampled_tensors(row.get(field.name) for row in rows)
            if found is not None:
                hints.append(tensor_hint(field.name, *found))
    return hints
