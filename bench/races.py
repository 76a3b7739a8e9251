"""Many jobs, one dataset (issue 50), measured as the issue measured it: driver processes, each a Ray job of its
own on one Ray cluster (this process's), released at one instant by a barrier, writing and reading one dataset
on local disk, S3 (moto) and GCS (fake-gcs-server), the object stores behind bench/proxy.py adding 20 ms to every
request. Every write is 2,000 rows (4 files) with ids no other write has; each case runs ``BENCH_RACE_RUNS`` times
(default 5), each run on a fresh dataset. It prints the issue's table as Markdown, then the exact messages seen.

    python -m bench.races                              # every store and case
    python -m bench --only races --out ''              # the same, from the bench's runner
    BENCH_RACE_STORES=s3 BENCH_RACE_RUNS=2 python -m bench.races

The cases: 2 and 4 appends at once on a base of 2,000 rows (every id read back exactly once, or the run counts as
a loss); an append racing an overwrite (the ids read back are those of one serial order, and readable); polls
during overwrites (three overwrites one after another, while one driver polls ``read_tfrecords(...).count()``
and another reads every id with ``take_all``: an error, a count other than 2,000, or ids other than those of one
overwrite count against it), with the default ``keep_replaced_files=0`` and with 600 s; a read planned before an
overwrite and run after it (what it raises); 3 appends at once, each adding a column of its own (every row has
its writer's column, the others' null). Not a test of CI: tests/test_concurrent_writes.py asserts the same
outcomes, smaller.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import multiprocessing
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from bench.proxy import LatencyProxy
from tests.filesystems import fake_gcs, gcs_filesystem, moto_s3, s3_filesystem

ROWS = 2_000
FILES = 4
RUNS = int(os.environ.get("BENCH_RACE_RUNS", "5"))
STORES = tuple(s for s in os.environ.get("BENCH_RACE_STORES", "local,s3,gcs").split(",") if s)
LATENCY_S = 0.020
OVERWRITES = 3  # per polled run
BUCKET = "races"
DRIVERS = 4
_SCHEMES = {"local": "", "s3": "s3://", "gcs": "gs://"}
_SPAWN = multiprocessing.get_context("spawn")

Store = tuple[str, str]  # (kind, the local directory or the proxy's endpoint)


def _filesystem(store: Store) -> pafs.FileSystem:
    kind, where = store
    return {"local": lambda _: pafs.LocalFileSystem(), "s3": s3_filesystem, "gcs": gcs_filesystem}[kind](where)


def _uri(store: Store, name: str) -> str:
    kind, where = store
    return os.path.join(where, name) if kind == "local" else f"{_SCHEMES[kind]}{BUCKET}/{name}"


def _rows(first: int, column: str | None = None) -> Any:
    """2,000 rows of ids from ``first``, in ``FILES`` blocks; ``column``: with a column of that name, the id."""
    import ray

    ids = list(range(first, first + ROWS))
    step = ROWS // FILES
    tables = [pa.table({"id": ids[k:k + step], **({column: ids[k:k + step]} if column else {})})
              for k in range(0, ROWS, step)]
    return ray.data.from_arrow(tables).materialize()


def _ids(store: Store, name: str) -> list[int]:
    import ray

    import ray_tfrecord

    ds = ray_tfrecord.read_tfrecords(_uri(store, name), filesystem=_filesystem(store), columns=["id"])
    return sorted(i for t in ray.get(ds.to_arrow_refs()) for i in t.column("id").to_pylist())


# -- what the driver processes do ------------------------------------------------------------------

_PLANNED: dict[str, Any] = {}  # a driver's reads planned by one job and run by a later one


def job_write(store: Store, name: str, mode: str, first: int, *, barrier: Any = None, keep: float = 0.0,
              column: str | None = None) -> dict:
    """Write 2,000 rows from id ``first`` (and a ``column`` of them) with ``mode``, once every party of ``barrier``
    is ready."""
    import ray_tfrecord

    ds = _rows(first, column)
    fs = _filesystem(store)
    if barrier is not None:
        barrier.wait(timeout=300)
    result = ray_tfrecord.write_tfrecords(ds, _uri(store, name), filesystem=fs, mode=mode, keep_replaced_files=keep)
    return {"version": result.version, "retries": result.retries, "rows": result.num_rows}


def job_overwrites(store: Store, name: str, *, barrier: Any, stop: Any, keep: float) -> dict:
    """``OVERWRITES`` overwrites one after another, the k-th of ids from 2,000 k; then ``stop`` the pollers."""
    try:
        barrier.wait(timeout=300)
        for k in range(1, OVERWRITES + 1):
            job_write(store, name, "overwrite", k * ROWS, keep=keep)
    finally:
        stop.set()
    return {}


def job_poll(store: Store, name: str, rows: bool, *, barrier: Any, stop: Any) -> dict:
    """Poll the dataset until ``stop``: its ``count()``, or (``rows``) every id by ``take_all``. A good poll is
    2,000 rows, the ids of one write (2,000 consecutive ids from a multiple of 2,000)."""
    import ray_tfrecord

    fs = _filesystem(store)
    polls, bad, errors = 0, 0, []
    barrier.wait(timeout=300)
    while not stop.is_set():
        polls += 1
        try:
            ds = ray_tfrecord.read_tfrecords(_uri(store, name), filesystem=fs, columns=["id"])
            if rows:
                ids = sorted(r["id"] for r in ds.take_all())
                bad += not (len(ids) == ROWS and ids[0] % ROWS == 0 and ids[-1] - ids[0] == ROWS - 1
                            and len(set(ids)) == ROWS)
            else:
                bad += ds.count() != ROWS
        except Exception as e:  # what a user's poll would raise
            errors.append(_message(e))
    return {"polls": polls, "bad": bad, "errors": errors}


def job_plan(store: Store, name: str, *, barrier: Any) -> dict:
    """Plan a read of the dataset (``read_tfrecords`` reads its latest version), to run in a later job."""
    import ray_tfrecord

    _PLANNED[name] = ray_tfrecord.read_tfrecords(_uri(store, name), filesystem=_filesystem(store), columns=["id"])
    return {}


def job_run_planned(store: Store, name: str, *, barrier: Any) -> dict:
    """Run the read ``job_plan`` planned: its ``count()``, then its rows."""
    ds = _PLANNED.pop(name)
    out: dict[str, Any] = {}
    try:
        out["count"] = ds.count()
    except Exception as e:
        out["count_error"] = _message(e)
    try:
        out["rows"] = len(ds.take_all())
    except Exception as e:
        out["error"] = _message(e)
    return out


def _message(e: BaseException) -> str:
    """The error as a user reads it: the exception's type and its last line (Ray's task errors put the
    traceback of the task first and the wrapped error last)."""
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return f"{type(e).__name__}: {(lines[-1] if lines else '')[:2000]}"


def _quiet() -> None:
    """Ray Data's progress lines and the warning each poll gives while a write's staging directory is there (a
    write runs: that is the case measured) would bury the table."""
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message="skipped the staging directory")


def _driver(address: str, inbox: Any, outbox: Any) -> None:
    import ray

    _quiet()
    ray.init(address=address, log_to_driver=False)
    while (job := inbox.get()) is not None:
        fn, args, kwargs = job
        try:
            outbox.put(fn(*args, **kwargs))
        except Exception as e:
            outbox.put({"failed": _message(e)})
    ray.shutdown()


Job = tuple[Callable[..., dict], tuple, dict]


class _Drivers:
    """``DRIVERS`` driver processes, each a Ray job on the Ray at ``address``; ``run`` gives the first ones a job
    each, all released together by one barrier, and returns their results in order."""

    def __init__(self, manager: Any, address: str) -> None:
        self.manager = manager
        self._inboxes = [manager.Queue() for _ in range(DRIVERS)]
        self._outboxes = [manager.Queue() for _ in range(DRIVERS)]
        self._procs = [_SPAWN.Process(target=_driver, args=(address, i, o), daemon=True)
                       for i, o in zip(self._inboxes, self._outboxes)]
        for p in self._procs:
            p.start()

    def run(self, jobs: list[Job]) -> list[dict]:
        barrier = self.manager.Barrier(len(jobs))
        for inbox, (fn, args, kwargs) in zip(self._inboxes, jobs):
            inbox.put((fn, args, {**kwargs, "barrier": barrier}))
        return [self._outboxes[n].get(timeout=1800) for n in range(len(jobs))]

    def close(self) -> None:
        for inbox in self._inboxes:
            inbox.put(None)
        for p in self._procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


# -- the cases: each returns its cell and the messages it saw -----------------------------------------

def _counted(outcomes: collections.Counter[str]) -> str:
    return "; ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())) + f" (of {RUNS} runs)"


def _base(store: Store, name: str) -> str:
    """``name``, written afresh as the base every case starts from: ids 0 to 1,999."""
    job_write(store, name, "overwrite", 0)
    return name


def _appends(drivers: _Drivers, store: Store, writers: int) -> tuple[str, list[str]]:
    exact, retries, messages = 0, 0, []
    for run in range(RUNS):
        name = _base(store, f"appends-{writers}-{run}")
        results = drivers.run([(job_write, (store, name, "append", (w + 1) * ROWS), {}) for w in range(writers)])
        messages += [r["failed"] for r in results if "failed" in r]
        retries += sum(r.get("retries", 0) for r in results)
        try:
            exact += _ids(store, name) == list(range((writers + 1) * ROWS))
        except Exception as e:
            messages.append(_message(e))
    cell = f"{(writers + 1) * ROWS:,} ids, each once: {exact} of {RUNS} runs ({retries} commit retries)"
    return cell + (f"; **{len(messages)} errors**" if messages else ""), messages


def _append_vs_overwrite(drivers: _Drivers, store: Store) -> tuple[str, list[str]]:
    orders: collections.Counter[str] = collections.Counter()
    messages = []
    for run in range(RUNS):
        name = _base(store, f"mixed-{run}")
        results = drivers.run([(job_write, (store, name, "append", ROWS), {}),
                               (job_write, (store, name, "overwrite", 2 * ROWS), {})])
        messages += [r["failed"] for r in results if "failed" in r]
        try:
            ids = _ids(store, name)
        except Exception as e:
            orders["**unreadable**"] += 1
            messages.append(_message(e))
            continue
        if ids == list(range(2 * ROWS, 3 * ROWS)):
            orders["append, then overwrite"] += 1
        elif ids == list(range(ROWS, 3 * ROWS)):
            orders["overwrite, then append"] += 1
        else:
            orders[f"**no serial order ({len(ids)} rows)**"] += 1
    return _counted(orders) + (f"; **{len(messages)} errors**" if messages else ""), messages


def _polled(drivers: _Drivers, store: Store, keep: float) -> tuple[str, str, list[str]]:
    """Polls of ``count()`` and of every id while ``OVERWRITES`` overwrites (``keep_replaced_files=keep``) run."""
    totals = {False: [0, 0], True: [0, 0]}  # polls, bad ones
    errors: dict[bool, list[str]] = {False: [], True: []}
    for run in range(RUNS):
        name = _base(store, f"polled-{int(keep)}-{run}")
        stop = drivers.manager.Event()
        _, *polls = drivers.run([(job_overwrites, (store, name), {"stop": stop, "keep": keep}),
                                 (job_poll, (store, name, False), {"stop": stop}),
                                 (job_poll, (store, name, True), {"stop": stop})])
        for rows, poll in zip((False, True), polls):
            if "failed" in poll:
                errors[rows].append(poll["failed"])
                continue
            totals[rows][0] += poll["polls"]
            totals[rows][1] += poll["bad"]
            errors[rows] += poll["errors"]

    def cell(rows: bool) -> str:
        polls, bad = totals[rows]
        wrong = "ids not those of one write" if rows else "counts other than 2,000"
        n = len(errors[rows])
        return (f"{'**' * bool(n)}{n} errors{'**' * bool(n)}, {'**' * bool(bad)}{bad} {wrong}{'**' * bool(bad)} "
                f"in {polls} polls ({RUNS} runs of {OVERWRITES} overwrites)")

    return cell(False), cell(True), errors[False] + errors[True]


def _planned(drivers: _Drivers, store: Store) -> tuple[str, list[str]]:
    outcomes: collections.Counter[str] = collections.Counter()
    messages = []
    for run in range(RUNS):
        name = _base(store, f"planned-{run}")
        drivers.run([(job_plan, (store, name), {})])
        job_write(store, name, "overwrite", ROWS)
        (out,) = drivers.run([(job_run_planned, (store, name), {})])
        if "error" in out:
            named = "this read was planned against an earlier version of the dataset; version " in out["error"]
            outcomes["rows: an error naming the commit" if named else "**rows: another error**"] += 1
            messages.append(out["error"])
        else:
            outcomes[f"**rows: no error ({out.get('rows')} rows)**"] += 1
        if "count_error" in out:
            outcomes["**count(): an error**"] += 1
            messages.append(out["count_error"])
        else:
            outcomes[f"count(): {out['count']:,}{' (the planned version)' if out['count'] == ROWS else ''}"] += 1
    return _counted(outcomes), messages


def _new_columns(drivers: _Drivers, store: Store) -> tuple[str, list[str]]:
    """3 appends at once, writer w adding column ``c<w>`` (its ids): each row read back has its writer's column
    and null in the others'."""
    import ray_tfrecord

    exact, messages = 0, []
    for run in range(RUNS):
        name = _base(store, f"columns-{run}")
        results = drivers.run([(job_write, (store, name, "append", (w + 1) * ROWS), {"column": f"c{w}"})
                               for w in range(3)])
        messages += [r["failed"] for r in results if "failed" in r]
        try:
            rows = ray_tfrecord.read_tfrecords(_uri(store, name), filesystem=_filesystem(store)).take_all()
        except Exception as e:
            messages.append(_message(e))
            continue
        writer = {i: i // ROWS - 1 for i in range(4 * ROWS)}
        exact += sorted(r["id"] for r in rows) == list(range(4 * ROWS)) and all(
            r.get(f"c{w}") == (r["id"] if writer[r["id"]] == w else None) for r in rows for w in range(3))
    cell = f"every column on its rows: {exact} of {RUNS} runs"
    return cell + (f"; **{len(messages)} errors**" if messages else ""), messages


# -- the run -----------------------------------------------------------------------------------------

@contextlib.contextmanager
def _store(kind: str) -> Iterator[Store]:
    if kind == "local":
        with tempfile.TemporaryDirectory(prefix="races-") as where:
            yield kind, where
        return
    start = {"s3": moto_s3, "gcs": fake_gcs}[kind]
    with start(BUCKET) as endpoint, LatencyProxy(endpoint, LATENCY_S) as proxy:
        yield kind, proxy.endpoint


CASES = ["2 jobs `mode='append'` at once on 2,000 rows, expect 6,000 ids",
         "4 jobs `mode='append'` at once, expect 10,000",
         "`append` racing `overwrite`",
         "`read_tfrecords(...).count()` polled during overwrites",
         "`take_all()` of every id polled during overwrites",
         "`count()` polled during overwrites with `keep_replaced_files=600`",
         "`take_all()` polled during overwrites with `keep_replaced_files=600`",
         "a read planned before an `overwrite`, run after it",
         "3 jobs `mode='append'` at once, each adding a column of its own"]


def _store_cells(kind: str) -> tuple[list[str], list[str]]:
    import ray

    with _store(kind) as store, _SPAWN.Manager() as manager:
        drivers = _Drivers(manager, ray.get_runtime_context().gcs_address)
        try:
            cells, messages = [], []
            for writers in (2, 4):
                cell, seen = _appends(drivers, store, writers)
                cells.append(cell)
                messages += seen
            cell, seen = _append_vs_overwrite(drivers, store)
            cells.append(cell)
            messages += seen
            for keep in (0.0, 600.0):
                count, rows, seen = _polled(drivers, store, keep)
                cells += [count, rows]
                messages += seen
            for case in (_planned, _new_columns):
                cell, seen = case(drivers, store)
                cells.append(cell)
                messages += seen
        finally:
            drivers.close()
    print(f"  {kind}: " + " | ".join(cells), flush=True)
    for text, times in collections.Counter(messages).most_common():
        print(f"  {kind} ({times}x): {text}", flush=True)
    return cells, messages


def main() -> int:
    import ray

    ray.shutdown()
    _quiet()
    # One cluster for every driver: fractional CPUs, so that 4 jobs' write tasks run at once on a small machine.
    ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False,
             object_store_memory=512 << 20)
    t0 = time.perf_counter()
    by_store, messages = {}, {}
    try:
        for kind in STORES:
            by_store[kind], messages[kind] = _store_cells(kind)
    finally:
        ray.shutdown()
    names = {"local": "local", "s3": "S3", "gcs": "GCS"}
    print(f"\n{RUNS} runs per case; {ROWS:,} rows ({FILES} files) per write; object stores {LATENCY_S * 1000:.0f} ms a "
          f"request; {DRIVERS} driver processes on one Ray; {time.perf_counter() - t0:.0f} s\n")
    print("| case | " + " | ".join(names[k] for k in by_store) + " |")
    print("|---|" + "---|" * len(by_store))
    for n, case in enumerate(CASES):
        print(f"| {case} | " + " | ".join(by_store[k][n] for k in by_store) + " |")
    for kind, seen in messages.items():
        distinct = collections.Counter(seen)
        if distinct:
            print(f"\nmessages on {names[kind]} (times seen):")
            for text, times in distinct.most_common():
                print(f"- ({times}x) {text}")
    return 0


def run(ctx: Any) -> list[dict]:
    """For ``python -m bench --only races``: prints its own table; adds no rows to the bench's."""
    main()
    return []


if __name__ == "__main__":
    sys.exit(main())
