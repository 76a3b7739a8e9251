"""A training feed that resumes mid-epoch: :class:`ResumableFeed`.

Every row of each epoch reaches exactly one rank exactly once, counting the rows trained before and
after a restart, whatever the worker count after it.  The epoch's order is a pure function of
``seed`` and the epoch number (:mod:`ray_tfrecord.io.order`): a seeded permutation of record-exact
splits (:mod:`ray_tfrecord.io.splits`), contiguous shares per rank, a seeded shuffle inside each
split.  The ranks step in lockstep, so the rows the group has trained after ``k`` steps are known
on every rank: :meth:`ResumableFeed.save` writes that position into a checkpoint directory without
gathering anything, and :meth:`ResumableFeed.load` continues from it.
:class:`~ray_tfrecord.tf.checkpoint.ReportCheckpoint` does both for Keras ``fit``.

Each element is ``(features, label, weight)``: ``weight`` (float32, one per row) is 0 on padding
rows, which fill the last step of a rank whose share is short (equal batches on every rank keep
TensorFlow's collectives in step) and must not count: pass it as Keras's ``sample_weight`` (``fit``
does, given a 3-tuple) or multiply a custom loop's per-row loss by it.

The reads run in Ray Data tasks, each a run of consecutive pieces of about 16 MB, in order, and the Arrow batches become
tensors as :func:`~ray_tfrecord.tf.feed.tf_dataset` makes them.  Every epoch is a new Ray Data
execution, whose first batch takes seconds (``make bench --quick``: 1.5-1.8 s, most of a short
epoch); since the next epoch's rows are known, its execution starts on a thread while the current
epoch's last batches are fed, and a :meth:`ResumableFeed.load` that moves the position drops it.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
import ray
import ray.train
import tensorflow as tf

from ray_tfrecord.io.order import Assignment, Position, assign
from ray_tfrecord.io.splits import PieceReader, SplitPlan, group_pieces
from ray_tfrecord.tf.feed import table_batches
from ray_tfrecord.tf.tensors import column_plans

__all__ = ["FEED_FILE", "WEIGHT_COLUMN", "ResumableFeed"]

#: The feed's position inside a checkpoint directory (JSON).
FEED_FILE = "feed.json"
#: The weight column the read tasks add: 1 for the epoch's rows, 0 for padding.
WEIGHT_COLUMN = "__weight__"


def _group() -> tuple[int, int]:
    """This worker's (rank, world size) in a Ray Train run; (0, 1) outside one."""
    try:
        context = ray.train.get_context()
        return context.get_world_rank(), context.get_world_size()
    except (RuntimeError, DeprecationWarning):
        return 0, 1


