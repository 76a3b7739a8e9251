"""Schemas in TensorFlow's dialects -> the Arrow read schema: a ``tf.io`` feature-spec dict (or the
``(context_features, sequence_features)`` pair of ``parse_sequence_example``), a TFMD ``Schema`` proto,
a path to its ``schema.pbtxt``, and Ray's ``tf_schema=``.

TensorFlow is not imported: a feature spec is read by its class name and attributes (``tf.io``'s
specs are namedtuples), a dtype by its ``name``. What TensorFlow does beyond a column's Arrow type
(a ``FixedLenFeature``'s default, a ``RaggedFeature``'s partitions, a ``FixedLenSequenceFeature``'s
step shape) travels in the field's metadata, which ``ray_tfrecord._src.core._derived`` carries out
in the decoder, so every reader of a schema (Ray read tasks, splits, the CLI) reads alike.

    >>> class FixedLenFeature(tuple):  # stands in for tf.io.FixedLenFeature, matched by name
    ...     shape, dtype, default_value = property(lambda s: s[0]), property(lambda s: s[1]), property(lambda s: s[2])
    >>> class DType:
    ...     name = "float32"
    >>> arrow_schema({"x": FixedLenFeature(([2], DType(), None))})  # no default_value: required, so not null
    x: fixed_size_list<item: float>[2] not null
      child 0, item: float
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any, TypeAlias

import pyarrow as pa

from .errors import SchemaError
from .options import RecordType

#: The field metadata key holding what TensorFlow does beyond the Arrow type (JSON; see _derived).
FEATURE_KEY = b"ray_tfrecord.feature"
# tf.io's parse ops read exactly these three dtypes (Tdense / sparse_types); TFMD's three types.
_DTYPES = {"int64": pa.int64(), "float32": pa.float32(), "string": pa.binary()}
_TFMD_TYPES = {1: pa.binary(), 2: pa.int64(), 3: pa.float32()}  # schema_pb2.FeatureType BYTES, INT, FLOAT
_PARTITIONS = {"RowSplits": "row_splits", "RowLengths": "row_lengths", "UniformRowLength": "uniform_row_length"}
#: What ``schema=`` takes: Arrow, a feature-spec dict, a (context, sequence) pair, a TFMD Schema, a pbtxt path.
SchemaLike: TypeAlias = ("pa.Schema | Mapping[str, Any] | tuple[Mapping[str, Any], Mapping[str, Any]] | str "
                          "| os.PathLike[str] | Any")
_SPEC_CLASSES = ("FixedLenFeature", "VarLenFeature", "RaggedFeature", "FixedLenSequenceFeature", "SparseFeature")


def arrow_schema(schema: Any, record_type: RecordType = "Example") -> pa.Schema:
    """The Arrow read schema ``schema`` means, whichever dialect it is in (a ``pyarrow.Schema`` as it is).

    Raises ``SchemaError`` naming the feature for a spec with no Arrow form (a ``SparseFeature``, a
    dtype ``parse_example`` does not read, a default of the wrong size).
    """
    if schema is None or isinstance(schema, pa.Schema):
        return schema
    if isinstance(schema, (str, os.PathLike)):
        return arrow_schema(read_pbtxt(os.fspath(schema)), record_type)
    if _is_tfmd(schema):
        return _from_tfmd(schema)
    if isinstance(schema, tuple) and len(schema) == 2 and all(isinstance(s, Mapping) for s in schema):
        if record_type != "SequenceExample":
            raise SchemaError("a (context_features, sequence_features) pair is a SequenceExample spec; "
                              "pass record_type='SequenceExample'")
        context, sequence = schema
        both = sorted(set(context) & set(sequence))
        if both:
            raise SchemaError("is both a context and a sequence feature; a column has one name", column=both[0])
        return pa.schema([*(_context_field(n, s, record_type) for n, s in context.items()),
                          *(_sequence_field(n, s) for n, s in sequence.items())])
    if isinstance(schema, Mapping):
        return pa.schema([_context_field(str(n), s, record_type) for n, s in schema.items()])
    raise TypeError(f"schema= takes a pyarrow.Schema, a dict of tf.io feature specs, a (context, sequence) pair "
                    f"of them, a TFMD Schema or a schema.pbtxt path, not {type(schema).__name__}")


def ray_tf_schema(tf_schema: Any) -> pa.Schema:
    """Ray's ``read_tfrecords(tf_schema=)``: each feature of the TFMD ``Schema`` a ``list<T>`` of its type
    (Ray never unwraps a single value when given a schema), whatever its shape."""
    if not _is_tfmd(tf_schema):
        raise TypeError(f"tf_schema= takes a tensorflow_metadata Schema proto (as Ray's does), not "
                        f"{type(tf_schema).__name__}; pass a feature-spec dict or a pyarrow.Schema as schema=")
    return pa.schema([pa.field(f.name, pa.list_(_tfmd_type(f))) for f in tf_schema.feature])


def read_pbtxt(path: str) -> Any:
    """The TFMD ``Schema`` in the text-format file ``path`` (``schema.pbtxt``, as TFDV and TFX write it)."""
    try:
        from google.protobuf import text_format
        from tensorflow_metadata.proto.v0 import schema_pb2
    except ImportError:
        raise ImportError(f"{path}: reading a schema.pbtxt needs the tensorflow-metadata package: "
                          "pip install 'ray_tfrecord[tfmd]'") from None
    with open(path, encoding="utf-8") as f:
        try:
            return text_format.Parse(f.read(), schema_pb2.Schema())
        except text_format.ParseError as e:
            raise SchemaError(f"not a TFMD Schema in text format: {e}", path=path) from None


def feature_info(field: pa.Field) -> dict[str, Any] | None:
    """What the field's metadata says TensorFlow does beyond its type, or None."""
    raw = (field.metadata or {}).get(FEATURE_KEY)
    return None if raw is None else json.loads(raw)


