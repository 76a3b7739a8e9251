"""Jobs that cannot progress say so instead of waiting: a check of the cluster before a job starts
(``preflight``, with ``shrunk`` for actors whose CPUs the caller left at their default) and
a watchdog while it runs (``Watchdog``).

A Ray job waits without a word when its actors hold every CPU its tasks need: Ray keeps the tasks
pending, and Ray Data at most logs that the job "may hang forever". The check adds up what the
job's actors hold for its whole run plus one task and compares it with the cluster; the watchdog
stops a running job once, for ``stall_timeout`` seconds, no CPU was free for a task and none
was held by anything but the actors of the watched jobs.
"""

from __future__ import annotations

import ctypes
import dataclasses
import logging
import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from ray_tfrecord._src.core.errors import StallError
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data import compat

logger = logging.getLogger(__name__)

#: The environment variable read when ``set_stall_timeout`` was not called in the process (Ray
#: Train workers inherit it through ``env_vars=``): seconds, or ``off``.
STALL_TIMEOUT_ENV = "RAY_TFRECORD_STALL_TIMEOUT_S"
_DEFAULT_STALL_S = 120.0
_UNSET: Any = object()
_stall_s: Any = _UNSET
# A read, map or write task of Ray Data or of a feed: Ray Data's default, and the feed's plain tasks'.
TASK_CPUS = 1.0
_EPS = 1e-9


@public("ray_tfrecord")
def set_stall_timeout(seconds: float | None) -> None:
    """How long a job may make no progress, with nothing of it running, before it fails with
    [`StallError`][ray_tfrecord.StallError] (default 120 s, or ``RAY_TFRECORD_STALL_TIMEOUT_S``).

    ``None`` marks the process's jobs as waiting for an autoscaling cluster: the check before a job
    logs a warning instead of refusing, and the watchdog is off.
    """
    global _stall_s
    if seconds is not None and not seconds > 0:
        raise ValueError(f"set_stall_timeout: seconds={seconds!r}; pass a positive number, or None for a "
                         "cluster that is autoscaling")
    _stall_s = seconds


def stall_timeout() -> float | None:
    """The seconds ``set_stall_timeout`` set, else ``RAY_TFRECORD_STALL_TIMEOUT_S``, else 120;
    ``None``: waiting for autoscaling."""
    if _stall_s is not _UNSET:
        return float(_stall_s) if _stall_s is not None else None
    value = os.environ.get(STALL_TIMEOUT_ENV, "").strip().lower()
    if not value:
        return _DEFAULT_STALL_S
    if value in ("off", "none"):
        return None
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{STALL_TIMEOUT_ENV}={value!r}; set seconds, or off for a cluster that is "
                         "autoscaling") from None


@dataclass(frozen=True)
class Holder:
    """Actors a job keeps for its whole run: ``count`` of them, each holding ``cpus`` and ``gpus``."""

    what: str
    count: int
    cpus: float
    gpus: float = 0.0

    def __str__(self) -> str:
        gpus = f" + {self.gpus:g} GPU" if self.gpus else ""
        return f"{self.what} {self.count} x {self.cpus:g} CPU{gpus}"


#: Ray's checkpoint filter (Ray 2.60): while a checkpointed job runs again, an actor pool of at least
#: one actor filters the rows already written; Ray Data gives its actors the default 1 CPU.
CHECKPOINT_FILTER = Holder("Ray's checkpoint filter actor", 1, 1.0)


def checkpoint_holders(context: Any = None) -> list[Holder]:
    """What Ray's job checkpointing of ``context`` (default: the current one) holds: its filter actor,
    while a run of a checkpoint that holds records goes on."""
    config = compat.checkpoint_config(context)
    return [CHECKPOINT_FILTER] if config is not None and compat.checkpoint_started(config) else []


def _cpus(holders: Sequence[Holder]) -> float:
    return sum(h.count * h.cpus for h in holders)


def _gpus(holders: Sequence[Holder]) -> float:
    return sum(h.count * h.gpus for h in holders)


def _fitting(have_cpus: float, holder: Holder, others: float, task_cpus: float) -> float:
    """The CPUs per actor of ``holder`` that leave one task its CPUs beside ``others`` (negative: none)."""
    return math.floor(100 * (have_cpus - task_cpus - others) / holder.count) / 100


