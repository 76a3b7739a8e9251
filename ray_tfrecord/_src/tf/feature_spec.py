"""Arrow -> ``tf.io`` feature specs: what a plain ``tf.data`` reader passes to ``tf.io.parse_example`` for
a dataset this package wrote, or for any ``pyarrow.Schema`` (the inverse of ``schema=``'s translation)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias, cast

import numpy as np
import pyarrow as pa
import tensorflow as tf

from ray_tfrecord._src.core.feature_specs import SchemaLike
from ray_tfrecord._src.core.options import RecordType
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.core.spec_export import describe, schema_of
from ray_tfrecord._src.core.types import is_var_list

FeatureSpec: TypeAlias = (tf.io.FixedLenFeature | tf.io.VarLenFeature | tf.io.RaggedFeature
                          | tf.io.FixedLenSequenceFeature)
_PARTITIONS = {"row_splits": tf.io.RaggedFeature.RowSplits, "row_lengths": tf.io.RaggedFeature.RowLengths,
               "uniform_row_length": tf.io.RaggedFeature.UniformRowLength}


@public("ray_tfrecord.tf")
def feature_spec(
    source: SchemaLike,
    *,
    record_type: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, FeatureSpec] | tuple[dict[str, FeatureSpec], dict[str, FeatureSpec]]:
    """The ``tf.io`` feature specs that parse ``source``'s records as ``read_tfrecords`` reads them.

    ``source`` is a ``pyarrow.Schema``, the directory of a dataset ``write_tfrecords`` wrote (its
    recorded schema), or anything else ``schema=`` takes (a TFMD ``Schema`` or ``schema.pbtxt`` path
    gives the specs ``read_tfrecords(schema=)`` reads it with). A scalar or ``fixed_size_list`` column
    is a ``FixedLenFeature`` (a tensor extension type one of its shape), a ``list`` a ``RaggedFeature``
    with int64 row splits; a column read
    through a feature spec (``schema=`` a dict) gives that spec back, defaults and partitions included.
    A nullable dense column has no default unless ``defaults`` gives one, as ``parse_example`` refuses a
    record without it otherwise. For SequenceExample records (``record_type``, else what the dataset
    recorded) the result is the ``(context_features, sequence_features)`` pair for
    ``tf.io.parse_sequence_example``, ``list<list<T>>`` columns the sequence features.

    Raises [`SchemaError`][ray_tfrecord.SchemaError] naming a column with no feature spec (``list<null>``).

    >>> import pyarrow as pa
    >>> feature_spec(pa.schema([("label", pa.int64()), ("tokens", pa.list_(pa.int64()))]))["label"]
    FixedLenFeature(shape=[], dtype=tf.int64, default_value=None)
    """
    schema, kind = (source, record_type or "Example") if isinstance(source, pa.Schema) else \
        schema_of(source, cast(RecordType | None, record_type))
    defaults = dict(defaults or {})
    if kind == "SequenceExample":
        context: dict[str, FeatureSpec] = {}
        sequence: dict[str, FeatureSpec] = {}
        for f in schema:
            spec = field_spec(f, defaults.get(f.name), sequence=True)
            (sequence if isinstance(spec, tf.io.FixedLenSequenceFeature) or _is_nested(f.type) else context)[
                f.name] = spec
        return context, sequence
    return {f.name: field_spec(f, defaults.get(f.name), sequence=False) for f in schema}


def field_spec(f: pa.Field, default: Any = None, *, sequence: bool = False) -> FeatureSpec:
    """The feature spec of one column (``default`` for a dense one whose field carries none); the
    TensorFlow-native reader parses spec-derived columns with it."""
    d = describe(f, default, sequence=sequence)
    dtype = tf.dtypes.as_dtype(d.dtype)
    if d.kind == "RaggedFeature":
        partitions = tuple(_PARTITIONS[how](arg) for how, arg in d.partitions)
        return tf.io.RaggedFeature(dtype, value_key=d.value_key, partitions=partitions, row_splits_dtype=tf.int64)
    if d.kind == "FixedLenSequenceFeature":
        return tf.io.FixedLenSequenceFeature(list(d.shape), dtype, allow_missing=d.allow_missing)
    if d.kind == "VarLenFeature":
        return tf.io.VarLenFeature(dtype)
    shape = list(d.shape)
    if d.default is None:
        return tf.io.FixedLenFeature(shape, dtype)
    flat = np.asarray(d.default, dtype=object if dtype == tf.string else dtype.as_numpy_dtype).reshape(shape)
    return tf.io.FixedLenFeature(shape, dtype, default_value=flat.tolist() if shape else flat.item())


def _is_nested(t: pa.DataType) -> bool:
    return is_var_list(t) and is_var_list(t.value_type)
