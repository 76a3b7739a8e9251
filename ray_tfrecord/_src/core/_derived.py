"""Columns a TensorFlow feature spec derives from the decoded features, as ``parse_example`` does:
a default where the feature is missing, a ``RaggedFeature``'s rows split by its partition features, a
``FixedLenSequenceFeature``'s steps of a fixed size. ``feature_specs`` puts each in the field's
metadata; the decoder decodes the source features (``Plan.source``) and ``Plan.apply`` builds the
read schema's columns from them, each failure a ``DecodeError`` naming the file, record and column.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from .errors import DecodeError, SchemaError
from .feature_specs import feature_info
from .framing import RecordChunk
from .types import leaf_type


@dataclass(frozen=True)
class _Column:
    field: pa.Field
    info: dict[str, Any] | None
    default: pa.Array | None  # one row


@dataclass(frozen=True)
class Plan:
    """How to build ``schema``'s columns from a batch of ``source``'s."""

    schema: pa.Schema
    source: pa.Schema
    columns: tuple[_Column, ...]

    def apply(self, batch: pa.RecordBatch, chunk: RecordChunk) -> pa.RecordBatch:
        arrays = [_build(c, batch, chunk) for c in self.columns]
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


def plan(schema: pa.Schema) -> Plan | None:
    """The plan for ``schema``, or None when no field carries a feature spec's extras."""
    infos = [feature_info(f) for f in schema]
    if not any(infos):
        return None
    source: dict[str, pa.Field] = {}

    def need(f: pa.Field, owner: str) -> None:
        held = source.setdefault(f.name, f)
        if held.type != f.type:
            raise SchemaError(f"feature {f.name!r} is read as {held.type} and as {f.type}; give one type",
                              column=owner)

    columns = []
    for f, info in zip(schema, infos):
        leaf = leaf_type(f.type.storage_type if isinstance(f.type, pa.BaseExtensionType) else f.type)
        if info is None:
            need(f, f.name)
        elif "values" in info:
            need(pa.field(info["values"], pa.list_(leaf)), f.name)
            for how, key in info["partitions"]:
                if how != "uniform_row_length":
                    need(pa.field(key, pa.list_(pa.int64())), f.name)
        elif "step_size" in info:
            need(pa.field(f.name, pa.list_(pa.list_(leaf))), f.name)
        else:
            need(pa.field(f.name, f.type), f.name)
        default = None
        if info is not None and "default" in info:
            default = _default_row(f.type, leaf, info["default"])
        columns.append(_Column(f, info, default))
    return Plan(schema, pa.schema(list(source.values())), tuple(columns))


def _default_row(t: pa.DataType, leaf: pa.DataType, values: list[Any]) -> pa.Array:
    if pa.types.is_binary(leaf):
        values = [bytes.fromhex(v) for v in values]
    if isinstance(t, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(t, pa.array([values], t.storage_type))
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t):
        return pa.array([values], t)
    return pa.array(values, t)


def _build(c: _Column, batch: pa.RecordBatch, chunk: RecordChunk) -> pa.Array:
    name, info = c.field.name, c.info
    if info is None:
        return batch.column(name)
    if "values" in info:
        arr = _ragged(batch, info, chunk, name)
    elif "step_size" in info:
        arr = _steps(batch.column(name), c.field.type, info["step_size"], chunk, name)
    else:
        arr = batch.column(name)
    if c.default is not None and arr.null_count:
        # A missing feature takes the default, as parse_example fills it; the rest are taken as they are.
        rows = np.arange(len(arr))
        rows[np.asarray(arr.is_null())] = len(arr)
        arr = pa.concat_arrays([arr, c.default.cast(arr.type)]).take(pa.array(rows))
    return arr


def _offsets(arr: pa.Array) -> np.ndarray:
    """A list array's offsets as int64, relative to its first value."""
    offsets = np.asarray(arr.offsets, np.int64)
    return offsets - offsets[0]


