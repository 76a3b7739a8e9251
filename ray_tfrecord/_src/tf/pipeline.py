"""The ``tf.data`` pipeline both feeds end in (``tf_dataset`` and ``ResumableFeed``): Arrow tables
become tensors as ``ray_tfrecord._src.tf.tensors`` plans them, with no Python work per row (dense
tensors for fixed-length columns, ``tf.RaggedTensor`` for variable-length lists), in elements of
``batch_size`` rows.

``from_generator`` has a fixed cost per element and per array, so several batches travel together
(``Batching.fetch_rows``) as few buffers (``_Packing``), and the graph slices them apart again.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import tensorflow as tf

from ray_tfrecord._src.core.types import single_chunk
from ray_tfrecord._src.tf.tensors import ColumnPlan, Tensor, as_tensor

# How much to pull from Ray per generator call (see Batching.fitting): up to this
# many rows, and about this many bytes. Variable-length columns are guessed at _VAR_BYTES.
_FETCH_ROWS = 4096
_FETCH_BYTES = 16 << 20
_VAR_BYTES = 64

# Row size from which a dense component is not worth copying into a shared buffer (see _Packing):
# one more array through from_generator costs about 36 us of CPU, copying 1 MiB (8,192 rows of 32
# float32s) 0.5 ms warm and twice that from Ray's object store, so from 32 bytes a row (a
# 4,096-row fetch: 128 KiB) a component travels alone.  At 256, a resumable feed's float32 weight
# dragged a 32-float column through a copy per fetch (make bench, resume section: 7% of a rank).
_ALONE_ROW_BYTES = 32


def _row_bytes(plan: ColumnPlan) -> int:
    """Bytes one row of ``plan``'s column takes: exact for dense numeric tensors, a guess otherwise."""
    if plan.ragged_rank or plan.dtype == tf.string:
        return _VAR_BYTES
    return int(np.prod(plan.inner_shape)) * plan.dtype.size


