"""Which public namespace a name belongs to: tracebacks, ``repr`` and pickles then read
``ray_tfrecord.CorruptRecordError``, not the private module that defines it.

Both namespaces resolve every name they export (``ray_tfrecord.__getattr__`` loads the lazy ones), so a
pickle by reference still finds the object. A name both namespaces export (``SplitPlan``,
``plan_splits``) reports ``ray_tfrecord``: ``ray_tfrecord.tf`` imports TensorFlow, which the read tasks
and the framework-free training workers that unpickle a plan need not have.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib import import_module
from typing import Any, Literal, TypeVar

T = TypeVar("T")


def public(namespace: Literal["ray_tfrecord", "ray_tfrecord.tf"]) -> Callable[[T], T]:
    """Decorator: the class or function reports ``namespace``, where users import it from, as its module."""

    def mark(obj: T) -> T:
        obj.__module__ = namespace  # type: ignore[attr-defined]
        return obj

    return mark


def lazy_names(namespace: str, modules: Mapping[str, str],
               scope: dict[str, Any]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A namespace's ``__getattr__`` and ``__dir__`` (PEP 562): each name of ``modules`` (name -> the
    module that defines it) is imported when first used and kept in ``scope``, the namespace's globals,
    whose ``__all__`` ``dir()`` lists too."""

    def getattr_(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {namespace!r} has no attribute {name!r}")
        value = scope[name] = getattr(import_module(modules[name]), name)
        return value

    def dir_() -> list[str]:
        return sorted({*scope, *scope["__all__"]})

    return getattr_, dir_