def leaf_of(dtype: Any, name: str) -> pa.DataType:
    """The Arrow leaf type of a ``tf.DType`` (or its name) that ``parse_example`` reads."""
    spelled = getattr(dtype, "name", dtype)
    if spelled not in _DTYPES:
        raise SchemaError(f"dtype {spelled} is not one tf.io.parse_example reads (tf.int64, tf.float32, tf.string)",
                          column=name)
    return _DTYPES[spelled]


# ------------------------------------------------------------------------------------------------


def _is_tfmd(obj: object) -> bool:
    descriptor = getattr(obj, "DESCRIPTOR", None)
    return getattr(descriptor, "full_name", None) == "tensorflow.metadata.v0.Schema"


def _with_info(field: pa.Field, **info: Any) -> pa.Field:
    return field.with_metadata({FEATURE_KEY: json.dumps(info, separators=(",", ":"))})


def _kind(spec: Any, name: str) -> str:
    kind = type(spec).__name__
    if kind not in _SPEC_CLASSES:
        raise SchemaError(f"{kind} is not a tf.io feature spec (FixedLenFeature, VarLenFeature, RaggedFeature, "
                          "FixedLenSequenceFeature)", column=name)
    if kind == "SparseFeature":
        raise SchemaError("a SparseFeature assembles a sparse tensor from index and value features, which has "
                          "no Arrow column; list its index_key and value_key features as VarLenFeature "
                          "(each a list column) instead", column=name)
    return kind


def _shape(spec: Any, name: str) -> list[int]:
    dims = list(spec.shape) if spec.shape is not None else []
    if any(d is None or int(d) < 0 for d in dims):
        raise SchemaError(f"shape {dims} is not fully defined; a FixedLenFeature needs every dimension",
                          column=name)
    return [int(d) for d in dims]


def _dense_type(leaf: pa.DataType, dims: list[int], name: str) -> pa.DataType:
    if not dims:
        return leaf
    if len(dims) == 1:
        return pa.list_(leaf, dims[0])
    if leaf == pa.binary():
        raise SchemaError(f"a tf.string FixedLenFeature of shape {dims} has no Arrow tensor type; "
                          f"give it shape [{math.prod(dims)}] (a fixed-size list) and reshape", column=name)
    return pa.fixed_shape_tensor(leaf, dims)


def _default(spec: Any, leaf: pa.DataType, dims: list[int], name: str) -> list[Any] | None:
    """A FixedLenFeature's default as its flat values (bytes as hex), or None."""
    value = getattr(spec, "default_value", None)
    if value is None:
        return None
    flat = list(_flatten(value.tolist() if hasattr(value, "tolist") else value))
    if len(flat) != math.prod(dims):
        raise SchemaError(f"default_value has {len(flat)} values but shape {dims} holds {math.prod(dims)}; "
                          "TensorFlow does not broadcast a default", column=name)
    if leaf == pa.binary():
        return [(v.encode() if isinstance(v, str) else bytes(v)).hex() for v in flat]
    return [float(v) if leaf == pa.float32() else int(v) for v in flat]


def _flatten(value: Any):
    if isinstance(value, (list, tuple)):
        for v in value:
            yield from _flatten(v)
    else:
        yield value


