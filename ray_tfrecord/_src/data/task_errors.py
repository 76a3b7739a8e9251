"""Errors raised in Ray tasks, as the user should see them: a few lines naming the file,
offset and column, not Ray's traceback around them.

A task raises ``from_task`` of its ``TFRecordError``; an entry point that reports errors
itself (``write_tfrecords``, the CLI) takes the error back out of Ray's wrapper with
``task_cause``.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import RayTaskError, UserCodeException

from ray_tfrecord._src.core.errors import TFRecordError


# Ray formats an error raised in a task as the task's whole traceback, Ray Data's frames
# included, and logs it again as "internal code ... open an issue"; only a cause that is a
# ``UserCodeException`` gets Ray Data's frames hidden and the short log. There is no public
# way to mark an exception as the user's data problem, so each error class gets a twin that
# is also a ``UserCodeException``, under the same name so that Ray shows
# ``RayTaskError(CorruptRecordError)``.
def _twin(cls: type[TFRecordError]) -> type[TFRecordError]:
    return type(cls.__name__, (cls, UserCodeException), {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__reduce__": lambda self: (_rebuild, (cls, self.__dict__)),
    })


def _subclasses(cls: type[TFRecordError]) -> list[type[TFRecordError]]:
    return [cls] + [s for sub in cls.__subclasses__() for s in _subclasses(sub)]


_TWINS: dict[type, type] = {cls: _twin(cls) for cls in _subclasses(TFRecordError)}
_BASES: dict[type, type] = {twin: cls for cls, twin in _TWINS.items()}


def _rebuild(cls: type[TFRecordError], state: dict, *, twin: bool = True) -> TFRecordError:
    error: TFRecordError = Exception.__new__(_TWINS[cls] if twin else cls)
    error.__dict__.update(state)
    error.args = (state["message"],)
    return error


def from_task(error: TFRecordError) -> TFRecordError:
    """``error``, to raise from inside a Ray task so that the driver's message is a few lines:
    Ray hides its own frames and does not call it an internal error. Still an instance of
    ``type(error)`` with the same ``path``, ``offset`` and ``column``; a subclass defined
    outside ``ray_tfrecord._src.core.errors`` has no twin and is returned as it is."""
    base = _BASES.get(type(error), type(error))
    return _rebuild(base, error.__dict__) if base in _TWINS else error


def task_cause(error: BaseException) -> TFRecordError | None:
    """The ``TFRecordError`` a Ray task raised, without Ray's traceback around it, for entry
    points that report errors themselves (``write_tfrecords``, the CLI); ``None`` when
    ``error`` is not a task's ``TFRecordError``."""
    cause = error
    while isinstance(cause, RayTaskError) and isinstance(cause.cause, BaseException):
        cause = cause.cause
    if cause is error or not isinstance(cause, TFRecordError):
        return None
    return _rebuild(_BASES.get(type(cause), type(cause)), cause.__dict__, twin=False)


def fetched(refs: Any) -> Any:
    """``ray.get(refs)``, a task's ``TFRecordError`` raised as itself (``task_cause``): for
    callers that run their own tasks and hand the results on."""
    try:
        return ray.get(refs)
    except RayTaskError as error:
        cause = task_cause(error)
        if cause is None:
            raise
        raise cause from None
