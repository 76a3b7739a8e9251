"""Arrow -> ``tf.io`` feature specs: what a plain ``tf.data`` reader passes to ``tf.io.parse_example`` for
a dataset this package wrote, or for any ``pyarrow.Schema`` (the inverse of ``schema=``'s translation)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import tensorflow as tf

from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.core.feature_specs import feature_info, leaf_dtype_name
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.core.schema import read_stored_schema
from ray_tfrecord._src.core.types import is_var_list, leaf_type

FeatureSpec: TypeAlias = (tf.io.FixedLenFeature | tf.io.VarLenFeature | tf.io.RaggedFeature
                          | tf.io.FixedLenSequenceFeature)
_PARTITIONS = {"row_splits": tf.io.RaggedFeature.RowSplits, "row_lengths": tf.io.RaggedFeature.RowLengths,
               "uniform_row_length": tf.io.RaggedFeature.UniformRowLength}


@public("ray_tfrecord.tf")
def feature_spec(
    source: pa.Schema | str | os.PathLike[str],
    *,
    record_type: str | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> dict[str, FeatureSpec] | tuple[dict[str, FeatureSpec], dict[str, FeatureSpec]]:
    """The ``tf.io`` feature specs that parse ``source``'s records as ``read_tfrecords`` reads them.

    ``source`` is a ``pyarrow.Schema`` or the directory of a dataset ``write_tfrecords`` wrote (its
    recorded schema). A scalar or ``fixed_size_list`` column is a ``FixedLenFeature`` (a tensor
    extension type one of its shape), a ``list`` a ``RaggedFeature`` with int64 row splits; a column read
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
    if isinstance(source, pa.Schema):
        schema = source
    else:
        path = os.fspath(source)
        fs, root = pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), os.path.abspath(path))
        stored = read_stored_schema(fs, root)
        if stored is None:
            raise SchemaError("no schema is recorded here (write_tfrecords records one); pass a pyarrow.Schema",
                              path=path)
        schema = stored
        if record_type is None and stored.metadata:
            record_type = stored.metadata.get(b"ray_tfrecord.record_type", b"Example").decode()
    defaults = dict(defaults or {})
    if record_type == "SequenceExample":
        context: dict[str, FeatureSpec] = {}
        sequence: dict[str, FeatureSpec] = {}
        for f in schema:
            t = _storage(f.type)
            info = feature_info(f)
            steps = info is not None and "step_size" in info
            (sequence if steps or (is_var_list(t) and is_var_list(t.value_type)) else context)[f.name] = \
                field_spec(f, defaults.get(f.name), sequence=True)
        return context, sequence
    return {f.name: field_spec(f, defaults.get(f.name), sequence=False) for f in schema}


def _storage(t: pa.DataType) -> pa.DataType:
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else t


def _dtype(f: pa.Field) -> tf.DType:
    leaf = leaf_type(_storage(f.type))
    if pa.types.is_null(leaf):
        raise SchemaError("a list<null> column holds no values of any kind and has no feature spec; leave it out",
                          column=f.name)
    return tf.dtypes.as_dtype(leaf_dtype_name(leaf))


def field_spec(f: pa.Field, default: Any = None, *, sequence: bool = False) -> FeatureSpec:
    """The feature spec of one column (``default`` for a dense one whose field carries none); the
    TensorFlow-native reader parses spec-derived columns with it."""
    dtype = _dtype(f)
    info = feature_info(f) or {}
    if "values" in info:
        partitions = [_PARTITIONS[how](arg) for how, arg in info["partitions"]]
        return tf.io.RaggedFeature(dtype, value_key=info["values"], partitions=partitions, row_splits_dtype=tf.int64)
    t = _storage(f.type)
    if "step_size" in info:
        step = t.value_type
        shape = _dense_shape(step, _storage(step), f.name)
        return tf.io.FixedLenSequenceFeature(shape, dtype, allow_missing="default" in info)
    if is_var_list(t):
        if sequence and is_var_list(t.value_type):
            return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
        if info.get("default") == [] and not sequence:
            return tf.io.VarLenFeature(dtype)
        return tf.io.RaggedFeature(dtype, row_splits_dtype=tf.int64)
    shape = _dense_shape(f.type, t, f.name)
    if "default" in info:
        value = info["default"]
        default = [bytes.fromhex(v) for v in value] if dtype == tf.string else value
    if default is None:
        return tf.io.FixedLenFeature(shape, dtype)
    flat = np.asarray(default, dtype=object if dtype == tf.string else dtype.as_numpy_dtype).reshape(shape)
    return tf.io.FixedLenFeature(shape, dtype, default_value=flat.tolist() if shape else flat.item())


def _dense_shape(t: pa.DataType, storage: pa.DataType, name: str) -> list[int]:
    shape = getattr(t, "shape", None)
    if shape is not None:
        return [int(d) for d in shape]
    if pa.types.is_fixed_size_list(storage):
        if not (pa.types.is_fixed_size_list(storage.value_type) or is_var_list(storage.value_type)):
            return [storage.list_size]
    elif not is_var_list(storage):
        return []
    raise SchemaError(f"type {t} has no feature spec (a scalar, fixed-size list, tensor or list column has)",
                      column=name)