def shrunk(job: str, holder: Holder, others: Sequence[Holder], *, keyword: str,
           task_cpus: float = TASK_CPUS) -> Holder:
    """``holder`` with fewer CPUs per actor when the cluster cannot hold it, ``others`` and one task,
    but can with a fraction (or none: the actors then share the tasks' CPUs), said in one log line;
    else ``holder`` as it is. For actors whose CPUs the caller left at their default (``keyword``)."""
    if not ray.is_initialized():
        return holder
    have = ray.cluster_resources().get("CPU", 0.0)
    if holder.count * holder.cpus + _cpus(others) + task_cpus <= have + _EPS:
        return holder
    fitting = _fitting(have, holder, _cpus(others), task_cpus)
    if fitting < 0:
        return holder
    held = " and ".join([*(str(h) for h in others), f"one task {task_cpus:g} CPU"])
    logger.warning("%s: %s %d x %g CPU instead of %d x %g, so that %s fit on this %g-CPU cluster; pass "
                   "%s(%s=...) to choose", job, holder.what, holder.count, fitting, holder.count, holder.cpus, held,
                   have, job, keyword)
    return dataclasses.replace(holder, cpus=fitting)


def _cpu_fixes(holders: Sequence[Holder], have_cpus: float, task_cpus: float, fix: str | None,
               zero_ok: bool) -> list[str]:
    """The caller's keyword with the CPUs per actor of the first holder that fit (see
    ``preflight``), where some do, and the cluster that fits them all."""
    fixes = []
    if fix is not None and holders:
        fitting = _fitting(have_cpus, holders[0], _cpus(holders[1:]), task_cpus)
        if fitting > 0 or (fitting == 0 and zero_ok):
            fixes.append(fix.format(cpus=f"{fitting:g}"))
    need = math.ceil(_cpus(holders) + task_cpus - _EPS)
    return [*fixes, f"ray.init(num_cpus={need}) (or a cluster with that many CPUs)"]


def preflight(job: str, holders: Sequence[Holder], *, fix: str | None = None, zero_ok: bool = False,
              task_cpus: float = TASK_CPUS) -> None:
    """Raise ``StallError`` when the cluster cannot hold ``holders`` and one task of
    ``task_cpus`` at once, so that ``job`` would wait forever.

    ``fix`` is the caller's keyword that shrinks the first holder, with ``{cpus}`` for the CPUs per
    actor that fit (e.g. ``"inference(num_cpus={cpus})"``); 0 only where ``zero_ok`` (an actor that
    may share the CPUs of the tasks feeding it). Without Ray started nothing is checked:
    Ray then starts with every CPU of the machine. A job marked as waiting for autoscaling
    (``set_stall_timeout(None)``) gets a warning instead.
    """
    if not ray.is_initialized():
        return
    cluster = ray.cluster_resources()
    have_cpus, have_gpus = cluster.get("CPU", 0.0), cluster.get("GPU", 0.0)
    need_cpus, need_gpus = _cpus(holders) + task_cpus, _gpus(holders)
    if need_cpus <= have_cpus + _EPS and need_gpus <= have_gpus + _EPS:
        return
    held = ", ".join([*(str(h) for h in holders), f"one task {task_cpus:g} CPU"])
    if need_cpus > have_cpus + _EPS:
        short = f"{need_cpus:g} CPUs at once ({held}) and the cluster has {have_cpus:g}"
        fixes = _cpu_fixes(holders, have_cpus, task_cpus, fix, zero_ok)
    else:
        short = f"{need_gpus:g} GPUs at once ({held}) and the cluster has {have_gpus:g}"
        fixes = [f"ray.init(num_gpus={math.ceil(need_gpus - _EPS)}) (or a cluster with that many GPUs)"]
    message = f"{job} would wait forever: it needs {short}; pass {' or '.join(fixes)}"
    if stall_timeout() is None:
        logger.warning("%s. Starting anyway: set_stall_timeout(None) says the cluster is autoscaling", message)
        return
    raise StallError(message)


