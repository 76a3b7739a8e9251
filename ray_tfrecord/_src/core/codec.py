"""Records <-> Arrow: decode framed Example / SequenceExample records into Arrow columns, and back.

The work happens in the native core, one call per chunk of records, without a Python object per
record or per value. Types:

=====================  =====================================================================
TFRecord               Arrow
=====================  =====================================================================
``int64_list``         ``int64`` (scalar), ``list<int64>``, ``fixed_size_list<int64>[n]``
``float_list``         ``float32`` (scalar), ``list<float32>``, ``fixed_size_list<float32>[n]``;
                       ``decimal128`` / ``decimal256`` (and lists) when the schema asks
``bytes_list``         ``binary`` (``string`` when the schema says so), lists of them
``feature_lists``      ``list<list<T>>`` (SequenceExample only)
Feature with no kind   ``list<null>`` (only ever empty)
=====================  =====================================================================

A feature missing from a record decodes to null; present but empty, to an empty list. Other
integer / float widths in a read schema are cast from int64 / float32 with overflow checks;
decimals follow the exact rules of ``ray_tfrecord._src.core._decimal``.

Example::

    import pyarrow as pa
    from ray_tfrecord._src.core import codec
    from ray_tfrecord._src.core.framing import iter_chunks
    import io

    batch = pa.record_batch({"id": pa.array([1, 2]), "tags": pa.array([["a"], []], pa.list_(pa.binary()))})
    enc = codec.encode(batch)
    (chunk,) = iter_chunks(io.BytesIO(bytes(enc.data)), path="<memory>")
    assert codec.decode(chunk, batch.schema).equals(batch)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import NamedTuple, TypeVar

import numpy as np
import pyarrow as pa

from . import _derived, _native, _tensors
from ._casts import cast, first_true
from ._columns import Narrowing, encode_column, leaf_values, natively_readable, null_in_list
from ._contract import DecodeSpec, EncodeColumn, EncodeSpec, Kind, RecordTypeCode, Section, Shape, Status, is_malformed
from .errors import DecodeError, SchemaError, TFRecordError
from .framing import HEADER_BYTES, RecordChunk
from .options import RecordType
from .public import public
from .types import KIND_NAMES, column_spec, leaf_kind, native_type, record_type_code, single_chunk

BYTE_ARRAY_SCHEMA = pa.schema([pa.field("record", pa.binary(), nullable=False)])
"""The schema of ``record_type="ByteArray"``: one non-null ``binary`` column, ``record``, holding each record's
raw payload."""


@public("ray_tfrecord")
class EncodedRecords(NamedTuple):
    """Framed records ready to write, and where each one starts in ``data`` (for an index)."""

    data: memoryview
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)


# ------------------------------------------------------------------------------------------------
# decode


@public("ray_tfrecord")
class Decoder:
    """Decodes chunks of framed records into record batches of one ``schema``, with exactly its columns.

    Built once per schema (the columns' specs and the name table live in the native decoder), it
    decodes each chunk in one native call that also assembles the Arrow record batch, without the
    GIL; only columns whose type in ``schema`` differs from the one decoded (other int widths,
    strings, decimals, large or extension types) are then converted in Python. One decoder may
    decode on several threads at once; a batch it returns does not depend on it.

    Raises [`SchemaError`][ray_tfrecord.SchemaError] for a column type with no TFRecord form, and
    from [`decode`][ray_tfrecord.Decoder.decode] [`DecodeError`][ray_tfrecord.DecodeError] naming the
    file, the record's offset and the column.

    >>> import io
    >>> import pyarrow as pa
    >>> from ray_tfrecord import iter_chunks
    >>> batch = pa.record_batch({"id": pa.array([1, 2]), "tags": pa.array([["a"], []], pa.list_(pa.binary()))})
    >>> decoder = Decoder(batch.schema)
    >>> (chunk,) = iter_chunks(io.BytesIO(bytes(encode(batch).data)), path="<memory>")
    >>> decoder.decode(chunk).equals(batch)
    True
    """

    def __init__(self, schema: pa.Schema, record_type: RecordType = "Example") -> None:
        self.schema = schema
        self.record_type = record_type
        self._rtype = record_type_code(record_type)
        self._types = {f.name: f.type for f in schema}
        self._native: _native.Decoder | None = None
        self._modes: dict[frozenset[int], _Mode] = {}
        # A feature spec's defaults, ragged partitions and fixed steps: its source features decoded first.
        self._derived = _derived.plan(schema) if self._rtype != RecordTypeCode.BYTE_ARRAY else None
        self._inner = Decoder(self._derived.source, record_type) if self._derived is not None else None
        if len(schema) == 0 or self._rtype == RecordTypeCode.BYTE_ARRAY or self._inner is not None:
            return
        self._tensors = _tensors.tensor_columns(schema)
        self._index = {f.name.encode(): i for i, f in enumerate(schema)}
        self._mode = self._mode_for(frozenset())
        self._native = self._mode.native

    def _mode_for(self, proto: frozenset[int]) -> _Mode:
        """The native decoder that reads the tensor columns ``proto`` as serialized tensors, built once."""
        if proto in self._modes:
            return self._modes[proto]
        schema = self.schema
        specs = [column_spec(f, self.record_type) for f in schema]
        decode_specs = [DecodeSpec(f.name.encode(), kind, shape, n,
                                   Section.FEATURE_LISTS if shape == Shape.SEQUENCE else Section.CONTEXT, f.nullable)
                        for f, (kind, shape, n) in zip(schema, specs)]
        types = [native_type(*spec) for spec in specs]
        for i in proto:
            decode_specs[i], types[i] = _tensors.proto_spec(decode_specs[i], self._tensors[i])
        native = pa.schema([pa.field(f.name, t, f.nullable) for f, t in zip(schema, types)])
        casts = [i for i, f in enumerate(schema) if f.type != native.field(i).type]
        # The batch comes from native code ready to hand on (given the schema's own metadata) when
        # it has the schema's very fields: types, names (native names end at a NUL), nullability,
        # no field metadata; otherwise its columns are re-wrapped.
        fields = pa.schema(list(schema))
        exact = native.equals(fields, check_metadata=True) and not any("\0" in f.name for f in schema)
        return self._modes.setdefault(proto, _Mode(proto, _native.Decoder(decode_specs, self._rtype), casts, exact))

    @property
    def native_seconds(self) -> float:
        """Seconds all ``decode`` calls together spent in native code without the GIL."""
        if self._inner is not None:
            return self._inner.native_seconds
        return sum(m.native.nogil_ns for m in list(self._modes.values())) / 1e9

    def decode(self, chunk: RecordChunk) -> pa.RecordBatch:
        """The records of ``chunk`` as a record batch with exactly the decoder's schema."""
        nrows = len(chunk)
        if self._inner is not None and self._derived is not None:
            return self._derived.apply(self._inner.decode(chunk), chunk)
        if self._native is None:
            if len(self.schema) == 0:
                return pa.RecordBatch.from_struct_array(pa.array([{}] * nrows, type=pa.struct([])))
            try:
                raw = _native.byte_array(chunk.buffer, chunk.positions, chunk.lengths)
            except _native.CodecError as e:
                raise _decode_error(e, chunk, self._types) from None
            arr = pa.Array.from_buffers(pa.binary(), nrows, [None, pa.py_buffer(raw.offsets), pa.py_buffer(raw.data)])
            return pa.RecordBatch.from_arrays([cast(arr, f, chunk) for f in self.schema], schema=self.schema)
        mode, tried = self._mode, {self._mode.proto}
        while True:
            try:
                out = mode.native.decode(chunk.buffer, chunk.positions, chunk.lengths)
                break
            except _native.CodecError as e:
                # A tensor column's feature is serialized tensors where lists were read, or the reverse:
                # the chunk is decoded again the other way (once per way), which later chunks then take.
                proto = _tensors.flip(e, self._index, self._tensors, mode.proto)
                if proto is None or proto in tried:
                    raise _decode_error(e, chunk, self._types) from None
                tried.add(proto)
                mode = self._mode = self._mode_for(proto)
        batch = pa.record_batch(out)
        if mode.exact and out.null_column < 0:
            return batch if self.schema.metadata is None else batch.replace_schema_metadata(self.schema.metadata)
        arrays = batch.columns
        for i in mode.casts:
            arrays[i] = cast(arrays[i], self.schema.field(i), chunk)
        if out.null_column >= 0:
            # A missing feature decodes as null; a not-null field must not hand one on (Parquet and
            # other consumers trust the flag), so the record is refused, as Spark refuses it.
            arr = arrays[out.null_column]
            raise DecodeError("the record lacks this feature but the schema declares the field not nullable; "
                              "declare it nullable=True or write the feature in every record",
                              path=chunk.path, offset=chunk.offset(first_true(arr.is_null())),
                              column=self.schema.field(out.null_column).name)
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


class _Mode(NamedTuple):
    """A native decoder of a schema, reading its tensor columns ``proto`` as serialized tensors."""

    proto: frozenset[int]
    native: _native.Decoder
    casts: list[int]
    exact: bool


def _decode_error(e: _native.CodecError, chunk: RecordChunk, specs: dict[str, pa.DataType]) -> TFRecordError:
    name = e.column.decode("utf-8", "replace") if e.column is not None else None
    offset = chunk.offset(e.record) if e.record >= 0 else None
    stream = " in the decompressed stream" if chunk.compressed else ""
    status, actual, expected = Status(e.status), e.actual, e.expected
    spec = specs.get(name) if name is not None else None
    if status.name.startswith("TENSOR_"):
        msg = _tensors.message(e, spec, stream)
    elif is_malformed(status):
        msg = f"malformed record{stream}: {e} (at byte {e.offset} of the record)"
    elif status == Status.KIND_MISMATCH:
        msg = f"feature is {KIND_NAMES[Kind(actual)]} but the schema says {KIND_NAMES[Kind(expected)]} ({spec or '?'})"
    elif status == Status.COUNT_MISMATCH:
        scalar = expected == 1 and spec is not None and not pa.types.is_fixed_size_list(spec)
        shape = "a scalar column" if scalar else f"a {spec or 'fixed-size'} column"
        values = f"{expected} value{'s' if expected != 1 else ''}"
        msg = f"{shape} needs exactly {values} but the record{stream} holds {actual}"
    elif status in (Status.BYTES_TOO_LARGE, Status.TOO_MANY_VALUES, Status.RECORDS_TOO_LARGE):
        msg = f"{e}; read smaller chunks"
    else:
        msg = str(e)
    return DecodeError(msg, path=chunk.path, offset=offset, column=name)


_T = TypeVar("_T")


class _SchemaKey:
    """A schema as a cache key where pyarrow cannot hash it (before 19: a schema or field with
    metadata); equal exactly when the schemas are, metadata included."""

    __slots__ = ("schema", "_serialized")

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self._serialized = schema.serialize().to_pybytes()

    def __hash__(self) -> int:
        return hash(self._serialized)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SchemaKey) and self._serialized == other._serialized


