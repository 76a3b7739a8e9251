"""``write_tfrecords(tf_schema=)`` with Ray's meaning: a TFMD ``Schema`` fixes each feature's kind.

Ray's ``Dataset.write_tfrecords(path, tf_schema=schema)`` writes each column as the ``int64_list``,
``float_list`` or ``bytes_list`` its feature's type (``INT``, ``FLOAT``, ``BYTES``) names, fails on a column
the schema lacks, and fails when a column's values are of another kind. Here the same schema is checked
against each block's Arrow schema before a byte is written: a column of the feature's kind is written as
it is; a column of another kind is refused (writing an ``int64`` column as floats would narrow it, a
string as integers reinterpret it), naming the column and the fix; an all-empty list column
(``list<null>``) takes the feature's type, so its records hold typed empty lists.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.core.feature_specs import ray_tf_schema

#: A feature's kind by the leaf type ``ray_tf_schema`` gives it.
_KINDS = {pa.int64(): "INT", pa.float32(): "FLOAT", pa.binary(): "BYTES"}


def feature_types(tf_schema: Any, record_type: str) -> tuple[tuple[str, pa.DataType], ...]:
    """Each feature of the TFMD ``tf_schema`` and the leaf type of its kind (``int64``, ``float32``,
    ``binary``), for a ``WriteConfig``. Raises ``TypeError`` for anything but a TFMD ``Schema``."""
    if record_type != "Example":
        raise ValueError(f"tf_schema= fixes the feature kinds of Example records, as Ray's write_tfrecords does; "
                         f"record_type={record_type!r} takes no tf_schema: leave it out, or write Example records")
    try:
        schema = ray_tf_schema(tf_schema)
    except TypeError:
        raise TypeError(f"tf_schema= takes a tensorflow_metadata Schema proto (as Ray's write_tfrecords does), not "
                        f"{type(tf_schema).__name__}; to write other types, cast the dataset's columns before "
                        "writing") from None
    return tuple((f.name, f.type.value_type) for f in schema)


def leaf_kind(t: pa.DataType, serialize_tensors: bool) -> str | None:
    """The kind (``INT``, ``FLOAT``, ``BYTES``) values of Arrow type ``t`` are written as; ``None`` for
    a type with no values yet (``null``, a list of ``null``)."""
    if isinstance(t, pa.BaseExtensionType):
        if serialize_tensors and _is_list(t.storage_type):
            return "BYTES"  # a tensor column, written as tf.io.serialize_tensor bytes
        t = t.storage_type
    while _is_list(t):
        t = t.value_type
    if pa.types.is_null(t):
        return None
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return "INT"
    if pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "FLOAT"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_string(t) or pa.types.is_large_string(t) \
            or pa.types.is_fixed_size_binary(t) or pa.types.is_binary_view(t) or pa.types.is_string_view(t):
        return "BYTES"
    return "other"


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def check(schema: pa.Schema, features: tuple[tuple[str, pa.DataType], ...], partition_cols: tuple[str, ...],
          serialize_tensors: bool) -> None:
    """Refuse record columns of ``schema`` that ``tf_schema`` (as ``features``) does not name, or names as
    another kind than the column's values are written as."""
    kinds = {name: _KINDS[leaf] for name, leaf in features}
    for f in schema:
        if f.name in partition_cols:
            continue  # in the directory names, not the records
        if f.name not in kinds:
            raise SchemaError(f"the column is not a feature of tf_schema (features: {sorted(kinds)}); add a feature "
                              "for it to tf_schema or drop the column before writing", column=f.name)
        have = leaf_kind(f.type, serialize_tensors)
        want = kinds[f.name]
        if have is None or have == want:
            continue
        if have == "other":
            continue  # check_encodable names what cannot be written at all
        hint = (" (a tensor column is written as BYTES only with serialize_tensors=True)"
                if want == "BYTES" and isinstance(f.type, pa.BaseExtensionType) else "")
        raise SchemaError(f"tf_schema gives the feature type {want}, but the column's values ({f.type}) are written "
                          f"as {have}; writing them as {want} would narrow or reinterpret them{hint}. Cast the column "
                          f"in the dataset to the type you mean, or set the feature's type in tf_schema to {have}",
                          column=f.name)


def empty_list_types(features: tuple[tuple[str, pa.DataType], ...]) -> dict[str, pa.DataType]:
    """The list type an all-empty list column (``list<null>``) takes from ``tf_schema``."""
    return {name: pa.list_(leaf) for name, leaf in features}
