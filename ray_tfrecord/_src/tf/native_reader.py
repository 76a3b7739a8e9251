"""TensorFlow reading a dataset itself: ``tfrecord_dataset``, TensorFlowOnSpark's ``InputMode.TENSORFLOW``.

The pipeline is TensorFlow ops only (``TFRecordDatasetV2`` with byte offsets, ``skip``/``take``,
``batch``, ``parse_example``, ``cast``): no Ray and no Python per record when it runs, so it serves a
parameter-server worker's ``create_per_worker_dataset``, a TPU host, or any TensorFlow job started
outside Ray.  The parse spec comes from the schema the plan carries (the one the writer recorded),
through the same column plans as ``tf_dataset``, so the elements have
the same ``element_spec``: a scalar or ``fixed_size_list`` column is a dense tensor of its Arrow type,
a ``list`` a ``tf.RaggedTensor`` with int64 row splits, a partition column a constant of its file.

Shards
------
Shard ``i`` of ``n`` takes rows ``[i * N // n, (i + 1) * N // n)`` of the plan's ``N`` rows in plan
order, so the shards of one epoch hold every row exactly once and differ by at most one row.  Its rows
are read as runs: the shard's consecutive splits of one file are one read, which starts at the first
split's byte offset (``TFRecordDatasetV2``'s ``byte_offsets``: the file is not read from its start),
skips the records of that split before the shard's first row and takes the run's rows.  An
uncompressed file is thus read from where the shard starts; a GZIP/ZLIB file, one split, is
decompressed from its start up to the shard's first row.

The index may be a tensor known only when the pipeline runs: a parameter-server worker's
``tf.distribute.coordinator.experimental_get_current_worker_index()``, since
``ClusterCoordinator.create_per_worker_dataset`` traces ``dataset_fn`` once, on the coordinator, for
every worker, and its ``InputContext`` says one pipeline.  The runs of every shard are then constants
of the graph and the worker picks its own at run time.

Example::

    from ray_tfrecord.tf import plan_splits
    from ray_tfrecord._src.tf.native_reader import tfrecord_dataset

    plan = plan_splits("/tmp/train")
    feed = tfrecord_dataset(plan, feature_columns="pixels", label_columns="label", batch_size=100,
                            shard=(0, 2))
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import tensorflow as tf

from ray_tfrecord._src.core.errors import SchemaError
from ray_tfrecord._src.core.feature_specs import feature_info
from ray_tfrecord._src.core.framing import detect_compression
from ray_tfrecord._src.core.manifest import explain_missing
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.feed.splits import SplitPlan, plan_splits
from ray_tfrecord._src.tf.feature_spec import field_spec
from ray_tfrecord._src.tf.tensors import ColumnPlan, column_plans
from ray_tfrecord._src.tf.tf_filesystems import check_tf_opens, tf_scheme

# TensorFlow's default read buffer (the op's -1), as TFRecordDataset's.
_READ_BUFFER_BYTES = -1
_TF_COMPRESSION = {None: "", "gzip": "GZIP", "zlib": "ZLIB"}


@dataclass(frozen=True)
class Run:
    """Records of one file read in one go: from byte ``offset`` skip ``skip`` records, then take ``take``,
    which ``to_eof`` are the rest of the file."""

    path: str
    offset: int
    skip: int
    take: int
    compression: str  # TensorFlow's spelling: "", "GZIP" or "ZLIB"
    to_eof: bool


def shard_runs(plan: SplitPlan, index: int, count: int) -> list[Run]:
    """Shard ``index`` of ``count``: rows ``[index * N // count, (index + 1) * N // count)`` of the
    plan, as runs of consecutive splits of one file, in plan order."""
    if not 0 <= index < count:
        raise ValueError(f"shard=({index}, {count}): the index must be at least 0 and below the count")
    lo, hi = index * plan.rows // count, (index + 1) * plan.rows // count
    fs = compat.unpickled_filesystem(plan.filesystem)
    runs: list[Run] = []
    first = 0
    for i, split in enumerate(plan.splits):
        begin, end = max(lo, first), min(hi, first + split.rows)
        if begin < end:
            to_eof = end == first + split.rows and (i + 1 == len(plan.splits) or plan.splits[i + 1].path != split.path)
            last = runs[-1] if runs else None
            if last is not None and last.path == split.path and split.end is not None and begin == first:
                runs[-1] = replace(last, take=last.take + end - begin, to_eof=to_eof)
            else:
                runs.append(Run(split.path, split.start, begin - first, end - begin,
                                _compression(fs, plan, split.path, compressed=split.end is None), to_eof))
        first += split.rows
        if first >= hi:
            break
    return runs


def _compression(fs: Any, plan: SplitPlan, path: str, *, compressed: bool) -> str:
    if not compressed:
        return ""
    if plan.compression in ("gzip", "zlib"):
        return _TF_COMPRESSION[plan.compression]
    with explain_missing(fs, path), fs.open_input_stream(path, compression=None) as f:
        return _TF_COMPRESSION[detect_compression(f.read(16))]


def _tf_path(fs: Any, path: str) -> str:
    scheme = tf_scheme(fs)
    return f"{scheme}://{path}" if scheme else path


def _parse_dtype(dtype: tf.DType) -> tf.DType:
    """What ``parse_example`` reads a column of ``dtype`` as: the three TFRecord kinds."""
    if dtype == tf.string:
        return tf.string
    return tf.float32 if dtype.is_floating else tf.int64


def _feature(plan: ColumnPlan, field: pa.Field, default: Any) -> tf.io.FixedLenFeature | tf.io.RaggedFeature:
    column = field.name
    info = feature_info(field)
    if info is not None and ("values" in info or (plan.ragged_rank == 0 and "default" in info)):
        # Read through a feature spec (plan_splits(schema=) a dict, a TFMD Schema): parse with that spec, so
        # its default and its partitions (another feature's values, split by others) are TensorFlow's own.
        return field_spec(field)
    parsed = _parse_dtype(plan.dtype)
    if plan.ragged_rank == 1:
        return tf.io.RaggedFeature(parsed, row_splits_dtype=tf.int64)
    if plan.ragged_rank:
        raise SchemaError("a list<list<T>> column is a SequenceExample feature_list; the TensorFlow-native "
                          "reader reads Example records: leave it out of feature_columns= or use tf_dataset",
                          column=column)
    if default is None:
        return tf.io.FixedLenFeature(plan.inner_shape, parsed)
    value = np.asarray(default, dtype=object)
    value = value.astype(bytes) if parsed == tf.string else value.astype(parsed.as_numpy_dtype)
    return tf.io.FixedLenFeature(plan.inner_shape, parsed, default_value=value)


def _partition_values(plan: SplitPlan, runs: Sequence[Run], columns: Sequence[str],
                      plans: Mapping[str, ColumnPlan], defaults: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each partition column's value in each run's file, filled from ``defaults`` where the file has none
    (the Hive null directory)."""
    of_file = {path: dict(values) for path, values in plan.partitions}
    out = {}
    for c in columns:
        values = []
        for run in runs:
            value = of_file.get(run.path, {}).get(c, defaults.get(c))
            if value is None:
                raise SchemaError(f"the file's partition value is null and a tensor cannot hold nulls; pass "
                                  f"defaults={{{c!r}: {plans[c].example_default}}}", path=run.path, column=c)
            values.append(value)
        out[c] = np.asarray(values, dtype=object if plans[c].dtype == tf.string else plans[c].dtype.as_numpy_dtype)
    return out


def _shard(shard: tuple[int | tf.Tensor, int] | tf.distribute.InputContext | None,
           batch_size: int) -> tuple[int | tf.Tensor, int, int]:
    """(index, count, rows per element) of ``shard``; an ``InputContext`` turns the global batch size
    into its replica's."""
    if shard is None:
        return 0, 1, batch_size
    if isinstance(shard, tf.distribute.InputContext):
        return shard.input_pipeline_id, shard.num_input_pipelines, shard.get_per_replica_batch_size(batch_size)
    index, count = shard
    if tf.is_tensor(index) and count < 1:
        raise ValueError(f"shard=(<tensor>, {count}): the count must be at least 1")
    return index, count, batch_size


@public("ray_tfrecord.tf")
def tfrecord_dataset(
    source: SplitPlan | str | Sequence[str],
    *,
    feature_columns: str | Sequence[str],
    label_columns: str | Sequence[str] | None = None,
    batch_size: int,
    shard: tuple[int | tf.Tensor, int] | tf.distribute.InputContext | None = None,
    drop_last: bool = True,
    defaults: Mapping[str, Any] | None = None,
    local_shuffle_buffer_size: int | None = None,
    local_shuffle_seed: int | None = None,
    num_parallel_reads: int | None = None,
) -> tf.data.Dataset:
    """A ``tf.data.Dataset`` that reads a dataset's TFRecord files with TensorFlow's own ops: no Ray,
    no Python per record.

    Its elements are those [`tf_dataset`][ray_tfrecord.tf.tf_dataset] yields for the same columns
    (``features``, or ``(features, label)``; one name a tensor, several a dict), with the same
    ``element_spec``; its cardinality is known.

    Args:
        source: A [`SplitPlan`][ray_tfrecord.tf.SplitPlan] ([`plan_splits`][ray_tfrecord.tf.plan_splits]),
            or paths to plan here.  Example records; the parse spec is the plan's schema.
        feature_columns: The model's input column(s), record or partition columns.
        label_columns: Label column(s); ``None`` yields features only.
        batch_size: Rows per element; with ``shard=`` an ``InputContext``, the global batch size, of
            which each replica gets ``input_context.get_per_replica_batch_size(batch_size)``.
        shard: ``(index, count)``, or the ``tf.distribute.InputContext`` that
            ``distribute_datasets_from_function`` passes: the shard's rows are
            ``[index * N // count, (index + 1) * N // count)`` of the plan's ``N``, so the shards of an
            epoch hold every row exactly once.  ``None``: every row.  The index may be a scalar
            int tensor, such as a parameter-server worker's
            ``tf.distribute.coordinator.experimental_get_current_worker_index()``: the shard is then
            chosen when the pipeline runs, and with ``drop_last`` every shard yields the smallest
            shard's full batches.
        drop_last: Yield only full batches.
        defaults: Values for rows without a scalar or fixed-size feature, and for a null partition, as
            in ``tf_dataset``.  Without one, such a record fails the read with TensorFlow's
            ``Feature: ... is required but could not be found``.
        local_shuffle_buffer_size: Shuffle, with Ray's name and meaning (``tf_dataset``'s keyword): the
            shard's records pass through a buffer of this many rows, and its runs (consecutive splits of one
            file) are read in a new order every epoch.  ``None``: plan order.
        local_shuffle_seed: The shuffle's seed (the runs' order and the buffer's).
        num_parallel_reads: Runs read at once (``interleave``, deterministic). ``None``: one at a time.

    Every epoch (every iteration over the dataset) a shard reads the same rows, each once.

    >>> feed = tfrecord_dataset(plan_splits("/tmp/train"), feature_columns="pixels",
    ...                         label_columns="label", batch_size=100, shard=(0, 2))  # doctest: +SKIP
    """
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    plan = source if isinstance(source, SplitPlan) else plan_splits(source if isinstance(source, str) else list(source))
    if plan.splits:  # one filesystem holds every file of a plan
        check_tf_opens("tfrecord_dataset", compat.unpickled_filesystem(plan.filesystem), plan.splits[0].path,
                       tf.io.gfile.get_registered_schemes())
    index, count, rows_per_element = _shard(shard, batch_size)
    features = [feature_columns] if isinstance(feature_columns, str) else list(feature_columns)
    labels = [] if label_columns is None else [label_columns] if isinstance(label_columns, str) else list(label_columns)
    if not features:
        raise ValueError("feature_columns must name at least one column")
    defaults = dict(defaults or {})
    plans = column_plans(plan.columns(), features + labels, defaults)
    attached = [c for c in plans if c in plan.partition_schema.names]
    fields = plan.columns()
    spec = {c: _feature(p, fields.field(c), defaults.get(c)) for c, p in plans.items() if c not in attached}
    # A tensor index is chosen at run time: every shard's runs go into the graph.
    chosen = tf.is_tensor(index)
    shards = [shard_runs(plan, i, count) for i in range(count)] if chosen else [shard_runs(plan, int(index), count)]
    runs = [r for rs in shards for r in rs]
    fs = compat.unpickled_filesystem(plan.filesystem)
    table = {
        "path": tf.constant([_tf_path(fs, r.path) for r in runs], tf.string, shape=(len(runs),)),
        "offset": tf.constant([r.offset for r in runs], tf.int64, shape=(len(runs),)),
        "skip": tf.constant([r.skip for r in runs], tf.int64, shape=(len(runs),)),
        "take": tf.constant([r.take for r in runs], tf.int64, shape=(len(runs),)),
        "compression": tf.constant([r.compression for r in runs], tf.string, shape=(len(runs),)),
        "run": tf.range(len(runs), dtype=tf.int64),
    }
    constants = {c: tf.constant(v, plans[c].dtype) for c, v in
                 _partition_values(plan, runs, attached, plans, defaults).items()}
    if attached or local_shuffle_buffer_size is not None or num_parallel_reads is not None or chosen:
        pieces = tf.data.Dataset.from_tensor_slices(table)
        if chosen:
            bounds = tf.constant(np.cumsum([0] + [len(rs) for rs in shards]), tf.int64)
            at = tf.cast(index, tf.int64)
            pieces = pieces.skip(bounds[at]).take(bounds[at + 1] - bounds[at])
        if local_shuffle_buffer_size is not None:
            pieces = pieces.shuffle(max(1, *map(len, shards)), seed=local_shuffle_seed, reshuffle_each_iteration=True)
        reader = _RunReader(with_run=bool(attached))
        records = (pieces.flat_map(reader) if num_parallel_reads is None else
                   pieces.interleave(reader, cycle_length=num_parallel_reads, num_parallel_calls=num_parallel_reads,
                                     deterministic=True))
    else:
        records = _stream(runs, table)
    if local_shuffle_buffer_size is not None:
        records = records.shuffle(local_shuffle_buffer_size, seed=local_shuffle_seed, reshuffle_each_iteration=True)
    rows = [sum(r.take for r in rs) for rs in shards]
    per_shard = [n // rows_per_element if drop_last else -(-n // rows_per_element) for n in rows]
    batches = min(per_shard)
    if drop_last and max(rows) > batches * rows_per_element:
        records = records.take(batches * rows_per_element)
    parse = _Parse(spec, plans, constants, features=feature_columns, labels=label_columns)
    dataset = records.batch(rows_per_element).map(parse, num_parallel_calls=tf.data.AUTOTUNE)
    if drop_last or len(set(per_shard)) == 1:  # with drop_last every shard takes the smallest one's batches
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(batches))
    options = tf.data.Options()
    # The rows are sharded already; TensorFlow's auto-sharding would cut each shard again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.prefetch(tf.data.AUTOTUNE).with_options(options)


def _records(paths: tf.Tensor, offsets: tf.Tensor, compression: tf.Tensor | str) -> tf.data.Dataset:
    """The records of ``paths``, each file's from its byte offset on: TFRecordDataset with the op's
    ``byte_offsets``, which its Python class does not take."""
    variant = tf.raw_ops.TFRecordDatasetV2(filenames=paths, compression_type=compression,
                                           buffer_size=tf.constant(_READ_BUFFER_BYTES, tf.int64), byte_offsets=offsets)
    return tf.data.experimental.from_variant(variant, tf.TensorSpec((), tf.string))


def _stream(runs: Sequence[Run], table: Mapping[str, tf.Tensor]) -> tf.data.Dataset:
    """The runs' records in order as one stream, cut by a skip and a take only where the shard starts or
    ends inside a file: a shard of whole files is TFRecordDataset over them, record for record.

    Every run but the last goes to its file's end (a shard is contiguous), so reading each run's file
    from the run's offset on and skipping the first run's first records gives exactly the shard's."""
    if not runs:
        return tf.data.Dataset.from_tensor_slices(tf.constant([], tf.string))
    parts, at = [], 0
    for (compression, from_start), group in itertools.groupby(runs, key=lambda r: (r.compression, r.offset == 0)):
        n = len(list(group))
        paths, offsets = table["path"][at:at + n], table["offset"][at:at + n]
        at += n
        if from_start:
            parts.append(tf.data.TFRecordDataset(paths, compression))
        else:
            # Built inside a function: iterating a top-level TFRecordDatasetV2 serializes it, and its
            # serialization drops byte_offsets (TensorFlow 2.21: "3 inputs specified of 4").
            parts.append(tf.data.Dataset.from_tensors((paths, offsets)).flat_map(
                functools.partial(_records, compression=compression)))
    records = functools.reduce(tf.data.Dataset.concatenate, parts)
    if runs[0].skip:
        records = records.skip(runs[0].skip)
    return records if runs[-1].to_eof else records.take(sum(r.take for r in runs))


@dataclass(frozen=True)
class _RunReader:
    """One run's records, read from its byte offset; with ``with_run`` each paired with the run's number
    (for its partition values)."""

    with_run: bool

    @tf.autograph.experimental.do_not_convert
    def __call__(self, run: dict[str, tf.Tensor]) -> tf.data.Dataset:
        records = _records(tf.reshape(run["path"], (1,)), tf.reshape(run["offset"], (1,)), run["compression"])
        records = records.skip(run["skip"]).take(run["take"])
        if not self.with_run:
            return records
        return tf.data.Dataset.zip((records, tf.data.Dataset.from_tensors(run["run"]).repeat()))


@dataclass(frozen=True)
class _Parse:
    """A batch of serialized records (with their runs' numbers) to the model's inputs."""

    spec: Mapping[str, tf.io.FixedLenFeature | tf.io.RaggedFeature]
    plans: Mapping[str, ColumnPlan]
    constants: Mapping[str, tf.Tensor]
    features: str | Sequence[str]
    labels: str | Sequence[str] | None

    @tf.autograph.experimental.do_not_convert
    def __call__(self, serialized: tf.Tensor, run: tf.Tensor | None = None) -> Any:
        tensors = tf.io.parse_example(serialized, self.spec) if self.spec else {}
        out = {c: _as_planned(t, self.plans[c]) for c, t in tensors.items()}
        for c, values in self.constants.items():
            out[c] = tf.gather(values, run)

        def pick(columns: str | Sequence[str]) -> Any:
            return out[columns] if isinstance(columns, str) else {c: out[c] for c in columns}

        return pick(self.features) if self.labels is None else (pick(self.features), pick(self.labels))


def _as_planned(t: tf.Tensor | tf.RaggedTensor, plan: ColumnPlan) -> tf.Tensor | tf.RaggedTensor:
    """``parse_example``'s tensor as ``tf_dataset`` gives the column: of its dtype, and every list level
    ragged (a ``UniformRowLength`` partition parses as a uniform dimension; its Arrow column is a list)."""
    if isinstance(t, tf.RaggedTensor) and any(d is not None for d in t.shape[1:plan.ragged_rank + 1]):
        flat, splits = t.flat_values, t.nested_row_splits
        if flat.shape.rank > 1:  # uniform innermost levels: the dense values' rows
            inner = tf.RaggedTensor.from_tensor(flat, ragged_rank=flat.shape.rank - 1)
            flat, splits = inner.flat_values, (*splits, *inner.nested_row_splits)
        t = tf.RaggedTensor.from_nested_row_splits(flat, splits, validate=False)
    return tf.cast(t, plan.dtype) if t.dtype != plan.dtype else t