def _schema_of(key: pa.Schema | _SchemaKey) -> pa.Schema:
    return key.schema if isinstance(key, _SchemaKey) else key


@functools.lru_cache(maxsize=64)
def _cached_decoder(key: pa.Schema | _SchemaKey, record_type: RecordType) -> Decoder:
    return Decoder(_schema_of(key), record_type)


def _per_schema(cached: Callable[..., _T], schema: pa.Schema, *args: object) -> _T:
    """``cached(schema, *args)``, keyed by the schema itself: hashing it once per call costs about
    11 us for 25 columns; it is serialized only where pyarrow cannot hash it."""
    try:
        return cached(schema, *args)
    except TypeError:
        return cached(_SchemaKey(schema), *args)


def _decoder(schema: pa.Schema, record_type: RecordType) -> Decoder:
    """One decoder per schema: a read decodes every chunk of every file with one schema, and
    planning it per chunk was a third of the time of a read task over 10,000 small files."""
    return _per_schema(_cached_decoder, schema, record_type)


@public("ray_tfrecord")
def decode(chunk: RecordChunk, schema: pa.Schema, record_type: RecordType = "Example") -> pa.RecordBatch:
    """Decode the records of ``chunk`` into a record batch with exactly ``schema``'s columns.

    Raises ``DecodeError`` naming the file, the record's offset and the column when a record
    is malformed or a feature does not fit its column. A ``Decoder`` kept for the schema does
    the same without looking one up per chunk.
    """
    decoder = _decoder(schema, record_type)
    if decoder.schema is not schema and not decoder.schema.equals(schema, check_metadata=True):
        # Schemas that differ only in field metadata are equal, and hash alike, to the cache.
        decoder = Decoder(schema, record_type)
    return decoder.decode(chunk)


