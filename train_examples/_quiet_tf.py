"""Keeps TensorFlow's start-up banners (oneDNN, CUDA, CPU features) and its INFO logs off the
examples' console, and colour codes out of a log that is not a terminal.

TensorFlow prints the banners through C++ logging before ``TF_CPP_MIN_LOG_LEVEL`` takes effect,
so no setting hides them. Instead, file descriptor 2 goes to ``/dev/null`` while TensorFlow is
first imported and probes its devices: in the example's own process, and, through Ray's
``worker_process_setup_hook``, in every Ray worker that imports TensorFlow (workers that never
do pay nothing). Errors still surface: a failed import raises as usual once stderr is back.
Ray Train sets a worker's root logger to INFO, which would show TensorFlow's Python INFO logs
(each twice, through TensorFlow's handler and Ray's, and one per checkpoint through absl): both
loggers go back to what they show by default, WARNING and up.

To see all of it, set ``TF_CPP_MIN_LOG_LEVEL=0`` yourself: that explicit wish wins and nothing is
hidden. A higher level (``ps_trainer`` gives its tasks ``1``, which hides the servers' INFO lines) keeps
the banners hidden too.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import logging
import os
import re
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import ray.cloudpickle

_ASKED_FOR = "TF_CPP_MIN_LOG_LEVEL"


@contextlib.contextmanager
def _stderr_dropped() -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class _QuietLoader(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        with _stderr_dropped():
            self._loader.exec_module(module)
            # The CUDA probe logs on first device use, after the import proper.
            module.config.list_physical_devices()
        for name in ("tensorflow", "absl"):  # TensorFlow logs through both
            logging.getLogger(name).setLevel(logging.WARNING)


class _QuietFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _QuietLoader(spec.loader)
        return spec


def install() -> None:
    """Hide the banners of this process's first TensorFlow import, unless asked for."""
    if os.environ.get(_ASKED_FOR, "").strip() != "0" and "tensorflow" not in sys.modules:
        sys.meta_path.insert(0, _QuietFinder())


class _Uncoloured(logging.Filter):
    _ANSI = re.compile(r"\x1b\[[0-9;]*m")

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = self._ANSI.sub("", record.getMessage()), ()
        return True


def plain_log() -> None:
    """No colour codes in Ray's console lines when the output is not a terminal.

    Ray colours the ``(pid=...)`` prefix of every worker line and the dashboard's address
    whatever its output is; in a file or in the log of a ``ray job submit`` run they are noise.
    ``RAY_COLOR_PREFIX`` set by the caller wins."""
    if sys.stdout.isatty():
        return
    os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    for handler in logging.getLogger("ray").handlers:
        handler.addFilter(_Uncoloured())


def ray_runtime_env() -> dict[str, Any]:
    """``ray.init(runtime_env=...)`` that runs :func:`install` in every Ray worker."""
    # The workers cannot import this file by name (train_examples is no package): ship it by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    return {"worker_process_setup_hook": install}
