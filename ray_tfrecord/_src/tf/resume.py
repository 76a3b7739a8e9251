"""A training feed that resumes mid-epoch: ``ResumableFeed``.

Every row of each epoch reaches exactly one rank exactly once, counting the rows trained before and
after a restart, whatever the worker count after it.  The epoch's order is a pure function of
``seed`` and the epoch number (``ray_tfrecord._src.io.order``): a seeded permutation of record-exact
splits (``ray_tfrecord._src.io.splits``), contiguous shares per rank, a seeded shuffle inside each
split.  The ranks step in lockstep, so the rows the group has trained after ``k`` steps are known
on every rank: ``ResumableFeed.save`` writes that position into a checkpoint directory without
gathering anything, and ``ResumableFeed.load`` continues from it.
``ReportCheckpoint`` does both for Keras ``fit``, in one ``fit``
call across restarts (``ResumableFeed.run_until``).

Splits are shuffled in blocks of ``mix`` splits taken at a stride over the files, so that batches
of a dataset sorted by files mix (``mix_blocks``).  A ``transform`` runs
in the feed's Ray Data execution, one row out per row in (``ray_tfrecord._src.io.transforms``); each
row carries a seed of its own (``SEED_COLUMN``), the same whatever the group or resume point.

Each element is ``(features, label, weight)``: ``weight`` (float32, one per row) is 0 on padding
rows, which fill the last step of a rank whose share is short (equal batches on every rank keep
TensorFlow's collectives in step) and must not count: pass it as Keras's ``sample_weight`` (``fit``
does, given a 3-tuple) or multiply a custom loop's per-row loss by it.

The reads are Ray tasks, each a run of consecutive pieces of about 16 MB, fetched in order, and the
Arrow batches become tensors as ``tf_dataset`` makes them.  Without a
transform they are plain tasks, ``_TASKS_AHEAD`` in flight beyond the one being fed; with one, each
epoch is a Ray Data execution (``map_batches``, the transform's resources and actor pools), whose
first batch takes seconds.  Since the next epoch's rows are known, its reads start on a thread while
the current epoch's last quarter is fed, and a ``ResumableFeed.load`` that moves the position
drops them.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import ray
import ray.train
import tensorflow as tf

from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.io import progress
from ray_tfrecord._src.io.order import SEED_COLUMN, Assignment, Position, assign, mix_blocks
from ray_tfrecord._src.io.splits import PieceReader, SplitPlan, group_pieces, read_group
from ray_tfrecord._src.io.task_errors import fetched
from ray_tfrecord._src.io.transforms import WEIGHT_COLUMN, ClassTransform, FunctionTransform, TransformError, describe
from ray_tfrecord._src.tf.distribution import worker_group
from ray_tfrecord._src.tf.pipeline import Batching, table_batches
from ray_tfrecord._src.tf.tensors import column_plans

__all__ = ["FEED_FILE", "SEED_COLUMN", "WEIGHT_COLUMN", "ResumableFeed", "TransformError"]

#: The feed's position inside a checkpoint directory (JSON).
FEED_FILE = "feed.json"

# map_batches options the feed sets itself.
_OWN_OPTIONS = ("fn", "fn_args", "fn_kwargs", "fn_constructor_args")


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
        seed: Fixes every epoch's order: the same seed gives each rank the same rows in the same order.
        shuffle: Shuffle rows inside each split (seeded); the split order is always seeded.
        defaults: Values for null rows, as for ``tf_dataset``.
        rank: This rank; by default Ray Train's (0 outside it).
        world_size: The group's size; by default Ray Train's (1 outside it).
        tf_prefetch: Batches TensorFlow keeps ready ahead of the training step.
        mix: Splits whose rows are shuffled together (a *block*, taken at a stride over the files),
            so that the batches of a dataset sorted by
            files mix; a read task holds a block decoded (``mix`` times the plan's ``split_bytes``).
            ``1``: each split alone.  Only with ``shuffle``.
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
        batch_size: int,
        seed: int = 0, shuffle: bool = True, defaults: Mapping[str, Any] | None = None, rank: int | None = None,
        world_size: int | None = None, tf_prefetch: int = tf.data.AUTOTUNE, mix: int = 16,
        transform: Any = None, transform_options: Mapping[str, Any] | None = None, keep: Any = None,
        include_paths: bool = False,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if plan.rows == 0:
            raise ValueError("the plan has no rows: plan_splits found only empty files")
        names = [feature_columns] if isinstance(feature_columns, str) else list(feature_columns)
        names += [label_columns] if isinstance(label_columns, str) else list(label_columns)
        available = plan.columns(include_paths=include_paths)
        for own in (WEIGHT_COLUMN, SEED_COLUMN):
            if own in available.names:
                raise ValueError(f"the column name {own!r} is the feed's own column; rename the dataset's column")
        options = dict(transform_options or {})
        if transform is None and options:
            raise ValueError("transform_options= without transform=: pass the transform too")
        if bad := [k for k in _OWN_OPTIONS if k in options]:
            raise ValueError(f"transform_options may not set {bad}: the feed passes the batch itself; use "
                             "fn_constructor_kwargs= for a class's arguments")
        progress.preflight("ResumableFeed", _transform_holders(transform, options),
                           fix="ResumableFeed(transform_options={{'num_cpus': {cpus}}})")
        self.plan, self.batch_size, self.seed, self.shuffle = plan, batch_size, seed, shuffle
        self.mix = mix if shuffle else 1
        self._blocks = tuple(mix_blocks(len(plan.splits), self.mix))
        self._block_rows = [sum(plan.splits[i].rows for i in b) for b in self._blocks]
        self._transform, self._transform_options, self._keep = transform, options, keep
        self.rank, self.world_size = worker_group() if rank is None or world_size is None else (rank, world_size)
        read = [n for n in dict.fromkeys(names) if n in available.names]
        self._columns = tuple(read if transform is None else available.names)
        self._schema = pa.schema([available.field(n) for n in read] + [pa.field(WEIGHT_COLUMN, pa.float32())])
        self._names, self._defaults = names, defaults
        self._plans = None if transform is not None else column_plans(self._schema, [*names, WEIGHT_COLUMN],
                                                                          defaults)
        self._feature_columns, self._label_columns, self._tf_prefetch = feature_columns, label_columns, tf_prefetch
        self._next = Position(0)
        self._until: int | None = None
        self._current: list[tuple[Position, Assignment, int]] | None = None
        self._ahead: _Ahead | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next pass over [`dataset`][ray_tfrecord.tf.ResumableFeed.dataset] feeds (or the one
        being fed)."""
        return self._current[0][0].epoch if self._current else self._next.epoch

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
            # The reads stop at that table: a Ray Data execution kept for the first pass would hold
            # its actors' CPUs meanwhile, and another feed of the process, reading first, could wait
            # for them forever (two feeds on a cluster without a spare CPU).
            reads = self._reads(*self._segments(self._next)[0], batching.fetch_rows)
            try:
                schema = next(reads).schema
            finally:
                reads.close()
            plans = column_plans(schema, [*self._names, WEIGHT_COLUMN], self._defaults)
        else:
            plans = self._plans
            batching = Batching.fitting(plans.values(), self.batch_size)
        return table_batches(functools.partial(self._pass_tables, batching.fetch_rows), plans, batching,
                             feature_columns=self._feature_columns, label_columns=self._label_columns,
                             weight_column=WEIGHT_COLUMN, tf_prefetch=self._tf_prefetch)

    def run_until(self, epochs: int) -> None:
        """Make every pass a whole epoch's steps, continuing across epoch ends, and the last one end
        at the start of epoch ``epochs``: Keras ``fit`` keeps its first epoch's step count, so a
        resumed, shorter epoch would cut every later one short.
        [`ReportCheckpoint`][ray_tfrecord.tf.ReportCheckpoint] calls it with ``fit``'s ``epochs`` and stops
        ``fit`` there."""
        if epochs <= 0:
            raise ValueError(f"epochs must be positive, got {epochs}")
        self._until = epochs

    def steps(self) -> int:
        """Steps (elements) every rank runs in the pass being fed, or in the next one."""
        return sum(take for _, _, take in (self._current or self._segments(self._next)))

    def position(self, steps: int | None, *, steps_per_batch: int = 1) -> Position:
        """Where the group stands once every rank has completed ``steps`` steps of the current pass
        (``None``: all of it), each of ``batch_size // steps_per_batch`` rows: Keras ``fit`` under
        ``MultiWorkerMirroredStrategy`` runs ``num_replicas_in_sync`` steps per element."""
        if not self._current or steps is None:
            return self._next
        if self.batch_size % steps_per_batch:
            raise ValueError(f"batch_size={self.batch_size} does not split into {steps_per_batch} equal steps; "
                             f"pass a batch_size that is a multiple of {steps_per_batch}")
        for start, assignment, take in self._current:
            if steps <= take * steps_per_batch:
                return start.after(assignment, steps, self.batch_size // steps_per_batch)
            steps -= take * steps_per_batch
        raise ValueError(f"{steps} steps past the end of this pass of {self.steps()} batches")

    def save(self, directory: str, steps: int | None, *, steps_per_batch: int = 1) -> None:
        """Write [`position`][ray_tfrecord.tf.ResumableFeed.position] into ``directory`` (a checkpoint's,
        before ``ray.train.report``) as ``feed.json``.  Count only steps that completed: their rows count as trained."""
        state = {"position": self.position(steps, steps_per_batch=steps_per_batch).to_json(), **self._identity()}
        with open(os.path.join(directory, FEED_FILE), "w") as f:
            json.dump(state, f)

    def load(self, directory: str) -> int:
        """Continue from the position saved in ``directory``; return its epoch (the one to start
        at).  Raises ``ValueError`` if the checkpoint was taken with another seed, dataset, mix,
        transform or keep."""
        with open(os.path.join(directory, FEED_FILE)) as f:
            state = json.load(f)
        saved = {"mix": 1, "transform": None, "keep": None, **{k: v for k, v in state.items() if k != "position"}}
        mine = self._identity()
        if saved != mine:
            def said(d: dict[str, Any]) -> str:
                return (f"seed={d['seed']}, shuffle={d['shuffle']}, mix={d['mix']}, transform={d['transform']}, "
                        f"keep={d['keep']} over {d['dataset'][0]} splits of {d['dataset'][1]} rows")
            raise ValueError(
                f"{os.path.join(directory, FEED_FILE)} was saved by a feed of {said(saved)}; this feed has "
                f"{said(mine)}: pass the same seed=, mix=, transform=, keep= and plan, or start a new run name"
            )
        self._next, self._current, self._ahead = Position.from_json(state["position"]), None, None
        return self._next.epoch

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "shuffle": self.shuffle, "dataset": self.plan.fingerprint(), "mix": self.mix,
                "transform": describe(self._transform), "keep": describe(self._keep)}

    def _assignment(self, position: Position) -> Assignment:
        return assign(position.epoch_pieces(self._block_rows, self.seed), self.world_size, self.batch_size)

    def _segments(self, position: Position) -> list[tuple[Position, Assignment, int]]:
        """The pass from ``position``: ``(start, assignment, steps)`` per epoch it takes steps of."""
        if self._until is None:
            assignment = self._assignment(position)
            return [(position, assignment, assignment.steps)]
        left = self._assignment(Position(position.epoch)).steps
        segments = []
        while left and position.epoch < self._until:
            assignment = self._assignment(position)
            take = min(left, assignment.steps)
            segments.append((position, assignment, take))
            position, left = position.after(assignment, take, self.batch_size), left - take
        return segments

    def _pass_tables(self, fetch_rows: int) -> Iterator[pa.Table]:
        """One pass, read in order, the reads of each epoch it takes steps of started apart; once a
        quarter of one is left (``_AHEAD_PART``), the next one starts reading."""
        segments = self._segments(self._next)
        self._current = segments
        self._next = (segments[-1][0].after(segments[-1][1], segments[-1][2], self.batch_size) if segments
                      else self._next)
        following = [*segments[1:], *self._segments(self._next)[:1]]
        # A transformed feed reads ahead only within its pass, for the same reason as in dataset();
        # plain read tasks end when their table is made, and hold no CPU while it waits.
        last_ahead = len(following) if self._transform is None else len(segments) - 1
        for i, (start, assignment, take) in enumerate(segments):
            key = (start, assignment, take, fetch_rows)
            ahead, self._ahead = self._ahead, None
            tables = ahead.tables() if ahead is not None and ahead.key == key else self._reads(*key)
            left = take * self.batch_size
            for table in tables:
                left -= table.num_rows
                if left <= max(_AHEAD_FETCHES * fetch_rows, take * self.batch_size // _AHEAD_PART) \
                        and self._ahead is None and i < last_ahead:
                    self._ahead = _Ahead((*following[i], fetch_rows), self._reads(*following[i], fetch_rows))
                yield table

    def _reads(self, position: Position, assignment: Assignment, take: int,
               fetch_rows: int) -> Generator[pa.Table, None, None]:
        share = assignment.shares[self.rank]
        # The padding repeats the share's first rows, which this pass has just fed: they are copied
        # here, not read again (a block's decode per rank and epoch: make bench, resume section).
        # A rank with no share pads from another rank's, which its read tasks read.
        weighted = [(p, 1.0) for p in share] if share else assignment.pieces(self.rank, assignment.shares[0])
        # A pass that ends inside the epoch stops before the padding.
        padding = assignment.padding(self.rank) if share and take == assignment.steps else 0
        if take < assignment.steps:  # the pass ends inside this epoch: only its first steps' rows
            kept, rows = [], take * self.batch_size
            for (split, lo, hi), weight in weighted:
                if rows <= 0:
                    break
                kept.append(((split, lo, min(hi, lo + rows)), weight))
                rows -= hi - lo
            weighted = kept
        groups = [[[s, lo, hi, w] for (s, lo, hi), w in group] for group in group_pieces(self.plan, weighted,
                                                                                        self._blocks)]
        checked = self._transform is not None or self._keep is not None
        reader = PieceReader(plan=self.plan, blocks=self._blocks, seed=self.seed, epoch=position.epoch,
                             shuffle=self.shuffle, columns=self._columns, weight_column=WEIGHT_COLUMN,
                             with_seed_column=checked)
        if checked:
            reads = ray.data.from_items([{"pieces": g} for g in groups], override_num_blocks=len(groups))
            # The order is the position: Ray Data must hand the pieces out as listed.
            reads.context.execution_options.preserve_order = True
            tables = self._transformed(reads.map_batches(reader, batch_size=None, batch_format="pyarrow"),
                                       position.epoch)
            # prefetch_batches: tf_dataset's default.
            fed = _unwrapped(tables.iter_batches(batch_size=fetch_rows, batch_format="pyarrow", drop_last=False,
                                                 prefetch_batches=2))
        else:
            fed = _task_reads(reader, groups)
        # Cut to fetches here, after the padding: the share's last fetch is topped up with it.
        return _rebatched(_padded(fed, padding) if padding > 0 else fed, fetch_rows)

    def _transformed(self, tables: ray.data.Dataset, epoch: int) -> ray.data.Dataset:
        options = {"batch_format": "pyarrow", **self._transform_options}
        if isinstance(self._transform, type):
            options["fn_constructor_kwargs"] = {
                "cls": self._transform, "keep": self._keep, "epoch": epoch, "args": (),
                "kwargs": options.pop("fn_constructor_kwargs", None) or {}}
            return tables.map_batches(ClassTransform, **options)
        return tables.map_batches(FunctionTransform(self._transform, self._keep, epoch), **options)


def _transform_holders(transform: Any, options: Mapping[str, Any]) -> list[progress.Holder]:
    """The actors a class transform keeps while a pass reads: Ray Data's pool, of ``concurrency``
    actors (the low end of a range) with ``num_cpus`` each (Ray Data's default: 1)."""
    if not isinstance(transform, type):
        return []
    size = options.get("concurrency") or 1
    return [progress.Holder("transform actors", size[0] if isinstance(size, tuple) else int(size),
                            float(options.get("num_cpus", 1.0)), float(options.get("num_gpus", 0.0)))]


# Read tasks of a pass without a transform in flight beyond the one being fed.
_TASKS_AHEAD = 2
_read_task = ray.remote(read_group)


def _task_reads(reader: PieceReader, groups: Sequence[Any]) -> Iterator[pa.Table]:
    """Each group's table, in order, from plain Ray tasks, ``_TASKS_AHEAD`` ahead of the one fed.
    Without a transform a Ray Data execution per pass adds nothing but its scheduling loop, which
    runs in the training process: 15% of a rank's CPU (py-spy, make bench's resume setup)."""
    shipped = ray.put(reader)
    pending: deque[ray.ObjectRef] = deque()
    for group in groups:
        pending.append(_read_task.remote(shipped, group))
        if len(pending) > _TASKS_AHEAD:
            yield fetched(pending.popleft())
    while pending:
        yield fetched(pending.popleft())


def _rebatched(tables: Iterable[pa.Table], rows: int) -> Generator[pa.Table, None, None]:
    """``tables`` cut and joined into tables of ``rows`` rows, the last one shorter."""
    held: list[pa.Table] = []
    have = 0
    for table in tables:
        while table.num_rows:
            part = table.slice(0, rows - have)
            held.append(part)
            have += part.num_rows
            table = table.slice(part.num_rows)
            if have == rows:
                yield held[0] if len(held) == 1 else pa.concat_tables(held)
                held, have = [], 0
    if held:
        yield pa.concat_tables(held)


def _unwrapped(tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """``tables``, with a transform's ``TransformError`` raised as itself: Ray Data hands it
    over as text inside two wrappers and their stack traces."""
    try:
        yield from tables
    except Exception as error:
        found = re.search(rf"{TransformError.__name__}: (.*)", str(error))
        if found is None:
            raise
        raise TransformError(found.group(1)) from None


def _padded(tables: Iterable[pa.Table], rows: int) -> Iterator[pa.Table]:
    """``tables`` (a share), then ``rows`` rows of padding: the share's first rows over and over,
    with weight 0."""
    head: list[pa.Table] = []
    kept = 0
    for table in tables:
        if kept < rows:
            head.append(table.slice(0, rows - kept))
            kept += head[-1].num_rows
        yield table
    first = pa.concat_tables(head)
    index = first.schema.get_field_index(WEIGHT_COLUMN)
    first = first.set_column(index, first.schema.field(index), pa.array(np.zeros(first.num_rows, np.float32)))
    yield pa.concat_tables([first] * -(-rows // first.num_rows)).slice(0, rows)


# The next epoch's reads start once this part of the current one (or _AHEAD_FETCHES fetches, if
# more) is left to feed: its start-up and first block's decode (a block is a sixth to a fifth of a
# rank's epoch in make bench's resume section) then overlap the current epoch's end. Chosen while
# the reads were a Ray Data execution: at 2 fetches left, the 2-worker drain ran at 0.83x the
# streaming feed; at a quarter, 0.91x; at half, 0.93x, but Keras fit dropped to 0.77x, the two
# executions' reads competing with TensorFlow for the CPUs.
_AHEAD_PART = 4
_AHEAD_FETCHES = 2


class _Ahead:
    """An epoch's reads whose first table is pulled on a thread, ahead of the pass that feeds it."""

    def __init__(self, key: tuple[Any, ...], tables: Iterator[pa.Table]) -> None:
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