@public("ray_tfrecord")
def decode_records(records: pa.Table | pa.RecordBatch | pa.Array | pa.ChunkedArray, schema: pa.Schema,
                   record_type: RecordType = "Example") -> pa.RecordBatch:
    """Decode serialized records, one a row, into a record batch with exactly ``schema``'s columns.

    ``records`` is what ``read_tfrecords(..., record_type="ByteArray")`` yields (a table or batch
    whose ``record`` column holds each record's bytes) or a binary array. Ray then moves the
    records' serialized bytes and the consumer decodes them, which for wide integer rows (784
    int64 pixels: about 1.2 KB serialized against 6.3 KB decoded) moves a fifth of the memory.

    Raises [`DecodeError`][ray_tfrecord.DecodeError] naming the record's row and the column.

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"id": pa.array([7, 8])})
    >>> enc = encode(batch)
    >>> ends = [*enc.offsets[1:], len(enc.data)]
    >>> rows = [bytes(enc.data[o + 12 : e - 4]) for o, e in zip(enc.offsets, ends)]
    >>> decode_records(pa.array(rows, pa.binary()), batch.schema).column("id").to_pylist()
    [7, 8]
    """
    arr = _records_array(records)
    n = len(arr)
    if arr.null_count:
        raise DecodeError(f"record {first_true(arr.is_null())} of a {n}-record batch is null, not a serialized "
                          "record; drop or fill the null rows first")
    width = 8 if pa.types.is_large_binary(arr.type) else 4
    offsets = np.frombuffer(arr.buffers()[1], np.int32 if width == 4 else np.int64, n + 1,
                            arr.offset * width).astype(np.int64)
    start, end = int(offsets[0]), int(offsets[-1])
    # The decoder finds each payload HEADER_BYTES after its record's position and reads nothing in
    # between, so the bytes before a payload may be anything: the previous record's tail, or (at
    # the start of the data, nothing being there) a copy's gap.
    data = arr.buffers()[2]
    buffer: memoryview | np.ndarray
    if start >= HEADER_BYTES:
        buffer = memoryview(data)[start - HEADER_BYTES : end]
    else:
        buffer = np.empty(HEADER_BYTES + end - start, np.uint8)
        if end > start:
            buffer[HEADER_BYTES:] = np.frombuffer(data, np.uint8, end - start, start)
    chunk = RecordChunk(buffer, offsets[:-1] - start, np.diff(offsets), 0, "serialized records")
    try:
        return decode(chunk, schema, record_type)
    except DecodeError as e:
        # Offsets into this buffer mean nothing to the caller; the record's row does.
        where = "" if e.offset is None else f"record {int(np.searchsorted(chunk.positions, e.offset))} "
        raise DecodeError(f"{where}of a {n}-record batch: {e.reason}; read the files with "
                          "read_tfrecords(..., schema=...) to locate it by file and offset", column=e.column) from None


