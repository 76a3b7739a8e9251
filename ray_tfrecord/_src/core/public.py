"""Which public namespace a name belongs to: tracebacks, ``repr`` and pickles then read
``ray_tfrecord.CorruptRecordError``, not the private module that defines it.

Both namespaces resolve every name they export (``ray_tfrecord.__getattr__`` loads the lazy ones), so a
pickle by reference still finds the object. ``SplitPlan`` and ``plan_splits`` keep their module:
``ray_tfrecord.tf`` imports TensorFlow, which the read tasks that unpickle a plan need not have.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, TypeVar

T = TypeVar("T")

__all__ = ["public"]


def public(namespace: Literal["ray_tfrecord", "ray_tfrecord.tf"]) -> Callable[[T], T]:
    """Decorator: the class or function reports ``namespace``, where users import it from, as its module."""

    def mark(obj: T) -> T:
        obj.__module__ = namespace  # type: ignore[attr-defined]
        return obj

    return mark
