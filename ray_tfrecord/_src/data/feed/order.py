"""The order of a resumable feed's epochs, and positions inside them, as plain arithmetic.

An epoch is a list of *pieces* ``(split, lo, hi)``: rows ``lo`` to ``hi`` (exclusive) of split number
``split`` of a ``SplitPlan``, taken in the split's seeded row order
(``row_order``).  The whole epoch ``e`` is every split once, in the permutation that
``(seed, e)`` gives (``epoch_pieces``).

The pieces are shared out to ``world_size`` ranks by ``assign``: cut as one stream into
contiguous shares of ``rows // world_size`` rows (the first ``rows % world_size`` ranks one more).
Every rank runs the same number of steps of ``batch_size`` rows: the largest share's, rounded up;
a rank whose share does not fill its last steps gets *padding* rows, copies of its own first rows
that carry weight 0, so that they are fed (the collectives need equal batches on every rank) but
not trained on.  Each row of the epoch thus reaches exactly one rank once with weight 1.

Since the ranks step in lockstep, the rows consumed after ``k`` completed steps are known on every
rank without asking the others: each rank's first ``k * rows_per_step`` rows.  ``Position.after``
is what remains, as pieces, in rank order; a restarted group of any size resumes with
``assign`` over them.

Example::

    >>> pieces = epoch_pieces([3, 4], seed=0, epoch=0)
    >>> a = assign(pieces, world_size=2, batch_size=2)
    >>> a.steps, [sum(hi - lo for _, lo, hi in p) for p in a.shares]
    (2, [4, 3])
    >>> Position(0, None).after(a, steps=1, rows_per_step=2).rows()
    3
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

SEED_COLUMN = "__seed__"
"""The per-row seed column a [`ResumableFeed`][ray_tfrecord.tf.ResumableFeed]'s transform receives
(``pa.uint64``): the same for a row of an epoch whatever the group size or resume point, so a random
augmentation seeded with it repeats exactly after a restart."""

#: ``(split, lo, hi)``: rows ``lo:hi`` of a split, in its seeded row order.
Piece = tuple[int, int, int]


def epoch_pieces(split_rows: Sequence[int], seed: int, epoch: int) -> list[Piece]:
    """Every non-empty split whole, in the order ``(seed, epoch)`` gives."""
    order = np.random.default_rng([seed, epoch]).permutation(len(split_rows))
    return [(int(i), 0, int(split_rows[i])) for i in order if split_rows[i]]


def row_order(rows: int, seed: int, epoch: int, split: int, *, shuffle: bool) -> np.ndarray:
    """The order a split's ``rows`` records are fed in: seeded per ``(seed, epoch, split)`` when
    ``shuffle``, else file order.  The shuffle buffer is one split."""
    if not shuffle:
        return np.arange(rows)
    return np.random.default_rng([seed, epoch, split]).permutation(rows)


def mix_blocks(splits: int, mix: int) -> list[tuple[int, ...]]:
    """The splits fed together as one *block*, whose rows are shuffled as one: ``mix`` splits a block
    (fewer in the last ones), taken at a stride over the file order, so that a block of a dataset sorted
    by files (``partition_cols``, or by user or time) holds rows from all over it.  ``mix=1``: a block
    per split.  Depends on the plan alone, never on the group, so that positions outlive its size."""
    if mix <= 0:
        raise ValueError(f"mix must be positive, got {mix}")
    count = -(-splits // mix)
    return [tuple(range(b, splits, count)) for b in range(count)]


#: SplitMix64's increment (2**64 / golden ratio): added between hashed parts, it keeps them apart.
GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: a bijection of uint64 that scatters nearby inputs (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def row_seeds(seed: int, epoch: int, split: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Each row's seed (uint64): a hash of ``(seed, epoch, split, row)``, the row's place in the data
    (its split of the plan and its record number inside the split), never its place in a rank's
    stream, so that the seeds of a row are the same whatever the world size or resume point."""
    with np.errstate(over="ignore"):
        key = np.zeros(1, np.uint64)
        for part in (seed, epoch):
            key = splitmix64(key + np.uint64(part & 0xFFFFFFFFFFFFFFFF) + GOLDEN)
        key = splitmix64(key + split.astype(np.uint64) + GOLDEN)
        return splitmix64(key + row.astype(np.uint64) + GOLDEN)


