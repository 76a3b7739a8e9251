"""Stream Ray Data batches into TensorFlow as a ``tf.data.Dataset``: ``tf_dataset``.

Each Arrow batch Ray Data hands out becomes tensors as ``ray_tfrecord._src.tf.tensors`` plans
them, with no Python work per row: dense tensors for fixed-length columns, ``tf.RaggedTensor``
for variable-length lists.  Only full batches are produced by default, so every rank of a Ray
Train run takes the same number of steps; ``ray_tfrecord._src.tf.distribution`` explains the
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

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

import pyarrow as pa
import tensorflow as tf
from ray.data import DataIterator, Dataset

from ray_tfrecord._src.core.codec import BYTE_ARRAY_SCHEMA, decode_records
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import progress
from ray_tfrecord._src.tf.distribution import PerReplica, check_partial_batches
from ray_tfrecord._src.tf.lint import warn_constant_length_lists
from ray_tfrecord._src.tf.pipeline import Batching, table_batches
from ray_tfrecord._src.tf.tensors import ColumnPlan, arrow_schema, column_plans


@dataclass(frozen=True)
class _Fetches:
    """One epoch of Arrow tables from Ray per iteration, each cut to whole batches."""

    iterator: DataIterator
    batching: Batching
    drop_last: bool
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
                count = self.batching.batches_in(table.num_rows, drop_last=self.drop_last)
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
    process, with ``decode_records``: the native decoder runs here, with
    the GIL released, into the Arrow buffers the tensors are made from."""

    schema: pa.Schema

    def __call__(self, table: pa.Table) -> pa.Table:
        return pa.Table.from_batches([decode_records(table, self.schema)])


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


@dataclass(frozen=True)
class _Feed:
    """One ``tf_dataset`` call's settings, checked: what it reads, how it converts and batches.

    ``batches`` builds the ``tf.data`` pipeline for any batch size and step count, so the
    same settings serve a whole worker's batches or, under ``strategy=``, each replica's.
    """

    iterator: DataIterator
    plans: Mapping[str, ColumnPlan]
    decoding: _Decoding | None
    feature_columns: str | Sequence[str]
    label_columns: str | Sequence[str] | None
    drop_last: bool
    cache: bool
    local_shuffle_buffer_size: int | None
    local_shuffle_seed: int | None
    prefetch_batches: int
    tf_prefetch: int

    def batches(self, batch_size: int, steps: int | None) -> tf.data.Dataset:
        """Elements of ``batch_size`` rows, ``steps`` of them an epoch (None: as many as the data gives)."""
        # Within Ray's local shuffle buffer, which cannot hand out more rows than it holds.
        batching = Batching.fitting(self.plans.values(), batch_size, self.local_shuffle_buffer_size)
        iter_options = {
            "prefetch_batches": self.prefetch_batches,
            "local_shuffle_buffer_size": self.local_shuffle_buffer_size,
            "local_shuffle_seed": self.local_shuffle_seed,
        }

        def tables() -> Iterable[pa.Table]:
            fetches = _Fetches(self.iterator, batching, self.drop_last, steps, iter_options)
            return fetches if self.decoding is None else map(self.decoding, fetches)

        return table_batches(tables, self.plans, batching, feature_columns=self.feature_columns,
                             label_columns=self.label_columns, tf_prefetch=self.tf_prefetch, cache=self.cache,
                             steps=steps)


@overload
def tf_dataset(
    source: DataIterator | Dataset, *, feature_columns: str | Sequence[str],
    label_columns: str | Sequence[str] | None = None, batch_size: int, drop_last: bool = True,
    steps_per_epoch: int | None = None, defaults: Mapping[str, Any] | None = None,
    record_schema: pa.Schema | None = None, cache: bool = False, local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    prefetch_batches: int = 2, tf_prefetch: int = tf.data.AUTOTUNE, strategy: None = None,
) -> tf.data.Dataset: ...


@overload
def tf_dataset(
    source: DataIterator | Dataset, *, feature_columns: str | Sequence[str],
    label_columns: str | Sequence[str] | None = None, batch_size: int, drop_last: bool = True,
    steps_per_epoch: int | None = None, defaults: Mapping[str, Any] | None = None,
    record_schema: pa.Schema | None = None, cache: bool = False, local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    prefetch_batches: int = 2, tf_prefetch: int = tf.data.AUTOTUNE, strategy: tf.distribute.Strategy,
) -> tf.distribute.DistributedDataset: ...


