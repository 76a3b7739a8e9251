"""A rank's passes over a resumable feed's epochs, as Arrow tables: ``Passes``, free of any framework.

Every row of each epoch reaches exactly one rank exactly once, counting the rows trained before and
after a restart, whatever the worker count after it.  The epoch's order is a pure function of
``seed`` and the epoch number (``order``): a seeded permutation of blocks of record-exact splits
(``splits``), contiguous shares per rank, a seeded shuffle inside each block.  The ranks step in
lockstep, so the rows the group has fed after ``k`` steps are known on every rank
(``Passes.position``), and a pass continues from any such position.

The reads are Ray tasks, each a run of consecutive pieces of about 16 MB, fetched in order.  Without a
transform they are plain tasks, ``TASKS_AHEAD`` in flight beyond the one being fed; with one, each
epoch is a Ray Data execution (``map_batches``, the transform's resources and actor pools), whose
first batch takes seconds.  Since the next epoch's rows are known, its reads start on a thread while
the current epoch's last quarter is fed (``AHEAD_PART``), and a ``Passes.restore`` that moves the
position drops them.  ``ray_tfrecord._src.tf.resume.ResumableFeed`` is the ``tf.data`` adapter over
this.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from ray_tfrecord._src.data import progress
from ray_tfrecord._src.data.feed.order import Assignment, Position, assign, mix_blocks
from ray_tfrecord._src.data.feed.splits import PieceReader, SplitPlan, group_pieces, read_group
from ray_tfrecord._src.data.feed.transforms import (
    WEIGHT_COLUMN,
    ClassTransform,
    FunctionTransform,
    TransformError,
    describe,
)
from ray_tfrecord._src.data.task_errors import fetched

#: A transform: a function of a batch, or a callable class that Ray Data runs on an actor pool.
Transform = Callable[..., Any] | type
#: A ``keep`` predicate: one bool per row of a batch.
Keep = Callable[[Any], Any]

# Read tasks of a pass without a transform in flight beyond the one being fed.
TASKS_AHEAD = 2
# The next epoch's reads start once this part of the current one (or AHEAD_FETCHES fetches, if
# more) is left to feed: its start-up and first block's decode (a block is a sixth to a fifth of a
# rank's epoch in make bench's resume section) then overlap the current epoch's end. Chosen while
# the reads were a Ray Data execution: at 2 fetches left, the 2-worker drain ran at 0.83x the
# streaming feed; at a quarter, 0.91x; at half, 0.93x, but Keras fit dropped to 0.77x, the two
# executions' reads competing with TensorFlow for the CPUs.
AHEAD_PART = 4
AHEAD_FETCHES = 2
# map_batches options the feed sets itself.
_OWN_OPTIONS = ("fn", "fn_args", "fn_kwargs", "fn_constructor_args")

#: One epoch's part of a pass: where it starts, the epoch's assignment, and the steps taken of it.
Segment = tuple[Position, Assignment, int]


class Passes:
    """Rank ``rank`` of ``world_size``'s passes over ``plan``: ``tables(fetch_rows)`` is one pass,
    ``batch_size`` rows a step, tables of ``fetch_rows`` rows (the last shorter), each with
    ``WEIGHT_COLUMN`` (0 on the padding that evens the ranks' step counts).  ``columns`` are read (all
    of the plan's with a transform, whose output decides)."""

    def __init__(
        self, plan: SplitPlan, *, columns: Sequence[str], batch_size: int, seed: int, shuffle_rows: bool,
        block_splits: int, rank: int, world_size: int, transform: Transform | None = None,
        transform_options: Mapping[str, Any] | None = None, keep: Keep | None = None, caller: str = "ResumableFeed",
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if plan.rows == 0:
            raise ValueError("the plan has no rows: plan_splits found only empty files")
        options = dict(transform_options or {})
        if transform is None and options:
            raise ValueError("transform_options= without transform=: pass the transform too")
        if bad := [k for k in _OWN_OPTIONS if k in options]:
            raise ValueError(f"transform_options may not set {bad}: the feed passes the batch itself; use "
                             "fn_constructor_kwargs= for a class's arguments")
        progress.preflight(caller, _transform_holders(transform, options),
                           fix=f"{caller}(transform_options={{{{'num_cpus': {{cpus}}}}}})")
        self.plan, self.batch_size, self.seed, self.shuffle_rows = plan, batch_size, seed, shuffle_rows
        self.block_splits = block_splits if shuffle_rows else 1
        self.rank, self.world_size = rank, world_size
        self.columns = tuple(columns)
        self._blocks = tuple(mix_blocks(len(plan.splits), self.block_splits))
        self._block_rows = [sum(plan.splits[i].rows for i in b) for b in self._blocks]
        self._transform, self._transform_options, self._keep = transform, options, keep
        self._next = Position(0)
        self._until: int | None = None
        self._current: list[Segment] | None = None
        self._ahead: _Ahead | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next pass feeds (or the one being fed)."""
        return self._current[0][0].epoch if self._current else self._next.epoch

    def run_until(self, epochs: int) -> None:
        """Make every pass a whole epoch's steps, continuing across epoch ends, and the last one end
        at the start of epoch ``epochs``."""
        if epochs <= 0:
            raise ValueError(f"epochs must be positive, got {epochs}")
        self._until = epochs

    def steps(self) -> int:
        """Steps every rank runs in the pass being fed, or in the next one."""
        return sum(take for _, _, take in (self._current or self._segments(self._next)))

    def position(self, steps: int | None, *, steps_per_batch: int = 1) -> Position:
        """Where the group stands once every rank has completed ``steps`` steps of the current pass
        (``None``: all of it), each of ``batch_size // steps_per_batch`` rows."""
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

    def restore(self, position: Position) -> None:
        """Continue from ``position``; reads started ahead are dropped."""
        self._next, self._current, self._ahead = position, None, None

    def identity(self) -> dict[str, Any]:
        """What a saved position is valid for: another seed, plan, block, transform or keep orders the
        epochs differently."""
        return {"seed": self.seed, "shuffle": self.shuffle_rows, "dataset": self.plan.fingerprint(),
                "mix": self.block_splits, "transform": describe(self._transform), "keep": describe(self._keep)}

    def first_table(self, fetch_rows: int) -> pa.Table:
        """The next pass's first table, read and dropped: a transform's output columns.  The reads stop
        there: a Ray Data execution kept for the first pass would hold its actors' CPUs meanwhile, and
        another feed of the process, reading first, could wait for them forever (two feeds on a
        cluster without a spare CPU)."""
        reads = self._reads(*self._segments(self._next)[0], fetch_rows)
        try:
            return next(reads)
        finally:
            reads.close()

    def tables(self, fetch_rows: int) -> Iterator[pa.Table]:
        """One pass, read in order, the reads of each epoch it takes steps of started apart; once a
        quarter of one is left (``AHEAD_PART``), the next one starts reading."""
        segments = self._segments(self._next)
        self._current = segments
        self._next = (segments[-1][0].after(segments[-1][1], segments[-1][2], self.batch_size) if segments
                      else self._next)
        following = [*segments[1:], *self._segments(self._next)[:1]]
        # A transformed feed reads ahead only within its pass, for the same reason as first_table;
        # plain read tasks end when their table is made, and hold no CPU while it waits.
        last_ahead = len(following) if self._transform is None else len(segments) - 1
        for i, (start, assignment, take) in enumerate(segments):
            key = (start, assignment, take, fetch_rows)
            ahead, self._ahead = self._ahead, None
            tables = ahead.tables() if ahead is not None and ahead.key == key else self._reads(*key)
            left = take * self.batch_size
            for table in tables:
                left -= table.num_rows
                if left <= max(AHEAD_FETCHES * fetch_rows, take * self.batch_size // AHEAD_PART) \
                        and self._ahead is None and i < last_ahead:
                    self._ahead = _Ahead((*following[i], fetch_rows), self._reads(*following[i], fetch_rows))
                yield table

    def _assignment(self, position: Position) -> Assignment:
        return assign(position.epoch_pieces(self._block_rows, self.seed), self.world_size, self.batch_size)

    def _segments(self, position: Position) -> list[Segment]:
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
                             shuffle=self.shuffle_rows, columns=self.columns, weight_column=WEIGHT_COLUMN,
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
        return rebatched(_padded(fed, padding) if padding > 0 else fed, fetch_rows)

    def _transformed(self, tables: ray.data.Dataset, epoch: int) -> ray.data.Dataset:
        options = {"batch_format": "pyarrow", **self._transform_options}
        if isinstance(self._transform, type):
            options["fn_constructor_kwargs"] = {
                "cls": self._transform, "keep": self._keep, "epoch": epoch, "args": (),
                "kwargs": options.pop("fn_constructor_kwargs", None) or {}}
            return tables.map_batches(ClassTransform, **options)
        return tables.map_batches(FunctionTransform(self._transform, self._keep, epoch), **options)


def _transform_holders(transform: Transform | None, options: Mapping[str, Any]) -> list[progress.Holder]:
    """The actors a class transform keeps while a pass reads: Ray Data's pool, of ``concurrency``
    actors (the low end of a range) with ``num_cpus`` each (Ray Data's default: 1)."""
    if not isinstance(transform, type):
        return []
    size = options.get("concurrency") or 1
    return [progress.Holder("transform actors", size[0] if isinstance(size, tuple) else int(size),
                            float(options.get("num_cpus", 1.0)), float(options.get("num_gpus", 0.0)))]


_read_task = ray.remote(read_group)


def _task_reads(reader: PieceReader, groups: Sequence[Any]) -> Iterator[pa.Table]:
    """Each group's table, in order, from plain Ray tasks, ``TASKS_AHEAD`` ahead of the one fed.
    Without a transform a Ray Data execution per pass adds nothing but its scheduling loop, which
    runs in the training process: 15% of a rank's CPU (py-spy, make bench's resume setup)."""
    shipped = ray.put(reader)
    pending: deque[ray.ObjectRef] = deque()
    for group in groups:
        pending.append(_read_task.remote(shipped, group))
        if len(pending) > TASKS_AHEAD:
            yield fetched(pending.popleft())
    while pending:
        yield fetched(pending.popleft())


def rebatched(tables: Iterable[pa.Table], rows: int) -> Generator[pa.Table, None, None]:
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