class ResumableFeed:
    """This rank's batches of a :class:`~ray_tfrecord.io.splits.SplitPlan`, epoch after epoch,
    resumable at any completed step.

    Args:
        plan: The dataset's splits (:func:`~ray_tfrecord.io.splits.plan_splits`, on the driver; the
            plan travels in ``train_loop_config``).  Every rank must get the same plan.
        features, label: Column names, as for :func:`~ray_tfrecord.tf.feed.tf_dataset`; a label is
            needed since elements carry sample weights.
        batch_size: Rows per element from this rank (the global batch under
            ``MultiWorkerMirroredStrategy``, as for ``tf_dataset``).
        seed: Fixes every epoch's order: the same seed gives each rank the same rows in the same order.
        shuffle: Shuffle rows inside each split (seeded); the split order is always seeded.
        defaults: Values for null rows, as for ``tf_dataset``.
        rank, world_size: This rank and the group's size; by default Ray Train's (0 and 1 outside it).
        tf_prefetch: Batches TensorFlow keeps ready ahead of the training step.
    """

    def __init__(
        self, plan: SplitPlan, *, features: str | Sequence[str], label: str | Sequence[str], batch_size: int,
        seed: int = 0, shuffle: bool = True, defaults: Mapping[str, Any] | None = None, rank: int | None = None,
        world_size: int | None = None, tf_prefetch: int = tf.data.AUTOTUNE,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if plan.rows == 0:
            raise ValueError("the plan has no rows: plan_splits found only empty files")
        names = [features] if isinstance(features, str) else list(features)
        names += [label] if isinstance(label, str) else list(label)
        if WEIGHT_COLUMN in names or WEIGHT_COLUMN in plan.schema.names:
            raise ValueError(f"the column name {WEIGHT_COLUMN!r} is the feed's own weight column; rename the column")
        self.plan, self.batch_size, self.seed, self.shuffle = plan, batch_size, seed, shuffle
        self.rank, self.world_size = _group() if rank is None or world_size is None else (rank, world_size)
        schema = pa.schema([*(plan.schema.field(n) for n in dict.fromkeys(names) if n in plan.schema.names),
                            pa.field(WEIGHT_COLUMN, pa.float32())])
        self._plans = column_plans(schema, [*names, WEIGHT_COLUMN], defaults)
        self._columns = tuple(n for n in self._plans if n != WEIGHT_COLUMN)
        self._features, self._label, self._tf_prefetch = features, label, tf_prefetch
        self._next = Position(0)
        self._current: tuple[Position, Assignment] | None = None
        self._ahead: _Ahead | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next pass over :meth:`dataset` feeds (or the one being fed)."""
        return self._current[0].epoch if self._current is not None else self._next.epoch

    def dataset(self) -> tf.data.Dataset:
        """Elements ``(features, label, weight)``; each pass (each new iterator, as Keras makes
        per epoch) feeds the next epoch, the first one from the position :meth:`load` set."""
        return table_batches(self._epoch_tables, self._plans, features=self._features, label=self._label,
                             batch_size=self.batch_size, weight=WEIGHT_COLUMN, tf_prefetch=self._tf_prefetch)

    def steps(self) -> int:
        """Steps (elements) every rank runs in the epoch the next pass feeds, or is feeding."""
        if self._current is not None:
            return self._current[1].steps
        return self._assignment(self._next).steps

    def position(self, steps: int | None, *, steps_per_batch: int = 1) -> Position:
        """Where the group stands once every rank has completed ``steps`` steps of the current pass
        (``None``: all of it), each of ``batch_size // steps_per_batch`` rows: Keras ``fit`` under
        ``MultiWorkerMirroredStrategy`` runs ``num_replicas_in_sync`` steps per element."""
        if self._current is None:
            return self._next
        start, assignment = self._current
        if steps is None:
            return Position(start.epoch + 1)
        if self.batch_size % steps_per_batch:
            raise ValueError(f"batch_size={self.batch_size} does not split into {steps_per_batch} equal steps; "
                             f"pass a batch_size that is a multiple of {steps_per_batch}")
        return start.after(assignment, steps, self.batch_size // steps_per_batch)

    def save(self, directory: str, steps: int | None, *, steps_per_batch: int = 1) -> None:
        """Write :meth:`position` into ``directory`` (a checkpoint's, before ``ray.train.report``) as
        :data:`FEED_FILE`.  Count only steps that completed: their rows count as trained."""
        state = {"position": self.position(steps, steps_per_batch=steps_per_batch).to_json(),
                 "seed": self.seed, "shuffle": self.shuffle, "dataset": self.plan.fingerprint()}
        with open(os.path.join(directory, FEED_FILE), "w") as f:
            json.dump(state, f)

    def load(self, directory: str) -> int:
        """Continue from the position saved in ``directory``; return its epoch (the one to start
        at).  Raises ``ValueError`` if the checkpoint was taken with another seed or dataset."""
        with open(os.path.join(directory, FEED_FILE)) as f:
            state = json.load(f)
        if (state["dataset"], state["seed"], state["shuffle"]) != (self.plan.fingerprint(), self.seed, self.shuffle):
            raise ValueError(
                f"{os.path.join(directory, FEED_FILE)} was saved by a feed of seed={state['seed']}, "
                f"shuffle={state['shuffle']} over {state['dataset'][0]} splits of {state['dataset'][1]} rows; this "
                f"feed has seed={self.seed}, shuffle={self.shuffle}, {len(self.plan.splits)} splits of "
                f"{self.plan.rows} rows: pass the same seed= and plan, or start a new run name"
            )
        self._next, self._current, self._ahead = Position.from_json(state["position"]), None, None
        return self._next.epoch

    def _assignment(self, position: Position) -> Assignment:
        return assign(position.epoch_pieces(self.plan.split_rows, self.seed), self.world_size, self.batch_size)

    def _epoch_tables(self, fetch_rows: int) -> Iterator[pa.Table]:
        """One pass: this rank's share of the next epoch (or of its rest), read by Ray Data in order;
        once no more than ``_AHEAD_FETCHES`` fetches of it are left, the pass after it starts reading."""
        position = self._next
        assignment = self._assignment(position)
        self._current, self._next = (position, assignment), Position(position.epoch + 1)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.key == (position, fetch_rows):
            tables = ahead.tables()
        else:
            tables = self._reads(position, assignment, fetch_rows)
        left = assignment.steps * self.batch_size
        for table in tables:
            left -= table.num_rows
            if left <= _AHEAD_FETCHES * fetch_rows and self._ahead is None:
                following = self._next
                self._ahead = _Ahead((following, fetch_rows),
                                     self._reads(following, self._assignment(following), fetch_rows))
            yield table

    def _reads(self, position: Position, assignment: Assignment, fetch_rows: int) -> Iterator[pa.Table]:
        fallback = assignment.shares[0]
        groups = group_pieces(self.plan, assignment.pieces(self.rank, fallback))
        items = [{"pieces": [[s, lo, hi, w] for (s, lo, hi), w in group]} for group in groups]
        reads = ray.data.from_items(items, override_num_blocks=len(items))
        # The order is the position: Ray Data must hand the pieces out as listed.
        reads.context.execution_options.preserve_order = True
        reader = PieceReader(self.plan, position.epoch, self.seed, self.shuffle, self._columns, WEIGHT_COLUMN)
        tables = reads.map_batches(reader, batch_size=None, batch_format="pyarrow")
        # prefetch_batches: what tf_dataset's ray_prefetch_batches defaults to.
        return iter(tables.iter_batches(batch_size=fetch_rows, batch_format="pyarrow", drop_last=False,
                                        prefetch_batches=2))


# Fetches of an epoch still to feed when the next epoch's execution starts: by then the current
# one has read (nearly) all its rows, so the two do not compete for the read tasks' CPUs.
_AHEAD_FETCHES = 2


class _Ahead:
    """An epoch's reads whose first table is pulled on a thread, ahead of the pass that feeds it."""

    def __init__(self, key: tuple[Position, int], tables: Iterator[pa.Table]) -> None:
        self.key = key
        self._tables = tables
        self._head: list[pa.Table] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._pull, name="ResumableFeed-ahead", daemon=True)
        self._thread.start()

    def _pull(self) -> None:
        try:
            self._head.append(next(self._tables))
        except StopIteration:
            pass
        except BaseException as error:  # raised again in the pass that feeds the epoch
            self._error = error

    def tables(self) -> Iterator[pa.Table]:
        self._thread.join()
        if self._error is not None:
            raise self._error
        yield from self._head
        yield from self._tables
