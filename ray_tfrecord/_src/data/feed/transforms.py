"""A resumable feed's preprocessing, checked: one row out per row in, in order, weights kept.

The user's transform (a function, or a class whose instances Ray keeps on an actor pool) runs in
the feed's Ray Data execution through ``map_batches``.  Each batch it receives carries
``SEED_COLUMN`` (``uint64``, the row's seed, the same at every resume)
and ``WEIGHT_COLUMN``; it may add, replace or drop other columns.  The position of a resumed
epoch is arithmetic over rows, so a transform that changed the row count or order would shift every
later row: ``FunctionTransform`` and ``ClassTransform`` check each batch and raise
``TransformError`` instead.  Rows are dropped by weight: ``keep`` (a predicate over the
transform's output) sets the weight of the rows it rejects to 0, so every rank still runs the same
steps.  This module imports no TensorFlow: it runs in Ray Data's workers.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data.feed.order import SEED_COLUMN

WEIGHT_COLUMN = "__weight__"
"""The weight column of a [`ResumableFeed`][ray_tfrecord.tf.ResumableFeed]'s batches: 1 for the epoch's rows,
0 for padding and for rows ``keep`` rejects."""


@public("ray_tfrecord")
class TransformError(ValueError):
    """A resumable feed's transform broke the one-row-out-per-row-in contract."""


def describe(fn: Any) -> str | None:
    """A transform's or predicate's name as a checkpoint records it: ``module.qualname`` of the
    function or class (of the instance's class for a callable object)."""
    if fn is None:
        return None
    named = fn if isinstance(fn, (type, types.FunctionType, types.BuiltinFunctionType)) else type(fn)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', repr(named))}"


def _rows(batch: Any) -> int:
    if isinstance(batch, pa.Table):
        return batch.num_rows
    if isinstance(batch, Mapping):
        return len(next(iter(batch.values()))) if batch else 0
    return len(batch)  # a pandas DataFrame


def _column(batch: Any, name: str) -> np.ndarray | None:
    if isinstance(batch, pa.Table):
        return batch.column(name).to_numpy() if name in batch.column_names else None
    if name not in batch:
        return None
    values = batch[name]
    return np.asarray(values.to_numpy() if hasattr(values, "to_numpy") else values)


def _with_column(batch: Any, name: str, values: np.ndarray, arrow_type: pa.DataType) -> Any:
    if isinstance(batch, pa.Table):
        index = batch.column_names.index(name) if name in batch.column_names else -1
        field, array = pa.field(name, arrow_type), pa.array(values, arrow_type)
        return batch.set_column(index, field, array) if index >= 0 else batch.append_column(field, array)
    if isinstance(batch, Mapping):
        return {**batch, name: values}
    batch = batch.copy(deep=False)  # a pandas DataFrame
    batch[name] = values
    return batch


def _checked(name: str, keep: Callable[[Any], Any] | None, epoch: int, before: Any, after: Any) -> Any:
    if isinstance(after, types.GeneratorType):
        raise TransformError(f"the transform {name} yields batches; a ResumableFeed's transform returns one batch "
                             f"per batch, of the same rows in the same order: return it instead of yielding")
    seeds = _column(before, SEED_COLUMN)
    where = (f"epoch {epoch}, a batch of {_rows(before)} rows starting at the row of "
             f"{SEED_COLUMN}={int(seeds[0]) if seeds is not None and len(seeds) else None}")
    if _rows(after) != _rows(before):
        raise TransformError(
            f"the transform {name} returned {_rows(after)} rows for {where}; a ResumableFeed's transform returns one "
            f"row per row in, in order (resume positions count rows): drop rows with keep= (weight 0) instead")
    weights = _column(after, WEIGHT_COLUMN)
    if weights is None:
        raise TransformError(f"the transform {name} dropped the column {WEIGHT_COLUMN!r} ({where}); keep it as it "
                             f"came: it is the feed's sample weights (0 on padding rows)")
    out_seeds = _column(after, SEED_COLUMN)
    if out_seeds is None and seeds is not None:
        after = _with_column(after, SEED_COLUMN, seeds, pa.uint64())
    elif out_seeds is not None and seeds is not None and not np.array_equal(out_seeds, seeds):
        raise TransformError(f"the transform {name} reordered or changed rows ({SEED_COLUMN} differs, {where}); "
                             f"keep the rows in the order they came: resume positions count rows")
    if keep is not None:
        kept = np.asarray(keep(after), dtype=bool).reshape(-1)
        if kept.shape != (_rows(after),):
            raise TransformError(f"keep={describe(keep)} returned {kept.size} values for {where}; it returns one "
                                 f"bool per row of the batch")
        after = _with_column(after, WEIGHT_COLUMN, np.where(kept, weights, 0).astype(np.float32), pa.float32())
    return after


def _identity(batch: Any) -> Any:
    return batch


@dataclass(frozen=True)
class FunctionTransform:
    """A function transform (or none: ``fn=None`` applies ``keep`` alone), checked; Ray runs it in tasks."""

    fn: Callable[[Any], Any] | None
    keep: Callable[[Any], Any] | None
    epoch: int

    def __call__(self, batch: Any) -> Any:
        return _checked(describe(self.fn) or "", self.keep, self.epoch, batch, (self.fn or _identity)(batch))


class ClassTransform:
    """A callable-class transform, checked; Ray builds one per actor of the pool with
    ``fn_constructor_kwargs`` ``{"cls", "keep", "epoch", "args", "kwargs"}``."""

    def __init__(self, cls: type, keep: Callable[[Any], Any] | None, epoch: int, args: Sequence[Any],
                 kwargs: Mapping[str, Any]) -> None:
        self._fn = cls(*args, **kwargs)
        self._name, self._keep, self._epoch = describe(cls) or "", keep, epoch

    def __call__(self, batch: Any) -> Any:
        return _checked(self._name, self._keep, self._epoch, batch, self._fn(batch))
