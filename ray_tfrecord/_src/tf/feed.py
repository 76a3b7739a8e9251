"""Stream Ray Data batches into TensorFlow as a ``tf.data.Dataset``: :func:`tf_dataset`.

Each Arrow batch Ray Data hands out becomes tensors as :mod:`ray_tfrecord._src.tf.tensors` plans
them, with no Python work per row: dense tensors for fixed-length columns, ``tf.RaggedTensor``
for variable-length lists.  Only full batches are produced by default, so every rank of a Ray
Train run takes the same number of steps; :mod:`ray_tfrecord._src.tf.distribution` explains the
policy, the batch size under ``MultiWorkerMirroredStrategy`` and the per-replica batches of
``strategy=``.

Example::

    import pyarrow as pa
    import ray
    from ray_tfrecord._src.tf.feed import tf_dataset

    ds = ray.data.from_arrow(pa.table({
        "pixels": pa.FixedSizeListArray.from_arrays(
            pa.array(range(4 * 6), pa.float32()), 6),
        "tokens": pa.array([[1], [2, 3], [], [4, 5, 6]], pa.list_(pa.int64())),
        "label": pa.array([0, 1, 0, 1]),
    }))
    feed = tf_dataset(ds, feature_columns=["pixels", "tokens"], label_columns="label",
                      batch_size=2)
    for features, label in feed:
        print(features["pixels"].shape, features["tokens"].row_splits, label)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import pyarrow as pa
import tensorflow as tf
from ray.data import DataIterator, Dataset

from ray_tfrecord._src.core.codec import BYTE_ARRAY_SCHEMA, decode_records
from ray_tfrecord._src.core.types import single_chunk
from ray_tfrecord._src.io import progress
from ray_tfrecord._src.tf import renames
from ray_tfrecord._src.tf.distribution import PerReplica, check_partial_batches
from ray_tfrecord._src.tf.lint import warn_constant_length_lists
from ray_tfrecord._src.tf.tensors import ColumnPlan, Tensor, arrow_schema, as_tensor, column_plans

__all__ = ["table_batches", "tf_dataset"]

# How much to pull from Ray per generator call (see _Batching.fitting): up to this
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

# tf_dataset's names before 0.2 -> (place, Ray to_tf's name for the same argument, its default).
_RENAMED: renames.Table = {**renames.COLUMNS, "drop_remainder": (2, "drop_last", True),
                           "ray_prefetch_batches": (3, "prefetch_batches", 2)}


def _row_bytes(plan: ColumnPlan) -> int:
    """Bytes one row of ``plan``'s column takes: exact for dense numeric tensors, a guess otherwise."""
    if plan.ragged_rank or plan.dtype == tf.string:
        return _VAR_BYTES
    return int(np.prod(plan.inner_shape)) * plan.dtype.size


