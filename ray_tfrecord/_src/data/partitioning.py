"""Hive partitioning: directory names for partition values, and typed values back from paths.

The writer puts rows in ``<col>=<value>/`` directories; the reader parses those segments and
types each partition column from all the values it saw: a key whose every value is an integer
is ``int64``, then ``float64``, then ``bool`` (``true``/``false``), else ``string``. Nulls are
spelled ``__HIVE_DEFAULT_PARTITION__``, as Hive and Spark do. Values are URL-quoted, so any
string survives the trip::

    >>> import pyarrow as pa
    >>> from ray_tfrecord._src.data.partitioning import hive_directory, parse_partitions
    >>> hive_directory({"year": 2021, "city": "São Paulo/Centro", "code": None})
    'year=2021/city=S%C3%A3o%20Paulo%2FCentro/code=__HIVE_DEFAULT_PARTITION__'
    >>> path = "/d/year=2021/city=S%C3%A3o%20Paulo%2FCentro/code=__HIVE_DEFAULT_PARTITION__/f"
    >>> schema, values = parse_partitions([path])
    >>> values
    [(('year', 2021), ('city', 'São Paulo/Centro'), ('code', None))]
    >>> schema.field("year").type
    DataType(int64)
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from ray.data.datasource import Partitioning, PartitionStyle, PathPartitionParser

from ray_tfrecord._src.core.layout import HIVE_NULL_PARTITION
from ray_tfrecord._src.data import compat

# One file's partition values, ``((column, typed value), ...)`` in column order: a tuple, so
# that it is hashable and cheap to pickle into every read task.
PartitionValues = tuple[tuple[str, Any], ...]

_ARROW_TYPES = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string()}
_INT_RE = re.compile(r"-?(0|[1-9][0-9]*)")
_FLOAT_RE = re.compile(r"-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
_PARSE: dict[pa.DataType, Callable[[str], Any]] = {
    pa.int64(): int, pa.float64(): float, pa.bool_(): lambda v: v == "true", pa.string(): str,
}


# -- encode -----------------------------------------------------------------------


def hive_directory(values: Mapping[str, Any]) -> str:
    """The ``col=value/...`` directory holding rows with these partition values."""
    return "/".join(f"{name}={_encode_value(value)}" for name, value in values.items())


def _encode_value(value: Any) -> str:
    if value is None:
        return HIVE_NULL_PARTITION
    if isinstance(value, bool):
        return "true" if value else "false"
    return urllib.parse.quote(str(value), safe="")


def split_by_partitions(table: pa.Table, cols: Sequence[str]) -> Iterator[tuple[str, pa.Table]]:
    """Yield ``(hive directory, rows without the partition columns)`` per distinct
    partition value, keeping row order within a partition."""
    if not cols:
        yield "", table
        return
    if table.num_rows == 0:
        return
    # A stable sort groups each partition's rows into one run.
    table = table.take(pc.sort_indices(table, [(c, "ascending") for c in cols]))
    change = np.zeros(table.num_rows, dtype=bool)
    change[0] = True
    for c in cols:
        col = table.column(c).combine_chunks()
        if pa.types.is_null(col.type):
            continue  # all null: one partition
        after, before = col.slice(1), col.slice(0, len(col) - 1)
        differs = pc.or_(
            pc.fill_null(pc.not_equal(after, before), False),
            pc.not_equal(pc.is_null(after), pc.is_null(before)),
        )
        change[1:] |= differs.to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(change).tolist() + [table.num_rows]
    data = table.drop_columns(list(cols))
    keys = table.select(list(cols))
    for a, b in zip(starts, starts[1:]):
        yield hive_directory(keys.slice(a, 1).to_pylist()[0]), data.slice(a, b - a)


# -- decode -----------------------------------------------------------------------


def parse_partitions(
    paths: Sequence[str], partitioning: Partitioning | None = Partitioning(PartitionStyle.HIVE)
) -> tuple[pa.Schema, list[PartitionValues]]:
    """Parse the partition values of every path and type them.

    Returns the partition columns' schema (in first-seen order) and, per path, its typed
    values (``None`` for a null or absent value). ``partitioning.field_types`` overrides the
    typing of the columns it names; ``partitioning=None`` means no partition columns.
    """
    if partitioning is None:
        return pa.schema([]), [()] * len(paths)
    parser = PathPartitionParser(partitioning)
    raw: list[dict[str, Any]] = [parser(p) for p in paths]
    if partitioning.style == PartitionStyle.HIVE and not compat.HIVE_PARSER_DECODES:
        raw = [{k: urllib.parse.unquote(v) if isinstance(v, str) else v for k, v in d.items()} for d in raw]
    names = list(dict.fromkeys(k for d in raw for k in d))
    explicit = partitioning.field_types or {}
    types = {
        # The parser has already cast explicitly typed values.
        name: _ARROW_TYPES.get(explicit[name], pa.string()) if name in explicit
        else _infer_type([d[name] for d in raw if d.get(name) not in (None, HIVE_NULL_PARTITION)])
        for name in names
    }

    def typed(name: str, value: Any) -> Any:
        if value is None or value == HIVE_NULL_PARTITION:
            return None
        if name in explicit:
            return value
        return _PARSE[types[name]](value)

    schema = pa.schema([pa.field(n, types[n]) for n in names])
    return schema, [tuple((n, typed(n, d.get(n))) for n in names) for d in raw]


def _infer_type(values: list[str]) -> pa.DataType:
    # Only exact round-trips count as integers, so "007" (a code, not a number)
    # stays a string.
    if values and all(_INT_RE.fullmatch(v) and -(2**63) <= int(v) < 2**63 for v in values):
        return pa.int64()
    if values and all(_FLOAT_RE.fullmatch(v) for v in values):
        return pa.float64()
    if values and all(v in ("true", "false") for v in values):
        return pa.bool_()
    return pa.string()