def _steps(arr: pa.ListArray, t: pa.ListType, size: int, chunk: RecordChunk, name: str) -> pa.Array:
    """``list<list<T>>`` feature lists as steps of exactly ``size`` values (``t``: the list of steps)."""
    inner = arr.flatten()
    counts = np.diff(_offsets(inner))
    bad = np.flatnonzero(counts != size)
    if len(bad):
        row = int(np.searchsorted(_offsets(arr), bad[0], "right")) - 1
        raise DecodeError(f"step {bad[0] - _offsets(arr)[row]} holds {counts[bad[0]]} values but the "
                          f"FixedLenSequenceFeature's shape holds {size}", path=chunk.path,
                          offset=chunk.offset(row), column=name)
    values = inner.flatten()
    step_type = t.value_type
    if isinstance(step_type, pa.BaseExtensionType):
        steps: pa.Array = pa.ExtensionArray.from_storage(
            step_type, pa.FixedSizeListArray.from_arrays(values, size))
    elif pa.types.is_fixed_size_list(step_type):
        steps = pa.FixedSizeListArray.from_arrays(values, size)
    else:
        steps = values
    return pa.ListArray.from_arrays(pa.array(_offsets(arr).astype(np.int32)), steps, mask=arr.is_null())


def _ragged(batch: pa.RecordBatch, info: dict[str, Any], chunk: RecordChunk, name: str) -> pa.Array:
    """A RaggedFeature's rows: its values feature split by each partition, innermost first."""
    values = batch.column(info["values"])
    items: pa.Array = values.flatten()
    rows = _offsets(values)  # each row's items (values, then the groups of the partition inside)
    for how, key in reversed(info["partitions"]):
        counts = np.diff(rows)
        if how == "uniform_row_length":
            bad = np.flatnonzero(counts % key)
            _refuse(bad, counts, chunk, name, f"{{count}} values do not split into rows of {key}")
            groups = np.arange(0, rows[-1] + 1, key, dtype=np.int64)
            per_row = counts // key
        else:
            part = batch.column(key)
            flat = np.asarray(part.flatten().fill_null(0), np.int64)
            bounds = _offsets(part)
            lengths = np.diff(bounds)
            if how == "row_splits":
                groups, per_row = _from_splits(flat, bounds, lengths, counts, rows, chunk, name, key)
            else:
                bad = np.flatnonzero(np.add.reduceat(np.append(flat, 0), bounds[:-1]) * (lengths > 0) != counts)
                neg = np.flatnonzero(flat < 0)
                if len(neg):
                    bad = np.union1d(bad, [int(np.searchsorted(bounds, neg[0], "right")) - 1])
                _refuse(bad, counts, chunk, name, f"row_lengths feature {key!r} does not add up to the row's "
                                                  "{count} values")
                groups = np.concatenate([[0], np.cumsum(flat)])
                per_row = lengths
        items = pa.ListArray.from_arrays(pa.array(groups.astype(np.int32)), items)
        rows = np.concatenate([[0], np.cumsum(per_row)])
    return pa.ListArray.from_arrays(pa.array(rows.astype(np.int32)), items)


def _from_splits(flat: np.ndarray, bounds: np.ndarray, lengths: np.ndarray, counts: np.ndarray, rows: np.ndarray,
                 chunk: RecordChunk, name: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    """Group offsets and groups per row from each row's row splits (empty: no groups, so no values)."""
    has = lengths > 0
    first = np.where(has, flat[np.minimum(bounds[:-1], max(len(flat) - 1, 0))] if len(flat) else 0, 0)
    last = np.where(has, flat[np.maximum(bounds[1:] - 1, 0)] if len(flat) else 0, 0)
    steps = np.diff(flat)
    inside = np.ones(len(steps), bool)
    starts = bounds[1:-1]
    inside[starts[(starts > 0) & (starts <= len(steps))] - 1] = False  # a step across two rows' splits
    falling = np.flatnonzero((steps < 0) & inside)
    bad = np.flatnonzero((first != 0) | (last != counts))
    if len(falling):
        bad = np.union1d(bad, [int(np.searchsorted(bounds, falling[0], "right")) - 1])
    _refuse(bad, counts, chunk, name, f"row_splits feature {key!r} must start at 0, never decrease and end at "
                                      "the row's {count} values")
    keep = np.ones(len(flat), bool)
    keep[bounds[:-1][has]] = False  # each row's leading 0
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    groups = np.concatenate([[0], (flat + rows[:-1][row_of])[keep]])
    return groups, np.maximum(lengths - 1, 0)


def _refuse(bad: np.ndarray, counts: np.ndarray, chunk: RecordChunk, name: str, template: str) -> None:
    """A ``DecodeError`` for the first row in ``bad``, ``template``'s ``{count}`` its values."""
    if len(bad):
        row = int(bad[0])
        raise DecodeError(f"{template.format(count=counts[row])}; tf.io.RaggedFeature(validate=True) refuses it too",
                          path=chunk.path, offset=chunk.offset(row), column=name)