@dataclass(frozen=True)
class _Batching:
    """Rows per element (``batch_size``) and per trip through ``from_generator``.

    ``from_generator`` has a fixed cost per element, so several batches travel
    together (``fetch_rows``, a multiple of ``batch_size``) and the graph slices
    them apart again.
    """

    batch_size: int
    fetch_rows: int

    @classmethod
    def fitting(cls, plans: Iterable[ColumnPlan], batch_size: int, shuffle_buffer: int | None) -> _Batching:
        """Fetches of about ``_FETCH_BYTES``, within Ray's local shuffle buffer, which
        cannot hand out more rows than it holds."""
        rows = min(_FETCH_ROWS, _FETCH_BYTES // max(sum(_row_bytes(p) for p in plans), 1))
        if shuffle_buffer is not None:
            rows = min(rows, shuffle_buffer)
        return cls(batch_size, max(batch_size, rows - rows % batch_size))

    def batches_in(self, rows: int, *, drop_remainder: bool) -> int:
        """Batches a fetch of ``rows`` makes: the full ones, plus the tail if kept."""
        full, tail = divmod(rows, self.batch_size)
        return full + (1 if tail and not drop_remainder else 0)


@dataclass(frozen=True)
class _Fetches:
    """One epoch of Arrow tables from Ray per iteration, each cut to whole batches."""

    iterator: DataIterator
    batching: _Batching
    drop_remainder: bool
    steps_per_epoch: int | None
    iter_options: Mapping[str, Any]

    def __iter__(self) -> Iterator[pa.Table]:
        # batch_format="pyarrow": Ray's annotation is every batch format's union.
        stream: Iterator[pa.Table] = iter(
            self.iterator.iter_batches(
                batch_size=self.batching.fetch_rows, batch_format="pyarrow", drop_last=False, **self.iter_options
            )
        )
        produced = 0
        try:
            for table in stream:
                # Only the last fetch of an epoch can be short.
                count = self.batching.batches_in(table.num_rows, drop_remainder=self.drop_remainder)
                if self.steps_per_epoch is not None:
                    count = min(count, self.steps_per_epoch - produced)
                if count == 0:
                    break
                produced += count
                yield table.slice(0, count * self.batching.batch_size)
                if produced == self.steps_per_epoch:
                    break
        finally:
            # Stops Ray's prefetching threads when TensorFlow abandons the epoch early.
            close = getattr(stream, "close", None)
            if close is not None:
                close()
        if self.steps_per_epoch is not None and produced < self.steps_per_epoch:
            raise RuntimeError(
                f"this shard gave only {produced} full batches of {self.batching.batch_size} rows "
                f"but steps_per_epoch={self.steps_per_epoch}; failing instead of leaving "
                "the other ranks waiting in a collective"
            )


@dataclass(frozen=True)
class _Decoding:
    """Decodes a fetch of serialized ``Example`` records (``record_type="ByteArray"``) in this
    process, with :func:`~ray_tfrecord._src.core.codec.decode_records`: the native decoder runs here, with
    the GIL released, into the Arrow buffers the tensors are made from."""

    schema: pa.Schema

    def __call__(self, table: pa.Table) -> pa.Table:
        return pa.Table.from_batches([decode_records(table, self.schema)])


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
    tensors: dict[str, Tensor], features: str | Sequence[str], label: str | Sequence[str] | None, weight: str | None
) -> Any:
    """``features``, ``(features, label)`` or ``(features, label, weight)``, each one tensor (one name)
    or a dict."""
    x = _pick(tensors, features)
    if label is None:
        return x
    y = _pick(tensors, label)
    return (x, y) if weight is None else (x, y, tensors[weight])


def _pick(tensors: dict[str, Tensor], columns: str | Sequence[str]) -> Tensor | dict[str, Tensor]:
    return tensors[columns] if isinstance(columns, str) else {n: tensors[n] for n in columns}


def _names(columns: str | Sequence[str] | None) -> list[str]:
    if columns is None:
        return []
    return [columns] if isinstance(columns, str) else list(columns)


def _check_serialized(source: DataIterator) -> None:
    """Refuse ``record_schema=`` unless ``source`` holds what ``record_type="ByteArray"`` reads."""
    schema = arrow_schema(source.schema())
    column = BYTE_ARRAY_SCHEMA.names[0]
    if schema is None or column not in schema.names or not (
        pa.types.is_binary(schema.field(column).type) or pa.types.is_large_binary(schema.field(column).type)
    ):
        raise ValueError(
            f"record_schema= decodes serialized records, but the dataset's schema is {schema}; read it with "
            f"read_tfrecords(..., record_type='ByteArray') (one binary column {column!r}), or drop record_schema="
        )