# A job inside another's block in the same thread (write_tfrecords inside inference) is the outer
# one's: watched once, its holders counted once.
_local = threading.local()
# The holders of every watched job running in this process: actors of one job starve the tasks of
# another (two feeds, a feed beside an inference), so "nothing ran" counts them all.
_watching: list[Watchdog] = []
_watching_lock = threading.Lock()


class Watchdog:
    """Fails the job run in its ``with`` block with ``StallError`` when, for
    ``stall_timeout`` seconds, less than a task's CPUs were free and every CPU that was not
    was held by the holders of the watched jobs: nothing else ran, so their tasks wait for them.

    The error is raised in the thread that entered the block, which must come back to Python now
    and then (Ray Data's consumer polls every 10 ms). A block inside another's in the same thread
    is the outer one's."""

    def __init__(self, job: str, holders: Sequence[Holder], *, waiting: str = "its tasks",
                 fix: str | None = None, zero_ok: bool = False, task_cpus: float = TASK_CPUS) -> None:
        self.job, self.holders, self.waiting, self.task_cpus = job, list(holders), waiting, task_cpus
        self.fix, self.zero_ok = fix, zero_ok
        self.message: str | None = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._target = 0
        self._lock = threading.Lock()

    def __enter__(self) -> Watchdog:
        seconds = stall_timeout()
        if seconds is not None and ray.is_initialized() and not getattr(_local, "watched", False):
            _local.watched = True
            self._target = threading.get_ident()
            with _watching_lock:
                _watching.append(self)
            self._thread = threading.Thread(target=self._watch, args=(seconds,), name=f"{self.job}-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> None:
        with self._lock:
            self._done.set()
            if self.message is not None and not isinstance(error, StallError):
                _raise_in(self._target, None)  # the job ended before the error reached it
        if self._thread is not None:
            self._thread.join()
            _local.watched = False
            with _watching_lock:
                _watching.remove(self)
        if self.message is not None and isinstance(error, StallError):
            raise StallError(self.message) from None

    def _watch(self, seconds: float) -> None:
        poll = min(1.0, seconds / 10)
        since = time.monotonic()
        while not self._done.wait(poll):
            with _watching_lock:
                holders = [h for w in _watching for h in w.holders]
            total, free = ray.cluster_resources(), ray.available_resources()
            free_cpus = free.get("CPU", 0.0)
            running = total.get("CPU", 0.0) - free_cpus - _cpus(holders)
            now = time.monotonic()
            if free_cpus + _EPS >= self.task_cpus or running + _EPS >= self.task_cpus:
                since = now  # a task can start, or one is running
            if now - since < seconds:
                continue
            message = self._explain(seconds, holders, total, free)
            with self._lock:
                if not self._done.is_set():
                    self.message = message
                    # The thread waits in Ray's code; an exception delivered to it stops the execution
                    # the way Ctrl-C does (Ray Data shuts its executor down), and __exit__ says why.
                    _raise_in(self._target, StallError)
            return

    def _explain(self, seconds: float, holders: Sequence[Holder], total: dict[str, float],
                 free: dict[str, float]) -> str:
        gib = 1024**3
        held = ", ".join(str(h) for h in holders) or "nothing of the watched jobs"
        fixes = _cpu_fixes(holders, total.get("CPU", 0.0), self.task_cpus, self.fix, self.zero_ok)
        return (f"{self.job} made no progress for {seconds:g} s: {self.waiting} wait for {self.task_cpus:g} CPU and "
                f"{free.get('CPU', 0.0):g} of the cluster's {total.get('CPU', 0.0):g} are free, the rest held by "
                f"{held} (GPUs free: {free.get('GPU', 0.0):g} of {total.get('GPU', 0.0):g}; object store memory "
                f"free: {free.get('object_store_memory', 0.0) / gib:.1f} of "
                f"{total.get('object_store_memory', 0.0) / gib:.1f} GiB). Pass {' or '.join(fixes)}; for a cluster "
                "that is autoscaling, set_stall_timeout(None)")


def _raise_in(thread: int, error: type[BaseException] | None) -> None:
    """Raise ``error`` in ``thread`` at its next Python instruction; ``None`` withdraws it."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread),
                                               ctypes.py_object(error) if error is not None else None)