def _context_field(name: str, spec: Any, record_type: RecordType) -> pa.Field:
    kind = _kind(spec, name)
    leaf = leaf_of(spec.dtype, name)
    if kind == "FixedLenFeature":
        dims = _shape(spec, name)
        default = _default(spec, leaf, dims, name)
        field = pa.field(name, _dense_type(leaf, dims, name), nullable=False)
        return field if default is None else _with_info(field, default=default)
    if kind == "VarLenFeature":  # a missing feature is a row with no values, as in TensorFlow's SparseTensor
        return _with_info(pa.field(name, pa.list_(leaf), nullable=False), default=[])
    if kind == "RaggedFeature":
        return _ragged_field(name, spec, leaf)
    if record_type != "SequenceExample":
        # parse_example takes one in an Example spec: a flat feature cut into steps, padded to the longest row.
        uniform = ", ".join(f"tf.io.RaggedFeature.UniformRowLength({d})" for d in _shape(spec, name))
        dtype = getattr(spec.dtype, "name", spec.dtype)
        raise SchemaError(f"a FixedLenSequenceFeature in an Example spec (parse_example pads it to the longest "
                          f"row) is not read here; tf.io.RaggedFeature(tf.{dtype}, partitions=[{uniform}]) "
                          "reads the same steps unpadded. For SequenceExample records pass the (context_features, "
                          "sequence_features) pair with record_type='SequenceExample'", column=name)
    raise SchemaError(f"a {kind} goes in sequence_features, the pair's second dict", column=name)


def _ragged_field(name: str, spec: Any, leaf: pa.DataType) -> pa.Field:
    partitions: list[list[Any]] = []
    for p in spec.partitions or ():
        how = _PARTITIONS.get(type(p).__name__)
        if how is None:
            raise SchemaError(f"RaggedFeature partition {type(p).__name__} is not supported here (RowSplits, "
                              "RowLengths and UniformRowLength are); convert it to RowSplits", column=name)
        if how == "uniform_row_length":
            if int(p.length) <= 0:
                raise SchemaError(f"UniformRowLength({p.length}) must be positive", column=name)
            partitions.append([how, int(p.length)])
        else:
            partitions.append([how, str(p.key)])
    t: pa.DataType = pa.list_(leaf)
    for _ in partitions:
        t = pa.list_(t)
    values = str(spec.value_key) if spec.value_key is not None else name
    return _with_info(pa.field(name, t, nullable=False), default=[], values=values, partitions=partitions)


def _sequence_field(name: str, spec: Any) -> pa.Field:
    kind = _kind(spec, name)
    leaf = leaf_of(spec.dtype, name)
    if kind == "VarLenFeature":
        return _with_info(pa.field(name, pa.list_(pa.list_(leaf)), nullable=False), default=[])
    if kind != "FixedLenSequenceFeature":
        raise SchemaError(f"a {kind} in sequence_features is not supported here (FixedLenSequenceFeature and "
                          "VarLenFeature are)", column=name)
    dims = _shape(spec, name)
    step = _dense_type(leaf, dims, name)
    field = pa.field(name, pa.list_(step), nullable=False)
    info: dict[str, Any] = {"step_size": math.prod(dims)}
    if spec.allow_missing:
        info["default"] = []
    return _with_info(field, **info)


def _tfmd_type(feature: Any) -> pa.DataType:
    if feature.type not in _TFMD_TYPES:
        raise SchemaError("TFMD type STRUCT (or an unset type) has no TFRecord feature; leave the feature out",
                          column=feature.name)
    return _TFMD_TYPES[feature.type]


def _from_tfmd(schema: Any) -> pa.Schema:
    """TFMD -> Arrow, as tfx_bsl's ``schema_as_feature_spec`` turns it into feature specs: a feature with
    a ``shape`` is a ``FixedLenFeature`` of that shape, others a ``VarLenFeature``."""
    for what in ("sparse_feature", "weighted_feature"):
        if len(getattr(schema, what, ())):
            raise SchemaError(f"a TFMD {what} assembles a tensor from several features, which has no Arrow "
                              "column; remove it and read its component features", column=getattr(schema, what)[0].name)
    fields = []
    for f in schema.feature:
        leaf = _tfmd_type(f)
        if f.HasField("shape"):
            dims = [int(d.size) for d in f.shape.dim]
            fields.append(pa.field(f.name, _dense_type(leaf, dims, f.name), nullable=False))
        else:
            fields.append(_with_info(pa.field(f.name, pa.list_(leaf), nullable=False), default=[]))
    return pa.schema(fields)


def leaf_dtype_name(t: pa.DataType) -> str:
    """The ``parse_example`` dtype name a column's leaf type is written as."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "int64"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "float32"
    return "string"