def _records_array(records: pa.Table | pa.RecordBatch | pa.Array | pa.ChunkedArray) -> pa.Array:
    """The one binary array of serialized records in ``records``."""
    if isinstance(records, (pa.Table, pa.RecordBatch)):
        name = BYTE_ARRAY_SCHEMA.names[0]
        if name not in records.schema.names:
            raise ValueError(f"decode_records needs the column {name!r} that read_tfrecords(..., "
                             f"record_type='ByteArray') gives; this batch has {records.schema.names}")
        records = records.column(name)
    if isinstance(records, pa.ChunkedArray):
        records = single_chunk(records)
    if not (pa.types.is_binary(records.type) or pa.types.is_large_binary(records.type)):
        raise ValueError(f"decode_records decodes binary or large_binary records, not {records.type}; "
                         "read the files with read_tfrecords(..., record_type='ByteArray')")
    return records


# ------------------------------------------------------------------------------------------------
# encode


@public("ray_tfrecord")
def check_encodable(schema: pa.Schema, record_type: RecordType = "Example", *,
                    allow_float64_narrowing: bool = False) -> None:
    """Raise ``SchemaError`` (naming column and type) if ``schema`` cannot be written.

    Call it before writing anything, so a bad column fails the write at the start, not midway.
    ``float64`` and decimal columns pass here, since the type alone does not tell (0.5 is exact in
    float32, 0.1 is not): their values are checked when encoded unless narrowing is allowed.
    """
    _check_columns(schema, record_type, null_typed=False)