@dataclass(frozen=True)
class Batching:
    """Rows per element (``batch_size``) and per trip through ``from_generator`` (``fetch_rows``, a
    multiple of ``batch_size``): a feed's batching, built once and shared by the tables it reads and the
    pipeline that cuts them."""

    batch_size: int
    fetch_rows: int

    @classmethod
    def fitting(cls, plans: Iterable[ColumnPlan], batch_size: int, shuffle_buffer: int | None = None) -> Batching:
        """Fetches of about ``_FETCH_BYTES`` of the planned tensors, within Ray's local shuffle buffer,
        which cannot hand out more rows than it holds."""
        return cls.of_rows(batch_size, sum(_row_bytes(p) for p in plans), shuffle_buffer)

    @classmethod
    def of_rows(cls, batch_size: int, row_bytes: int, cap: int | None = None) -> Batching:
        """Fetches of about ``_FETCH_BYTES`` of rows of ``row_bytes`` each, at most ``cap`` rows (but one batch)."""
        rows = min(_FETCH_ROWS, _FETCH_BYTES // max(row_bytes, 1))
        if cap is not None:
            rows = min(rows, cap)
        return cls(batch_size, max(batch_size, rows - rows % batch_size))

    def batches_in(self, rows: int, *, drop_last: bool) -> int:
        """Batches a fetch of ``rows`` makes: the full ones, plus the tail if kept."""
        full, tail = divmod(rows, self.batch_size)
        return full + (1 if tail and not drop_last else 0)


class _Packing:
    """Carries a fetch's arrays through ``from_generator`` as few buffers.

    ``from_generator`` pays a fixed cost for every array it converts, which for
    a 25-column batch outweighs copying the data, so the narrow components
    (leaf values and row splits of every column) are concatenated per dtype on
    the Python side and split apart again inside the ``tf.data`` graph.  A wide
    dense component (an image's pixels) travels alone: copying it would cost
    more than the conversion it saves.
    """

    def __init__(self, plans: Mapping[str, ColumnPlan]) -> None:
        self.plans = plans
        components = [spec for plan in plans.values() for spec in plan.component_specs]
        self.inner_shapes = [shape for shape, _ in components]
        # Tagged keys: a DType compares equal to its enum number, so a bare index could join a dtype's group.
        groups = [
            ("alone", i) if int(np.prod(shape)) * dtype.size >= _ALONE_ROW_BYTES else ("dtype", dtype)
            for i, (shape, dtype) in enumerate(components)
        ]
        keys = list(dict.fromkeys(groups))
        self.members = [[i for i, g in enumerate(groups) if g == key] for key in keys]
        self.dtypes = [components[m[0]][1] for m in self.members]

    def signature(self) -> tuple[tf.TensorSpec, ...]:
        buffers = tuple(tf.TensorSpec((None,), d) for d in self.dtypes)
        return (*buffers, tf.TensorSpec((len(self.inner_shapes),), tf.int64))

    def pack(self, table: pa.Table) -> tuple[np.ndarray, ...]:
        components: list[np.ndarray] = []
        for name, plan in self.plans.items():
            values, splits = plan.convert(single_chunk(table.column(name)))
            components.append(values)
            components.extend(splits)
        lengths = np.fromiter((c.size for c in components), np.int64, len(components))
        buffers = []
        for members in self.members:
            flat = [components[i].reshape(-1) for i in members]
            buffers.append(flat[0] if len(flat) == 1 else np.concatenate(flat))
        return (*buffers, lengths)

    @tf.autograph.experimental.do_not_convert
    def unpack(self, *tensors: tf.Tensor) -> dict[str, Tensor]:
        *buffers, lengths = tensors
        components: list[tf.Tensor] = [None] * len(self.inner_shapes)  # type: ignore[list-item]
        for buffer, members in zip(buffers, self.members, strict=True):
            pieces = [buffer] if len(members) == 1 else tf.split(buffer, tf.gather(lengths, members), num=len(members))
            for i, piece in zip(members, pieces, strict=True):
                components[i] = tf.reshape(piece, (-1, *self.inner_shapes[i]))
        out, i = {}, 0
        for name, plan in self.plans.items():
            out[name] = as_tensor(components[i], components[i + 1 : i + 1 + plan.ragged_rank])
            i += 1 + plan.ragged_rank
        return out


@tf.autograph.experimental.do_not_convert
def _split_batches(tensors: dict[str, Tensor], batch_size: int) -> tf.data.Dataset:
    """A fetch's tensors as a dataset of ``batch_size``-row slices."""
    first = next(iter(tensors.values()))
    rows = first.nrows() if isinstance(first, tf.RaggedTensor) else tf.shape(first, out_type=tf.int64)[0]
    starts = tf.data.Dataset.range(0, rows, batch_size)
    return starts.map(lambda s: {n: t[s : s + batch_size] for n, t in tensors.items()})


@tf.autograph.experimental.do_not_convert
def _model_inputs(
    tensors: dict[str, Tensor], feature_columns: str | Sequence[str], label_columns: str | Sequence[str] | None,
    weight_column: str | None,
) -> Any:
    """``features``, ``(features, label)`` or ``(features, label, weight)``, each one tensor (one name)
    or a dict."""
    x = _pick(tensors, feature_columns)
    if label_columns is None:
        return x
    y = _pick(tensors, label_columns)
    return (x, y) if weight_column is None else (x, y, tensors[weight_column])


def _pick(tensors: dict[str, Tensor], columns: str | Sequence[str]) -> Tensor | dict[str, Tensor]:
    return tensors[columns] if isinstance(columns, str) else {n: tensors[n] for n in columns}


def _options() -> tf.data.Options:
    options = tf.data.Options()
    # Ray already gave this worker its own shard; TF must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # With autotuning on, an epoch's end often waits for the autotuner's next wake-up, whose
    # period doubles from 10 ms (epochs of 2.56 s or 5.12 s exactly, in Ray Train and alone); the
    # AUTOTUNE knobs then take TensorFlow's static defaults, at the same throughput.
    options.autotune.enabled = False
    return options


def table_batches(
    tables: Callable[[], Iterable[pa.Table]],
    plans: Mapping[str, ColumnPlan],
    batching: Batching,
    *,
    feature_columns: str | Sequence[str],
    label_columns: str | Sequence[str] | None,
    weight_column: str | None = None,
    tf_prefetch: int = tf.data.AUTOTUNE,
    cache: bool = False,
    steps: int | None = None,
) -> tf.data.Dataset:
    """The ``tf.data`` pipeline of every feed: ``tables()`` gives one epoch of Arrow tables per call, each
    a whole number of ``batching.batch_size``-row batches and at most ``batching.fetch_rows`` rows; their
    columns become tensors as ``plans`` say, in elements of ``batch_size`` rows: ``features``,
    ``(features, label)``, or with ``weight_column`` ``(features, label, weight)``, Keras's sample
    weights."""
    packing = _Packing(plans)
    dataset = tf.data.Dataset.from_generator(lambda: map(packing.pack, tables()), output_signature=packing.signature())
    dataset = dataset.map(packing.unpack, num_parallel_calls=tf.data.AUTOTUNE)
    if batching.fetch_rows > batching.batch_size:
        dataset = dataset.flat_map(functools.partial(_split_batches, batch_size=batching.batch_size))
    dataset = dataset.map(functools.partial(_model_inputs, feature_columns=feature_columns,
                                            label_columns=label_columns, weight_column=weight_column))
    if steps is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
    if cache:
        dataset = dataset.cache()
    return dataset.prefetch(tf_prefetch).with_options(_options())