def _rows(pieces: Sequence[Piece]) -> int:
    return sum(hi - lo for _, lo, hi in pieces)


def _cut(pieces: Sequence[Piece], sizes: Sequence[int]) -> list[list[Piece]]:
    """``pieces`` as one stream, cut into consecutive parts of ``sizes`` rows."""
    parts: list[list[Piece]] = []
    stream = iter(pieces)
    current: Piece | None = None
    for size in sizes:
        part: list[Piece] = []
        while size:
            if current is None:
                current = next(stream)
            split, lo, hi = current
            take = min(size, hi - lo)
            part.append((split, lo, lo + take))
            size -= take
            current = None if lo + take == hi else (split, lo + take, hi)
        parts.append(part)
    return parts


@dataclass(frozen=True)
class Assignment:
    """One epoch (or the rest of one) shared out to the ranks of a group."""

    shares: list[list[Piece]]  # per rank, the rows it trains on, in order
    steps: int  # every rank's step count
    batch_size: int

    def padding(self, rank: int) -> int:
        """Rows of weight-0 padding that fill rank ``rank``'s last step."""
        return self.steps * self.batch_size - _rows(self.shares[rank])

    def pieces(self, rank: int, fallback: Sequence[Piece]) -> list[tuple[Piece, float]]:
        """Rank ``rank``'s pieces with their weight: its share (1.0), then padding (0.0) up to
        ``steps * batch_size`` rows, cycled from its share, or from ``fallback`` if it has none."""
        share = self.shares[rank]
        missing = self.padding(rank)
        source = share or list(fallback)
        padding: list[Piece] = []
        while missing > 0:
            cycle = _rows(source)
            padding += _cut(source, [min(missing, cycle)])[0]
            missing -= cycle
        return [(p, 1.0) for p in share] + [(p, 0.0) for p in padding]


def assign(pieces: Sequence[Piece], world_size: int, batch_size: int) -> Assignment:
    """Share ``pieces`` out to ``world_size`` ranks as contiguous, near-equal shares."""
    if world_size <= 0 or batch_size <= 0:
        raise ValueError(f"world_size and batch_size must be positive, got {world_size} and {batch_size}")
    total = _rows(pieces)
    sizes = [total // world_size + (r < total % world_size) for r in range(world_size)]
    return Assignment(_cut(pieces, sizes), math.ceil(sizes[0] / batch_size), batch_size)


@dataclass(frozen=True)
class Position:
    """Where a feed stands: ``epoch``, and the rows of it no rank has trained on yet (``pieces``,
    ``None`` for the whole epoch).  JSON-serializable through ``to_json``."""

    epoch: int
    pieces: tuple[Piece, ...] | None = None

    def rows(self) -> int | None:
        return None if self.pieces is None else _rows(self.pieces)

    def epoch_pieces(self, split_rows: Sequence[int], seed: int) -> list[Piece]:
        """The pieces still to feed in this position's epoch."""
        return epoch_pieces(split_rows, seed, self.epoch) if self.pieces is None else list(self.pieces)

    def after(self, assignment: Assignment, steps: int, rows_per_step: int) -> Position:
        """The position once every rank of ``assignment`` has completed ``steps`` steps of
        ``rows_per_step`` rows each (the next epoch's start once the shares are used up)."""
        done = steps * rows_per_step
        if steps < 0 or done > assignment.steps * assignment.batch_size:
            raise ValueError(f"{steps} steps of {rows_per_step} rows is outside this epoch's "
                             f"{assignment.steps} steps of {assignment.batch_size} rows")
        rest = [p for share in assignment.shares if _rows(share) > done
                for p in _cut(share, [done, _rows(share) - done])[1]]
        return Position(self.epoch, tuple(rest)) if rest else Position(self.epoch + 1)

    def to_json(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "pieces": None if self.pieces is None else [list(p) for p in self.pieces]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Position:
        pieces = data.get("pieces")
        if pieces is None:
            return cls(int(data["epoch"]))
        return cls(int(data["epoch"]), tuple((int(s), int(a), int(b)) for s, a, b in pieces))