def _plans(
    source: DataIterator, columns: list[str], defaults: Mapping[str, Any] | None, record_schema: pa.Schema | None
) -> tuple[dict[str, ColumnPlan], _Decoding | None]:
    """A plan per distinct column, in order, and with ``record_schema`` the decoding of the
    serialized records it plans from; raises if a column is missing or unsupported."""
    if record_schema is None:
        schema = arrow_schema(source.schema())
        if schema is None:
            raise ValueError("the dataset is empty or its schema is unknown")
        return column_plans(schema, columns, defaults), None
    _check_serialized(source)
    plans = column_plans(record_schema, columns, defaults)
    return plans, _Decoding(pa.schema([record_schema.field(c) for c in plans]))


def _options() -> tf.data.Options:
    options = tf.data.Options()
    # Ray already gave this worker its own shard; TF must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    # With autotuning on, an epoch's end often waits for the autotuner's next wake-up, whose
    # period doubles from 10 ms (epochs of 2.56 s or 5.12 s exactly, in Ray Train and alone); the
    # AUTOTUNE knobs then take TensorFlow's static defaults, at the same throughput.
    options.autotune.enabled = False
    return options


@dataclass(frozen=True)
class _Feed:
    """One ``tf_dataset`` call's settings, checked: what it reads, how it converts and batches.

    :meth:`batches` builds the ``tf.data`` pipeline for any batch size and step count, so the
    same settings serve a whole worker's batches or, under ``strategy=``, each replica's.
    """

    iterator: DataIterator
    plans: Mapping[str, ColumnPlan]
    decoding: _Decoding | None
    features: str | Sequence[str]
    label: str | Sequence[str] | None
    drop_remainder: bool
    cache: bool
    shuffle_buffer: int | None
    shuffle_seed: int | None
    ray_prefetch: int
    tf_prefetch: int

    def batches(self, batch_size: int, steps: int | None) -> tf.data.Dataset:
        """Elements of ``batch_size`` rows, ``steps`` of them an epoch (None: as many as the data gives)."""
        iter_options = {
            "prefetch_batches": self.ray_prefetch,
            "local_shuffle_buffer_size": self.shuffle_buffer,
            "local_shuffle_seed": self.shuffle_seed,
        }

        def tables(fetch_rows: int) -> Iterable[pa.Table]:
            fetches = _Fetches(self.iterator, _Batching(batch_size, fetch_rows), self.drop_remainder, steps,
                               iter_options)
            return fetches if self.decoding is None else map(self.decoding, fetches)

        return table_batches(tables, self.plans, features=self.features, label=self.label, batch_size=batch_size,
                             fetch_cap=self.shuffle_buffer, tf_prefetch=self.tf_prefetch, cache=self.cache,
                             steps=steps)


def table_batches(
    tables: Callable[[int], Iterable[pa.Table]],
    plans: Mapping[str, ColumnPlan],
    *,
    features: str | Sequence[str],
    label: str | Sequence[str] | None,
    batch_size: int,
    weight: str | None = None,
    fetch_cap: int | None = None,
    tf_prefetch: int = tf.data.AUTOTUNE,
    cache: bool = False,
    steps: int | None = None,
    fetch_rows: int | None = None,
) -> tf.data.Dataset:
    """The ``tf.data`` pipeline of every feed: ``tables(fetch_rows)`` gives one epoch of Arrow tables
    (each a whole number of ``batch_size``-row batches, ``fetch_rows`` rows or fewer) per call;
    their columns become tensors as ``plans`` say, in elements of ``batch_size`` rows:
    ``features``, ``(features, label)``, or with ``weight`` (a column name)
    ``(features, label, weight)``, Keras's sample weights.  ``fetch_cap`` bounds the rows per table
    (a shuffle buffer cannot hand out more than it holds); ``fetch_rows`` sets the rows per table
    (a multiple of ``batch_size``) where the tables were asked for before ``plans`` were known."""
    batching = (_Batching(batch_size, fetch_rows) if fetch_rows is not None
                else _Batching.fitting(plans.values(), batch_size, fetch_cap))
    packing = _Packing(plans)
    dataset = tf.data.Dataset.from_generator(
        lambda: map(packing.pack, tables(batching.fetch_rows)), output_signature=packing.signature()
    )
    dataset = dataset.map(packing.unpack, num_parallel_calls=tf.data.AUTOTUNE)
    if batching.fetch_rows > batching.batch_size:
        dataset = dataset.flat_map(functools.partial(_split_batches, batch_size=batching.batch_size))
    dataset = dataset.map(functools.partial(_model_inputs, features=features, label=label, weight=weight))
    if steps is not None:
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(steps))
    if cache:
        dataset = dataset.cache()
    return dataset.prefetch(tf_prefetch).with_options(_options())