def _check_columns(schema: pa.Schema, record_type: RecordType, *, null_typed: bool) -> None:
    """``check_encodable``; ``null_typed``: a ``null``-typed column passes, as in one block of a
    dataset (its cells are all null, written as missing features; another block types it)."""
    rtype = record_type_code(record_type)
    if rtype == RecordTypeCode.BYTE_ARRAY:
        if len(schema) != 1 or leaf_kind(schema[0].type) != Kind.BYTES:
            raise SchemaError(f"record_type='ByteArray' writes one binary or string column, got {schema}")
        return
    seen = set()
    for f in schema:
        if f.name in seen:
            raise SchemaError("duplicate column name", column=f.name)
        seen.add(f.name)
        if not (null_typed and pa.types.is_null(f.type)):
            column_spec(f, record_type)


@public("ray_tfrecord")
class Encoder:
    """Encodes record batches of one ``schema`` into framed records (CRCs included), one record a row.

    Built once per schema (the schema checked, each column's TFRecord form worked out and held by
    the native encoder), it encodes each batch in one native call, which reads the batch through
    the Arrow C data interface where a column's layout is already the encoder's (int64, float32,
    binary or string values; lists, large lists, fixed-size lists of them); only other columns
    (other widths, float64, decimals, extension types, ...) are converted in Python first. Null
    cells become missing features, and so does every cell of a ``null``-typed column (how Arrow types a
    column that is all null within one block), so the same rows make the same records however they
    are cut into blocks; [`check_encodable`][ray_tfrecord.check_encodable] still refuses that type, which
    a whole dataset's column cannot have. Raises [`SchemaError`][ray_tfrecord.SchemaError] for a column
    type with no TFRecord form; [`encode`][ray_tfrecord.Encoder.encode] raises
    [`TFRecordError`][ray_tfrecord.TFRecordError] for values that cannot be written without
    loss: a null inside a list, ``float64`` and decimal values with no exact float32 form, unless
    ``allow_float64_narrowing`` / ``allow_decimal_narrowing`` (then they are rounded to the
    nearest float32). With ``serialize_tensors``, each fixed-shape tensor column (``pa.fixed_shape_tensor``,
    Ray's tensor types) is written as Ray's ``write_tfrecords`` writes it: one ``bytes_list`` value a row, the
    tensor's ``tf.io.serialize_tensor`` bytes, which ``tf.io.parse_tensor`` reads (else: its flat values).

    >>> import pyarrow as pa
    >>> batch = pa.record_batch({"id": pa.array([1, 2]), "x": pa.array([0.5, None])})
    >>> len(Encoder(batch.schema).encode(batch))
    2
    """

    def __init__(self, schema: pa.Schema, record_type: RecordType = "Example", *,
                 allow_float64_narrowing: bool = False, allow_decimal_narrowing: bool = False,
                 serialize_tensors: bool = False) -> None:
        _check_columns(schema, record_type, null_typed=True)
        self.schema = schema
        self.record_type = record_type
        self._rtype = record_type_code(record_type)
        self._narrowing = Narrowing(allow_float64_narrowing, allow_decimal_narrowing)
        self._native: _native.Encoder | None = None
        if self._rtype == RecordTypeCode.BYTE_ARRAY:
            return
        # The columns written: a null-typed one has no feature in any record.
        self._written = [i for i, f in enumerate(schema) if not pa.types.is_null(f.type)]
        fields = [schema.field(i) for i in self._written]
        self._specs = [column_spec(f, record_type) for f in fields]
        self._tensors = _tensors.tensor_columns(pa.schema(fields)) if serialize_tensors else {}
        for i in self._tensors:
            self._specs[i] = (Kind.BYTES, Shape.SCALAR, 0)
        self._native = _native.Encoder([EncodeSpec(f.name.encode(), *spec) for f, spec in zip(fields, self._specs)],
                                       self._rtype)
        readable = [natively_readable(f.type) and i not in self._tensors for i, f in enumerate(fields)]
        self._python = [i for i, ok in enumerate(readable) if not ok]
        self._read = [i for i, ok in enumerate(readable) if ok]

    def encode(self, batch: pa.RecordBatch | pa.Table) -> EncodedRecords:
        """Every row of ``batch`` (with the encoder's column names and types) as one framed record."""
        if batch.schema.names != self.schema.names or batch.schema.types != self.schema.types:
            raise SchemaError(f"this encoder writes batches of {self.schema}, not {batch.schema}")
        if isinstance(batch, pa.Table):
            batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist(
                [], schema=batch.schema)
        if self._native is None:
            arr, name = batch.column(0), self.schema[0].name
            if arr.null_count:
                raise TFRecordError(f"null record at row {first_true(arr.is_null())}", column=name)
            vals, data = leaf_values(arr, Kind.BYTES, name, self._narrowing)
            cols = [EncodeColumn(name.encode(), Kind.BYTES, Shape.SCALAR, None, 0, None, None, vals, data)]
            enc = _native.encode(self._rtype, batch.num_rows, cols)
        else:
            written = batch if len(self._written) == len(self.schema) else batch.select(self._written)
            enc = self._encode_natively(written)
        return EncodedRecords(memoryview(enc.data), np.frombuffer(memoryview(enc.offsets), np.int64))

    def _encode_natively(self, batch: pa.RecordBatch) -> _native.Encoded:
        assert self._native is not None
        converted: list[EncodeColumn | None] = [None] * len(self._specs)
        for i in self._python:
            try:
                converted[i] = self._column(batch, i)
            except TFRecordError:
                # The columns the native encoder reads have not been checked yet: the first error
                # in column order is the one to report.
                for k in self._read:
                    if k < i:
                        self._column(batch, k)
                raise
        try:
            return self._native.encode(batch, batch.num_rows, converted)
        except _native.CodecError as e:
            if e.status not in (Status.NULL_INNER_LIST, Status.NULL_LIST_ELEMENT):
                raise
            what = "inner list" if e.status == Status.NULL_INNER_LIST else "list element"
            raise null_in_list(what, e.actual, (e.column or b"").decode()) from None

    def _column(self, batch: pa.RecordBatch, i: int) -> EncodeColumn:
        if i in self._tensors:
            return _tensors.serialized_column(batch.schema.field(i), batch.column(i), self._tensors[i])
        return encode_column(batch.schema.field(i), batch.column(i), self._specs[i], self._narrowing)


@functools.lru_cache(maxsize=64)
def _cached_encoder(key: pa.Schema | _SchemaKey, record_type: RecordType, allow_float64_narrowing: bool,
                    allow_decimal_narrowing: bool, serialize_tensors: bool) -> Encoder:
    return Encoder(_schema_of(key), record_type, allow_float64_narrowing=allow_float64_narrowing,
                   allow_decimal_narrowing=allow_decimal_narrowing, serialize_tensors=serialize_tensors)


@public("ray_tfrecord")
def encode(batch: pa.RecordBatch | pa.Table, record_type: RecordType = "Example", *,
           allow_float64_narrowing: bool = False, allow_decimal_narrowing: bool = False,
           serialize_tensors: bool = False) -> EncodedRecords:
    """Encode every row of ``batch`` as one framed record (CRCs included), as an ``Encoder``
    for its schema does (one is kept per schema)."""
    encoder = _per_schema(_cached_encoder, batch.schema, record_type, allow_float64_narrowing,
                          allow_decimal_narrowing, serialize_tensors)
    return encoder.encode(batch)
