"""The resumable feed for any training loop: ``ResumableFeed``, batches of NumPy arrays (or Arrow
tables) over ``Passes``, its position saved as plain data.

Every row of each epoch reaches exactly one rank exactly once, counting the rows trained before and
after a restart, whatever the worker count after it (``passes``, ``order``).  The ranks step in
lockstep, so the rows the group has trained after ``k`` steps are known on every rank, and rank 0
saves them without gathering: ``state_dict`` (a JSON-able dict for any checkpoint) or ``save`` (the
``feed.json`` file that ``ray_tfrecord._src.tf.resume``, the ``tf.data`` adapter over this feed,
writes and reads too).  Nothing here imports TensorFlow: a JAX or PyTorch worker loads this alone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.core.types import single_chunk
from ray_tfrecord._src.data.feed.order import SEED_COLUMN, Position
from ray_tfrecord._src.data.feed.passes import Keep, Passes, Transform, rebatched
from ray_tfrecord._src.data.feed.splits import SplitPlan
from ray_tfrecord._src.data.feed.transforms import WEIGHT_COLUMN

#: The feed's position inside a checkpoint directory (JSON).
FEED_FILE = "feed.json"
# Rows a pass's reads are cut to before the batches are sliced out of them: a transform's Ray Data
# execution hands its output over in batches of this many rows (tf_dataset's fetch size).
_FETCH_ROWS = 4096

#: What a batch is: a dict of NumPy arrays, or one Arrow table (Ray's ``batch_format`` names).
BatchFormat = Literal["numpy", "pyarrow"]
Batch: TypeAlias = dict[str, np.ndarray] | pa.Table


def worker_group() -> tuple[int, int]:
    """This worker's (rank, world size) in a Ray Train run; (0, 1) outside one (driver, Ray task, Tune function).

    Ray Train v2 raises RuntimeError outside a training function, and DeprecationWarning inside a
    plain Tune function: both mean no peers share a collective with this process.  Ray Train is
    imported here, when asked: it costs seconds, which a process that names its rank never pays.
    """
    import ray.train

    try:
        context = ray.train.get_context()
        return context.get_world_rank(), context.get_world_size()
    except (RuntimeError, DeprecationWarning):
        return 0, 1


@public("ray_tfrecord")
class ResumableFeed:
    """This rank's batches of a [`SplitPlan`][ray_tfrecord.SplitPlan], epoch after epoch, resumable
    at any completed step, for any training loop (JAX, PyTorch, NumPy): no TensorFlow is imported.

    Each iteration over the feed is one pass: the next epoch, the first one from the position
    [`load_state_dict`][ray_tfrecord.ResumableFeed.load_state_dict] or
    [`load`][ray_tfrecord.ResumableFeed.load] set.  Every rank yields the same number of batches of
    exactly ``batch_size`` rows.  Each batch holds [`WEIGHT_COLUMN`][ray_tfrecord.WEIGHT_COLUMN]
    (float32): 1 for the epoch's rows, 0 for the padding that fills the last step of a rank whose
    share is short (equal batches keep the collectives in step) and for rows ``keep`` rejects.  A
    loop weights its per-row loss by it (``(w * loss).sum() / batch_size``); padding trained at
    weight 1 would train those rows twice.

    With ``batch_format="numpy"`` a batch is a dict of NumPy arrays: a scalar column is 1-D, a
    fixed-size list column (a ``tf.io.FixedLenFeature`` of shape ``[n]``, nested for more
    dimensions) an array of shape ``(batch_size, n, ...)``, bytes and strings object arrays, and a
    variable-length list column an object array of 1-D arrays (views of one buffer; Ray Data's
    NumPy batches hold them so too).  Pad or bucket those in the loop, or take
    ``batch_format="pyarrow"``: one ``pyarrow.Table`` a batch, whose list columns give their values
    and offsets (row splits) without a copy.

    Args:
        plan: The dataset's splits ([`plan_splits`][ray_tfrecord.plan_splits], on the driver; the
            plan travels in ``train_loop_config``).  Every rank must get the same plan.
        batch_size: Rows per batch from this rank.
        columns: The batches' columns besides the weight (``None``: every column the plan, or the
            transform, gives).
        seed: Fixes every epoch's order: the same seed gives each rank the same rows in the same order.
        shuffle_rows: Shuffle the rows inside each block (seeded); ``False``: each split's rows in file
            order, a split per block.
        defaults: Values for null rows (a feature missing from some records), one per column; a
            null left without one is refused, naming the column.
        rank: This rank; by default Ray Train's (0 outside it).
        world_size: The group's size; by default Ray Train's (1 outside it).
        block_splits: Splits whose rows are shuffled together (a *block*, taken at a stride over the
            files), so that the batches of a dataset sorted by files mix.  ``1``: each split alone.
        transform: Preprocessing run in the feed's Ray Data execution (``map_batches``), as for
            [`ray_tfrecord.tf.ResumableFeed`][ray_tfrecord.tf.ResumableFeed]: each batch carries
            [`SEED_COLUMN`][ray_tfrecord.SEED_COLUMN] and ``WEIGHT_COLUMN``, and the transform returns
            the same rows in the same order.
        transform_options: ``map_batches`` keywords for ``transform`` (``batch_format``, ``num_cpus``,
            ``concurrency``, ``fn_constructor_kwargs``...).
        include_paths: Add a ``path`` column (each row's file); partition columns are columns of the
            feed as they are of ``read_tfrecords``.
        keep: A predicate over a batch (after ``transform``): one bool per row; rows it rejects get
            weight 0, so every rank keeps its step count.
        batch_format: ``"numpy"`` (a dict of arrays) or ``"pyarrow"`` (a table).

    Example:
        ```python
        import numpy as np, pyarrow as pa, ray
        import ray_tfrecord

        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        rows = ray.data.from_arrow(pa.table({"id": np.arange(100)}))
        ray_tfrecord.write_tfrecords(rows, "/tmp/ids", mode="overwrite")
        feed = ray_tfrecord.ResumableFeed(ray_tfrecord.plan_splits("/tmp/ids"), batch_size=16, seed=1)
        trained = []
        for step, batch in enumerate(feed, 1):
            trained += batch["id"][batch[ray_tfrecord.WEIGHT_COLUMN] > 0].tolist()
            if step == 3:
                state = feed.state_dict()      # after 3 completed steps: a plain dict
                break
        again = ray_tfrecord.ResumableFeed(ray_tfrecord.plan_splits("/tmp/ids"), batch_size=16, seed=1)
        again.load_state_dict(state)
        trained += [i for b in again for i in b["id"][b[ray_tfrecord.WEIGHT_COLUMN] > 0].tolist()]
        assert sorted(trained) == list(range(100))
        ```
    """

    def __init__(
        self, plan: SplitPlan, *, batch_size: int, columns: str | Sequence[str] | None = None, seed: int = 0,
        shuffle_rows: bool = True, defaults: Mapping[str, Any] | None = None, rank: int | None = None,
        world_size: int | None = None, block_splits: int = 16, transform: Transform | None = None,
        transform_options: Mapping[str, Any] | None = None, keep: Keep | None = None, include_paths: bool = False,
        batch_format: BatchFormat = "numpy",
    ) -> None:
        if batch_format not in ("numpy", "pyarrow"):
            raise ValueError(f"batch_format={batch_format!r}; pass batch_format='numpy' or 'pyarrow'")
        available = plan.columns(include_paths=include_paths)
        for own in (WEIGHT_COLUMN, SEED_COLUMN):
            if own in available.names:
                raise ValueError(f"the column name {own!r} is the feed's own column; rename the dataset's column")
        names = None if columns is None else list(dict.fromkeys([columns] if isinstance(columns, str) else columns))
        if transform is None and names is not None and (missing := [n for n in names if n not in available.names]):
            raise ValueError(f"columns={missing} are not columns of the plan, which has {available.names}; pass "
                             "some of those, or a transform= that adds them")
        read = available.names if transform is not None or names is None else names
        rank, world_size = worker_group() if rank is None or world_size is None else (rank, world_size)
        self._passes = Passes(plan, columns=read, batch_size=batch_size, seed=seed, shuffle_rows=shuffle_rows,
                              block_splits=block_splits, rank=rank, world_size=world_size, transform=transform,
                              transform_options=transform_options, keep=keep)
        self.plan, self.batch_size, self.seed, self.shuffle_rows = plan, batch_size, seed, shuffle_rows
        self.block_splits, self.rank, self.world_size = self._passes.block_splits, rank, world_size
        self.batch_format: BatchFormat = batch_format
        #: The batches' columns read as stored (``None`` with a transform, whose output decides).
        self.schema = None if transform is not None else pa.schema(
            [available.field(n) for n in read] + [pa.field(WEIGHT_COLUMN, pa.float32())])
        self._names, self._defaults = names, dict(defaults or {})
        # Batches this feed has handed out of the pass being fed (None: it feeds no pass itself,
        # as under the tf.data adapter, which cuts its own batches).
        self._handed_out: int | None = None

    @property
    def epoch(self) -> int:
        """The epoch the next pass feeds (or the one being fed)."""
        return self._passes.epoch

    def __iter__(self) -> Iterator[Batch]:
        """One pass: this rank's batches of ``batch_size`` rows, in ``batch_format``."""
        self._handed_out = 0
        for table in rebatched(self._passes.tables(max(self.batch_size, _FETCH_ROWS - _FETCH_ROWS % self.batch_size)),
                               self.batch_size):
            batch = self._batch(table)
            # Counted before the loop gets it: while its step runs, the step counts as handed out.
            self._handed_out += 1
            yield batch

    def steps(self) -> int:
        """Batches (steps) every rank yields in the pass being fed, or in the next one."""
        return self._passes.steps()

    def _batch(self, table: pa.Table) -> Batch:
        names = [n for n in table.column_names if n != SEED_COLUMN] if self._names is None \
            else [*self._names, WEIGHT_COLUMN]
        missing = [n for n in names if n not in table.column_names]
        if missing:
            raise ValueError(f"columns={missing} are not among the transform's output columns "
                             f"{table.column_names}; pass some of those")
        columns = {n: _filled(n, single_chunk(table.column(n)), self._defaults) for n in names}
        if self.batch_format == "pyarrow":
            return pa.table(columns)
        return {n: as_numpy(c) for n, c in columns.items()}

    def run_until(self, epochs: int) -> None:
        """Make every pass a whole epoch's steps, continuing across epoch ends, and the last one end
        at the start of epoch ``epochs``: for a loop that keeps its first epoch's step count."""
        self._passes.run_until(epochs)

    def position(self, steps: int | None = None, *, steps_per_batch: int = 1) -> Position:
        """Where the group stands once every rank has completed ``steps`` steps of the current pass,
        each of ``batch_size // steps_per_batch`` rows; ``None``: the batches this feed has handed
        out of it (all of it, for a pass it does not feed itself)."""
        return self._passes.position(self._handed_out if steps is None else steps, steps_per_batch=steps_per_batch)

    def state_dict(self, steps: int | None = None) -> dict[str, Any]:
        """The group's position as a JSON-able dict, for any checkpoint (Ray Train's, Orbax's, a
        ``torch.save`` dict): the rows no rank has trained on, and what the position is valid for
        (seed, plan, ``block_splits``, transform, ``keep``).

        Args:
            steps: Steps of the current pass every rank has completed (count only those: their rows
                count as trained); by default the batches this feed has handed out, so call it after
                the step that trained the last one, or pass the count when batches are fetched ahead.
        """
        return saved_state(self._passes, self.position(steps))

    def load_state_dict(self, state: Mapping[str, Any]) -> int:
        """Continue from ``state`` (a [`state_dict`][ray_tfrecord.ResumableFeed.state_dict], or a
        ``feed.json`` read back); return its epoch, the one to start at.  Raises ``ValueError`` if it
        was taken with another seed, dataset, ``block_splits``, transform or ``keep``."""
        return self._restore(state, "the state")

    def save(self, directory: str, steps: int | None = None) -> None:
        """Write [`state_dict`][ray_tfrecord.ResumableFeed.state_dict] into ``directory`` (a
        checkpoint's, before ``ray.train.report``) as ``feed.json``, the file
        [`ray_tfrecord.tf.ResumableFeed`][ray_tfrecord.tf.ResumableFeed] writes: either feed loads it."""
        write_state(directory, self.state_dict(steps))

    def load(self, directory: str) -> int:
        """Continue from the ``feed.json`` in ``directory``; return its epoch (the one to start at).
        Raises ``ValueError`` as [`load_state_dict`][ray_tfrecord.ResumableFeed.load_state_dict] does."""
        path = os.path.join(directory, FEED_FILE)
        with open(path) as f:
            return self._restore(json.load(f), path)

    def _restore(self, state: Mapping[str, Any], where: str) -> int:
        saved = {"mix": 1, "transform": None, "keep": None, **{k: v for k, v in state.items() if k != "position"}}
        mine = self._passes.identity()
        if saved != mine:
            def said(d: Mapping[str, Any]) -> str:
                return (f"seed={d['seed']}, shuffle_rows={d['shuffle']}, block_splits={d['mix']}, "
                        f"transform={d['transform']}, keep={d['keep']} over {d['dataset'][0]} splits of "
                        f"{d['dataset'][1]} rows")
            raise ValueError(
                f"{where} was saved by a feed of {said(saved)}; this feed has {said(mine)}: pass the same seed=, "
                "shuffle_rows=, block_splits=, transform=, keep= and plan, or start a new run name")
        position = Position.from_json(state["position"])
        self._passes.restore(position)
        self._handed_out = None
        return position.epoch


def passes_of(feed: ResumableFeed) -> Passes:
    """The feed's passes, as Arrow tables of any size: for an adapter that cuts its own batches
    (the ``tf.data`` one)."""
    return feed._passes


def saved_state(passes: Passes, position: Position) -> dict[str, Any]:
    """``position`` and what it is valid for, as ``feed.json`` holds them."""
    return {"position": position.to_json(), **passes.identity()}


def write_state(directory: str, state: Mapping[str, Any]) -> None:
    with open(os.path.join(directory, FEED_FILE), "w") as f:
        json.dump(state, f)


def _filled(name: str, column: pa.Array, defaults: Mapping[str, Any]) -> pa.Array:
    if not column.null_count:
        return column
    if name not in defaults:
        raise ValueError(f"column {name!r} has {column.null_count} null rows in this batch (records without the "
                         f"feature); pass defaults={{{name!r}: value}} to fill them")
    return pc.fill_null(column, pa.scalar(defaults[name], column.type))


def as_numpy(column: pa.Array) -> np.ndarray:
    """An Arrow column of a batch as NumPy: fixed-size lists as more dimensions, variable-length lists
    as an object array of 1-D views, extension types (Ray's tensors) as they convert themselves."""
    kind = column.type
    if pa.types.is_fixed_size_list(kind):
        inner = as_numpy(column.flatten())
        return inner.reshape(len(column), kind.list_size, *inner.shape[1:])
    if pa.types.is_list(kind) or pa.types.is_large_list(kind):
        offsets = column.offsets.to_numpy()
        parts = np.split(as_numpy(column.flatten()), offsets[1:-1] - offsets[0])
        ragged = np.empty(len(column), object)
        for i, part in enumerate(parts):  # not ragged[:] = parts: equal lengths would make a 2-D array
            ragged[i] = part
        return ragged
    return column.to_numpy(zero_copy_only=False)