@public("ray_tfrecord.tf")
def tf_dataset(
    source: DataIterator | Dataset,
    *,
    feature_columns: str | Sequence[str],
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
) -> tf.data.Dataset | tf.distribute.DistributedDataset:
    """A ``tf.data.Dataset`` of batches streamed from a Ray ``DataIterator`` or ``Dataset``.

    Arguments ``DataIterator.to_tf`` also has carry its names.

    Args:
        source: What ``ray.train.get_dataset_shard`` returns inside a training
            worker, or a whole ``ray.data.Dataset``.
        feature_columns: One column name (the model input is that tensor) or several
            (the input is a ``dict`` of tensors keyed by column name).
        label_columns: Label column(s), same convention; ``None`` yields features only.
        batch_size: Rows per element, taken from this worker's shard.  Under
            ``MultiWorkerMirroredStrategy`` it is TensorFlow's global batch size: Keras
            splits every element into ``num_replicas_in_sync`` pieces and runs one step per
            piece, so pass ``per_replica_batch * world_size``.  Keras then runs, and prints,
            ``world_size * ((rows // world_size) // batch_size)`` steps an epoch (1,000 rows,
            2 workers, ``batch_size=100``: 10), the same on every rank
            ([Training feed](../training.md)).
        drop_last: Yield only full batches, which keeps the ranks of synchronous training
            in step: Ray Train splits a dataset with ``streaming_split(world_size,
            equal=True)``, so every rank gets ``rows // world_size`` rows and yields
            ``(rows // world_size) // batch_size`` batches an epoch; at most
            ``world_size * batch_size - 1`` rows an epoch go unseen.  Where shards may be
            unequal (a custom ``DataConfig``, each rank reading its own files), pass
            ``steps_per_epoch``.  ``False`` keeps the last partial batch;
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
            ``tf.distribute.DistributedDataset``: each replica gets ``batch_size //
            strategy.num_replicas_in_sync`` rows straight from this worker's
            shard, and Keras skips its own re-split of every element, which on
            a ragged column costs more than the feed.  Needs
            ``steps_per_epoch``, counted in Keras steps, and the same value
            given to ``model.fit``; every Keras epoch then reads the shard once.

    Inside a training worker, create the ``MultiWorkerMirroredStrategy`` first:
    TensorFlow refuses to set up collectives once other ops have run.

    Returns:
        A dataset whose elements are ``(features, label)``, or ``features`` when
        ``label_columns`` is ``None``.  Its ``element_spec`` follows the Arrow schema:
        ``fixed_size_list`` and fixed-shape tensor columns give dense tensors of shape
        ``(None, *dims)``, each variable-length ``list`` level a ragged dimension
        (``tf.RaggedTensor``, int64 row splits), binary and string ``tf.string``.
        Auto-sharding is off: Ray already sharded it.
        tf.data autotuning is off (an epoch's end would often wait for the
        autotuner's next wake-up); ``with_options`` turns it back on.  With
        ``strategy``, a ``tf.distribute.DistributedDataset`` of the same
        elements, cut per replica, that repeats epoch after epoch.
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if steps_per_epoch is not None and steps_per_epoch <= 0:
        raise ValueError(f"steps_per_epoch must be positive, got {steps_per_epoch}")
    per_replica = None if strategy is None else PerReplica.checked(strategy, batch_size, steps_per_epoch)
    if per_replica is None:
        check_partial_batches(drop_last=drop_last, steps_per_epoch=steps_per_epoch)
    feature_names, label_names = _names(feature_columns), _names(label_columns)
    if not feature_names:
        raise ValueError("feature_columns must name at least one column")
    if isinstance(source, Dataset):
        warn_constant_length_lists(source, feature_names)
    progress.preflight("tf_dataset", [])
    iterator = source.iterator() if isinstance(source, Dataset) else source
    plans, decoding = _plans(iterator, feature_names + label_names, defaults, record_schema)
    feed = _Feed(
        iterator=iterator, plans=plans, decoding=decoding, feature_columns=feature_columns,
        label_columns=label_columns, drop_last=drop_last, cache=cache,
        local_shuffle_buffer_size=local_shuffle_buffer_size, local_shuffle_seed=local_shuffle_seed,
        prefetch_batches=prefetch_batches, tf_prefetch=tf_prefetch,
    )
    if per_replica is None:
        return feed.batches(batch_size, steps_per_epoch)
    return per_replica.distribute(feed.batches)
