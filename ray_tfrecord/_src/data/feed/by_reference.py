"""A tuple that travels by object reference once it is large: ``StoredTuple``.

A ``SplitPlan`` goes to every training worker in
``train_loop_config`` and into every read task of every epoch; a plan of many thousands of splits
pickled into each of those is megabytes each time. Its splits are a ``StoredTuple``: pickled
while Ray runs, one of at least ``BY_REFERENCE_ITEMS`` items is put into Ray's object store once
(by the first process that pickles it, normally the driver) and travels as the object reference;
where it is unpickled it is fetched once per process (the last few are kept) and keeps that
reference, so pickling it again there (a worker's read tasks) sends the reference, not a new copy.
Smaller ones, and any without a running Ray, pickle as a plain tuple.
"""

from __future__ import annotations

from typing import Any

import ray

#: Items from which a StoredTuple travels by reference (a split pickles to about 100 bytes).
BY_REFERENCE_ITEMS = 1024


class StoredTuple(tuple):
    """A ``tuple`` in every way but pickling (see the module docstring)."""

    _ref: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        if len(self) < BY_REFERENCE_ITEMS or not ray.is_initialized():
            return StoredTuple, (tuple(self),)
        if self._ref is None:
            self._ref = ray.put(tuple(self))
        return _fetched, (self._ref,)


# The tuples this process fetched, newest last: a worker unpickles the same plan for every task.
_FETCHED: dict[str, StoredTuple] = {}
_FETCHED_KEPT = 4


def _fetched(ref: Any) -> StoredTuple:
    key = ref.hex()
    stored = _FETCHED.pop(key, None)
    if stored is None:
        stored = StoredTuple(ray.get(ref))
        stored._ref = ref
    _FETCHED[key] = stored
    while len(_FETCHED) > _FETCHED_KEPT:
        del _FETCHED[next(iter(_FETCHED))]
    return stored
