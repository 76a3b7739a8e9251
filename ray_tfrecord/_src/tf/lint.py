"""Warnings, before training starts, about dataset columns Keras will refuse once it traces the model.

``warn_constant_length_lists`` runs on the driver in
``tensorflow_trainer`` and in
``tf_dataset`` when it is given a whole ``Dataset``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
from ray.data import Dataset

from ray_tfrecord._src.core.types import is_var_list, single_chunk
from ray_tfrecord._src.tf.tensors import arrow_schema, is_numeric

# Rows sampled by warn_constant_length_lists.
_SAMPLE_ROWS = 1024

# The pyarrow constructor of each numeric type whose name differs from str(type).
_CONSTRUCTORS = {pa.float16(): "float16", pa.float32(): "float32", pa.float64(): "float64", pa.bool_(): "bool_"}


def warn_constant_length_lists(ds: Dataset, columns: Sequence[str] | None = None) -> list[str]:
    """Warn about numeric ``list<T>`` columns whose sampled rows all hold the same count.

    Such a column (what ``read_tfrecords`` infers for a fixed-length TFRecord
    feature unless ``fixed_size_lists=True``) becomes a ``tf.RaggedTensor``,
    which Keras ``Dense`` and most layers refuse, only once Keras traces the
    model.  The warning comes before that and names the read option or type
    that gives a dense tensor instead.  Samples the first rows of ``ds``;
    returns the columns warned about.
    """
    schema = arrow_schema(ds.schema(fetch_if_missing=True))
    if schema is None:
        return []
    candidates = [
        f
        for f in schema
        if (columns is None or f.name in columns) and is_var_list(f.type) and is_numeric(f.type.value_type)
    ]
    if not candidates:
        return []
    # batch_format="pyarrow": Ray's annotation is every batch format's union.
    sample: pa.Table = ds.select_columns([f.name for f in candidates]).take_batch(_SAMPLE_ROWS, batch_format="pyarrow")
    warned: list[str] = []
    for field in candidates:
        column = single_chunk(sample.column(field.name))
        if len(column) < 2 or column.null_count:
            continue
        lengths = pc.list_value_length(column).to_numpy()
        if lengths[0] == 0 or not (lengths == lengths[0]).all():
            continue
        n = int(lengths[0])
        value = field.type.value_type
        warnings.warn(
            f"column {field.name!r} is {field.type} with {n} values in every sampled row; the feed makes it a "
            f"tf.RaggedTensor, which Keras Dense refuses. For a dense (batch, {n}) tensor, read with "
            f"read_tfrecords(..., fixed_size_lists=True) or give it the type "
            f"pa.list_(pa.{_CONSTRUCTORS.get(value, str(value))}(), {n}) in schema=",
            UserWarning,
            stacklevel=3,
        )
        warned.append(field.name)
    return warned