@overload
def tf_dataset(
    source: DataIterator | Dataset, *, feature_columns: str | Sequence[str] | None = None,
    label_columns: str | Sequence[str] | None = None, batch_size: int, drop_last: bool = True,
    steps_per_epoch: int | None = None, defaults: Mapping[str, Any] | None = None,
    record_schema: pa.Schema | None = None, cache: bool = False, local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    prefetch_batches: int = 2, tf_prefetch: int = tf.data.AUTOTUNE, strategy: None = None, **renamed: Any,
) -> tf.data.Dataset: ...


@overload
def tf_dataset(
    source: DataIterator | Dataset, *, feature_columns: str | Sequence[str] | None = None,
    label_columns: str | Sequence[str] | None = None, batch_size: int, drop_last: bool = True,
    steps_per_epoch: int | None = None, defaults: Mapping[str, Any] | None = None,
    record_schema: pa.Schema | None = None, cache: bool = False, local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    prefetch_batches: int = 2, tf_prefetch: int = tf.data.AUTOTUNE, strategy: tf.distribute.Strategy, **renamed: Any,
) -> tf.distribute.DistributedDataset: ...


def tf_dataset(
    source: DataIterator | Dataset,
    *,
    feature_columns: str | Sequence[str] | None = None,
    label_columns: str | Sequence[str] | None = None,
    batch_size: int,
    drop_last: bool = True,
    steps_per_epoch: int | None = None,
    defaults: Mapping[str, Any] | None = None,
    record_schema: pa.Schema | None = None,
    cache: bool = False,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    prefetch_batches: int = 2,
    tf_prefetch: int = tf.data.AUTOTUNE,
    strategy: tf.distribute.Strategy | None = None,
    **renamed: Any,
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """A ``tf.data.Dataset`` of batches streamed from a Ray ``DataIterator`` or ``Dataset``.

    Arguments ``DataIterator.to_tf`` also has carry its names; the old ``features``, ``label``,
    ``drop_remainder`` and ``ray_prefetch_batches`` work until 0.2, with a ``FutureWarning``.

    Args:
        source: What ``ray.train.get_dataset_shard`` returns inside a training
            worker, or a whole ``ray.data.Dataset``.
        feature_columns: One column name (the model input is that tensor) or several
            (the input is a ``dict`` of tensors keyed by column name).
        label_columns: Label column(s), same convention; ``None`` yields features only.
        batch_size: Rows per element, taken from this worker's shard (under
            ``MultiWorkerMirroredStrategy`` that is TensorFlow's global batch
            size; see :mod:`ray_tfrecord._src.tf.distribution`).
        drop_last: Yield only full batches (see :mod:`ray_tfrecord._src.tf.distribution`
            for why this keeps ranks in step).  ``False`` keeps the last partial batch;
            inside a Ray Train run of several workers that is refused unless
            ``steps_per_epoch`` is given, because ranks could then disagree on
            the step count.
        steps_per_epoch: Yield exactly this many batches per epoch, raising if
            the source runs short.  ``None`` means as many as the data gives.
            With ``strategy``, Keras steps: every replica gets this many
            per-replica batches an epoch.
        defaults: Values for null rows, by column, like TensorFlow's ``FixedLenFeature(default_value=...)``:
            a record without a scalar or fixed-length feature reads as a null row, which a tensor cannot
            hold.  Each value is one row of its column (a scalar, or a list of the column's fixed shape) of
            the column's kind.  Without one, a null in a scalar or fixed-size column raises ``SchemaError``
            naming the column and the null count.  Variable-length lists need none: their null rows are empty.
        record_schema: Decode in this process: ``source`` holds serialized
            ``Example`` records (``read_tfrecords(..., record_type="ByteArray")``),
            and the feed decodes the columns it needs with this schema, as
            ``read_tfrecords(..., schema=record_schema)`` would.  Ray then
            moves the records' serialized bytes instead of decoded columns,
            much less for wide integer rows (an image's int64 pixels), and the
            training workers decode in parallel with the read tasks.
        cache: Keep the converted batches in memory after the first epoch so
            later epochs do not read through Ray again.  Without it every
            epoch (every new iterator over the returned dataset) re-reads.
        local_shuffle_buffer_size: Rows held in Ray's local shuffle buffer
            (``None`` disables local shuffling).
        local_shuffle_seed: Seed for the local shuffle.
        prefetch_batches: Batches Ray fetches ahead on its own threads.
        tf_prefetch: Batches TensorFlow keeps ready ahead of the training step.
        strategy: Hand Keras per-replica batches already cut, as a
            ``tf.distribute.DistributedDataset`` (see "Per-replica batches" in
            :mod:`ray_tfrecord._src.tf.distribution`): each replica gets ``batch_size //
            strategy.num_replicas_in_sync`` rows straight from this worker's
            shard, and Keras skips its own re-split of every element, which on
            a ragged column costs more than the feed.  Needs
            ``steps_per_epoch``, counted in Keras steps, and the same value
            given to ``model.fit``; every Keras epoch then reads the shard once.

    Inside a training worker, create the ``MultiWorkerMirroredStrategy`` first:
    TensorFlow refuses to set up collectives once other ops have run.

    Returns:
        A dataset whose elements are ``(features, label)``, or ``features`` when
        ``label_columns`` is ``None``.  Its ``element_spec`` follows the Arrow schema,
        see :func:`~ray_tfrecord._src.tf.tensors.type_spec`.  Auto-sharding is off: Ray already sharded it.
        tf.data autotuning is off (an epoch's end would often wait for the
        autotuner's next wake-up); ``with_options`` turns it back on.  With
        ``strategy``, a ``tf.distribute.DistributedDataset`` of the same
        elements, cut per replica, that repeats epoch after epoch.
    """
    feature_columns, label_columns, drop_last, prefetch_batches = renames.renamed(
        "tf_dataset", _RENAMED, renamed, (feature_columns, label_columns, drop_last, prefetch_batches))
    if feature_columns is None:
        raise TypeError("tf_dataset() needs feature_columns=, the column(s) of the model's input")
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if steps_per_epoch is not None and steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
    per_replica = None if strategy is None else PerReplica.checked(strategy, batch_size, steps_per_epoch)
    if per_replica is None:
        check_partial_batches(drop_remainder=drop_last, steps_per_epoch=steps_per_epoch)
    feature_names, label_names = _names(feature_columns), _names(label_columns)
    if not feature_names:
        raise ValueError("feature_columns must name at least one column")
    if isinstance(source, Dataset):
        warn_constant_length_lists(source, feature_names)
    progress.preflight("tf_dataset", [])
    iterator = source.iterator() if isinstance(source, Dataset) else source
    plans, decoding = _plans(iterator, feature_names + label_names, defaults, record_schema)
    feed = _Feed(
        iterator=iterator, plans=plans, decoding=decoding, features=feature_columns, label=label_columns,
        drop_remainder=drop_last, cache=cache, shuffle_buffer=local_shuffle_buffer_size,
        shuffle_seed=local_shuffle_seed, ray_prefetch=prefetch_batches, tf_prefetch=tf_prefetch,
    )
    if per_replica is None:
        return feed.batches(batch_size, steps_per_epoch)
    return per_replica.distribute(feed.batches)
