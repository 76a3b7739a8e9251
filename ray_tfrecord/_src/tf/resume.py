"""A training feed that resumes mid-epoch: ``ResumableFeed``, the ``tf.data`` adapter over the
framework-free feed (``ray_tfrecord._src.data.feed.resumable``), whose position, checks and
``feed.json`` it shares: a checkpoint of either feed resumes the other.

Every row of each epoch reaches exactly one rank exactly once, counting the rows trained before and
after a restart, whatever the worker count after it (``Passes``: the epochs' order, shares, positions
and reads, free of TensorFlow).  The ranks step in lockstep, so the rows the group has trained after
``k`` steps are known on every rank: ``ResumableFeed.save`` writes that position into a checkpoint
directory without gathering anything, and ``ResumableFeed.load`` continues from it.
``ReportCheckpoint`` does both for Keras ``fit``, in one ``fit`` call across restarts
(``ResumableFeed.run_until``).

Each element is ``(features, label, weight)``: ``weight`` (float32, one per row) is 0 on padding
rows, which fill the last step of a rank whose share is short (equal batches on every rank keep
TensorFlow's collectives in step) and must not count: pass it as Keras's ``sample_weight`` (``fit``
does, given a 3-tuple) or multiply a custom loop's per-row loss by it.  The Arrow batches become
tensors as ``tf_dataset`` makes them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data.feed.order import Position
from ray_tfrecord._src.data.feed.passes import Keep, Transform
from ray_tfrecord._src.data.feed.resumable import FEED_FILE as FEED_FILE  # checkpoint.py's import
from ray_tfrecord._src.data.feed.resumable import ResumableFeed as Feed
from ray_tfrecord._src.data.feed.resumable import passes_of, saved_state, write_state
from ray_tfrecord._src.data.feed.splits import SplitPlan
from ray_tfrecord._src.data.feed.transforms import WEIGHT_COLUMN
from ray_tfrecord._src.tf.pipeline import Batching, table_batches
from ray_tfrecord._src.tf.tensors import column_plans


@public("ray_tfrecord.tf")
class ResumableFeed:
    """This rank's batches of a [`SplitPlan`][ray_tfrecord.tf.SplitPlan], epoch after epoch,
    resumable at any completed step.

    Args:
        plan: The dataset's splits ([`plan_splits`][ray_tfrecord.tf.plan_splits], on the driver; the
            plan travels in ``train_loop_config``).  Every rank must get the same plan.
        feature_columns: The model's input column(s), as for [`tf_dataset`][ray_tfrecord.tf.tf_dataset].
        label_columns: Label column(s), as for ``tf_dataset``; needed, since elements carry sample
            weights.
        batch_size: Rows per element from this rank (the global batch under
            ``MultiWorkerMirroredStrategy``, as for ``tf_dataset``).
        seed: Fixes every epoch's order (as Ray's ``random_shuffle(seed=)``): the same seed gives each rank
            the same rows in the same order.  The order of the blocks (below) is always a seeded permutation.
        shuffle_rows: Shuffle the rows inside each block (seeded); ``False``: each split's rows in file
            order, a split per block.
        defaults: Values for null rows, as for ``tf_dataset``.
        rank: This rank; by default Ray Train's (0 outside it).
        world_size: The group's size; by default Ray Train's (1 outside it).
        tf_prefetch: Batches TensorFlow keeps ready ahead of the training step.
        block_splits: Splits whose rows are shuffled together (a *block*, taken at a stride over the
            files), so that the batches of a dataset sorted by files mix; a read task holds a block decoded
            (``block_splits`` times the plan's ``split_bytes``).  ``1``: each split alone.  Only with
            ``shuffle_rows``.
        transform: Preprocessing run in the feed's Ray Data execution (``map_batches``): a function of
            a batch, or a callable class (Ray runs its instances on an actor pool: give
            ``transform_options={"concurrency": n}`` or ``compute=``).  Each batch carries
            [`SEED_COLUMN`][ray_tfrecord.SEED_COLUMN] (``uint64``, the row's seed: the same for a row of
            an epoch whatever the group size or resume point) and
            [`WEIGHT_COLUMN`][ray_tfrecord.WEIGHT_COLUMN]; the transform returns the same
            rows in the same order, with any columns added, replaced or dropped except those two.
        transform_options: ``map_batches`` keywords for ``transform``: ``batch_format`` (``"pyarrow"``
            by default), ``batch_size``, ``num_cpus``, ``num_gpus``, ``concurrency`` / ``compute``,
            ``fn_constructor_kwargs``, ``resources``...
        include_paths: Add a ``path`` column (each row's file), as ``read_tfrecords(include_paths=True)``
            does; partition columns (Hive ``key=value`` directories, a TFDS shard's ``split``) are
            columns of the feed as they are of ``read_tfrecords``.
        keep: A predicate over a batch (after ``transform``, in its batch format): one bool per row;
            rows it rejects get weight 0, so they are fed but not trained on and every rank keeps
            its step count.
    """

    def __init__(
        self, plan: SplitPlan, *, feature_columns: str | Sequence[str], label_columns: str | Sequence[str],
        batch_size: int, seed: int = 0, shuffle_rows: bool = True, defaults: Mapping[str, Any] | None = None,
        rank: int | None = None, world_size: int | None = None, tf_prefetch: int = tf.data.AUTOTUNE,
        block_splits: int = 16, transform: Transform | None = None, transform_options: Mapping[str, Any] | None = None,
        keep: Keep | None = None, include_paths: bool = False,
    ) -> None:
        names = [feature_columns] if isinstance(feature_columns, str) else list(feature_columns)
        names += [label_columns] if isinstance(label_columns, str) else list(label_columns)
        available = plan.columns(include_paths=include_paths).names
        # Names the plan lacks are left to column_plans, which names them; a transform reads every column.
        read = None if transform is not None else [n for n in dict.fromkeys(names) if n in available]
        self._feed = Feed(plan, batch_size=batch_size, columns=read, seed=seed, shuffle_rows=shuffle_rows,
                          rank=rank, world_size=world_size, block_splits=block_splits, transform=transform,
                          transform_options=transform_options, keep=keep, include_paths=include_paths,
                          batch_format="pyarrow")
        self._passes = passes_of(self._feed)
        self.plan, self.batch_size, self.seed, self.shuffle_rows = plan, batch_size, seed, shuffle_rows
        self.block_splits, self.rank, self.world_size = self._feed.block_splits, self._feed.rank, self._feed.world_size
        self._names, self._defaults = names, defaults
        schema = self._feed.schema
        self._plans = None if schema is None else column_plans(schema, [*names, WEIGHT_COLUMN], defaults)
        self._feature_columns, self._label_columns, self._tf_prefetch = feature_columns, label_columns, tf_prefetch

    @property
    def epoch(self) -> int:
        """The epoch the next pass over [`dataset`][ray_tfrecord.tf.ResumableFeed.dataset] feeds (or the one
        being fed)."""
        return self._feed.epoch

    def dataset(self) -> tf.data.Dataset:
        """Elements ``(features, label, weight)``; each pass (each new iterator, as Keras makes
        per epoch) feeds the next epoch, the first one from the position
        [`load`][ray_tfrecord.tf.ResumableFeed.load] set (after
        [`run_until`][ray_tfrecord.tf.ResumableFeed.run_until], a whole epoch's steps across epoch ends).
        With a transform, its first table is read here: the feed's columns are what the transform returns."""
        if self._plans is None:
            # The transform's columns are not known yet: fetches sized by the rows as stored.
            stored_row_bytes = sum(s.size for s in self.plan.splits) // max(1, self.plan.rows)
            batching = Batching.of_rows(self.batch_size, stored_row_bytes)
            schema = self._passes.first_table(batching.fetch_rows).schema
            plans = column_plans(schema, [*self._names, WEIGHT_COLUMN], self._defaults)
        else:
            plans = self._plans
            batching = Batching.fitting(plans.values(), self.batch_size)
        return table_batches(functools.partial(self._passes.tables, batching.fetch_rows), plans, batching,
                             feature_columns=self._feature_columns, label_columns=self._label_columns,
                             weight_column=WEIGHT_COLUMN, tf_prefetch=self._tf_prefetch)

    def run_until(self, epochs: int) -> None:
        """Make every pass a whole epoch's steps, continuing across epoch ends, and the last one end
        at the start of epoch ``epochs``: Keras ``fit`` keeps its first epoch's step count, so a
        resumed, shorter epoch would cut every later one short.
        [`ReportCheckpoint`][ray_tfrecord.tf.ReportCheckpoint] calls it with ``fit``'s ``epochs`` and stops
        ``fit`` there."""
        self._feed.run_until(epochs)

    def steps(self) -> int:
        """Steps (elements) every rank runs in the pass being fed, or in the next one."""
        return self._feed.steps()

    def position(self, steps: int | None, *, steps_per_batch: int = 1) -> Position:
        """Where the group stands once every rank has completed ``steps`` steps of the current pass
        (``None``: all of it), each of ``batch_size // steps_per_batch`` rows: Keras ``fit`` under
        ``MultiWorkerMirroredStrategy`` runs ``num_replicas_in_sync`` steps per element."""
        # The adapter cuts its own batches, so to the feed under it None is the whole pass.
        return self._feed.position(steps, steps_per_batch=steps_per_batch)

    def save(self, directory: str, steps: int | None, *, steps_per_batch: int = 1) -> None:
        """Write [`position`][ray_tfrecord.tf.ResumableFeed.position] into ``directory`` (a checkpoint's,
        before ``ray.train.report``) as ``feed.json``.  Count only steps that completed: their rows count as trained."""
        write_state(directory, saved_state(self._passes, self.position(steps, steps_per_batch=steps_per_batch)))

    def load(self, directory: str) -> int:
        """Continue from the position saved in ``directory``; return its epoch (the one to start
        at).  Raises ``ValueError`` if the checkpoint was taken with another seed, dataset, block_splits,
        transform or keep."""
        return self._feed.load(directory)
