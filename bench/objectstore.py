"""Writes and reads on object stores: local S3 (moto) and GCS (fake-gcs-server) behind a proxy that adds
20 ms to every request (one cloud round trip) and counts them (bench/proxy.py).

The same rows, cut into the same number of files (64 and 1,024) by each writer, same run: our
``write_tfrecords`` (files at their final keys, one manifest write commits), Ray's ``write_parquet``
and Ray's own ``write_tfrecords``; then our ``read_tfrecords`` beside Ray's ``read_parquet``. Each row's
note gives the seconds, the commit's seconds (ours: ``Commit.finish`` on the driver; Ray's file writers
have no commit) and the requests per data file.

Then concurrent appenders (issue 50): N threads of one driver (``BENCH_APPENDERS``, default 1, 2, 4, 8), each
appending its share of the same rows (64 files in all) to one dataset at once, released by a barrier: rows
per second over all of them, and the commits they lost to each other and retried
(``TFRecordWriteResult.retries``); every id is checked to be there exactly once.

    python -m bench --only objectstore
    BENCH_OBJECTSTORES=s3 python -m bench --only objectstore   # one store
    BENCH_FILE_COUNTS= BENCH_APPENDERS=1,2,4 python -m bench --quick --only objectstore  # appenders only
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from bench.proxy import LatencyProxy
from tests.filesystems import fake_gcs, gcs_filesystem, moto_s3, s3_filesystem

LATENCY_S = 0.020
# 200,000 rows as in issue 36, rounded up to a multiple of 1,024 so that every writer's files hold equal rows.
ROWS = 200_704
FILE_COUNTS = tuple(int(n) for n in os.environ.get("BENCH_FILE_COUNTS", "64,1024").split(",") if n)
APPENDERS = tuple(int(n) for n in os.environ.get("BENCH_APPENDERS", "1,2,4,8").split(",") if n)
APPENDED_FILES = 64
BUCKET = "bench"
_STORES = {"s3": (moto_s3, s3_filesystem, "s3://"), "gcs": (fake_gcs, gcs_filesystem, "gs://")}


def _table(rows: int) -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({"id": np.arange(rows, dtype=np.int64),
                     "label": rng.integers(0, 10, rows),
                     "x": pa.FixedSizeListArray.from_arrays(rng.random(rows * 8, dtype=np.float32), 8)
                     .cast(pa.list_(pa.float32())),
                     "word": pa.array([f"w{i % 977}" for i in range(rows)])})


class _CommitClock:
    """The seconds our driver spends in ``Commit.finish`` (the commit), summed over a write."""

    def __init__(self) -> None:
        from ray_tfrecord._src.data.write.commit import Commit

        self.seconds = 0.0
        real = Commit.finish
        clock = self

        def timed(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return real(self, *args, **kwargs)
            finally:
                clock.seconds += time.perf_counter() - t0

        Commit.finish = timed  # type: ignore[method-assign]


def _timed(proxy: LatencyProxy, call) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    proxy.reset()
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0, proxy.count()


def _one_count(kind: str, fs: pafs.FileSystem, proxy: LatencyProxy, ds, files: int, mb: float,  # type: ignore[no-untyped-def]
               clock: _CommitClock) -> list[dict]:
    import ray

    import ray_tfrecord

    rows = ds.count()
    per_file = rows // files
    data = ds.repartition(files).materialize()
    dataset = f"{kind}, {files} files"
    base = f"{_STORES[kind][2]}{BUCKET}/{files}"

    def row(impl: str, seconds: float, requests: int, written: str, extra: str = "") -> dict:
        n = sum(1 for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/{files}/{written}", recursive=True))
                if i.is_file and not i.path.rsplit("/", 1)[1].startswith("_"))
        r = {"bench": "objectstore", "dataset": dataset, "impl": impl, "rows_per_s": rows / seconds,
             "mb_per_s": mb / seconds,
             "note": f"{seconds:.1f} s{extra}; {requests / n:.1f} requests per file, {n} files "
                     f"({LATENCY_S * 1000:.0f} ms a request)"}
        print(f"  {dataset}: {impl}: {r['note']}", flush=True)
        return r

    clock.seconds = 0.0
    seconds, requests = _timed(proxy, lambda: ray_tfrecord.write_tfrecords(
        data, f"{base}/ours", filesystem=fs, min_rows_per_file=per_file, max_rows_per_file=per_file))
    out = [row("ray_tfrecord write_tfrecords", seconds, requests, "ours",
               f" (commit {clock.seconds:.2f} s, {clock.seconds / seconds:.0%})")]
    seconds, requests = _timed(proxy, lambda: data.write_parquet(
        f"{base}/parquet", filesystem=fs, min_rows_per_file=per_file, max_rows_per_file=per_file))
    out.append(row("Ray write_parquet", seconds, requests, "parquet"))
    # Ray's write_tfrecords has no max_rows_per_file: one block per file, gathered to per_file rows.
    seconds, requests = _timed(proxy, lambda: data.write_tfrecords(
        f"{base}/ray_tfrecords", filesystem=fs, min_rows_per_file=per_file))
    out.append(row("Ray write_tfrecords", seconds, requests, "ray_tfrecords"))
    seconds, requests = _timed(proxy, lambda: ray_tfrecord.read_tfrecords(f"{base}/ours", filesystem=fs).materialize())
    out.append(row("ray_tfrecord read_tfrecords", seconds, requests, "ours"))
    seconds, requests = _timed(proxy, lambda: ray.data.read_parquet(f"{base}/parquet", filesystem=fs).materialize())
    out.append(row("Ray read_parquet", seconds, requests, "parquet"))
    return out


def _appenders(kind: str, fs: pafs.FileSystem, proxy: LatencyProxy, ds, writers: int, mb: float) -> dict:  # type: ignore[no-untyped-def]
    """``writers`` appends at once, each of its share of ``ds``, to one dataset; every id once, or it raises."""
    import ray_tfrecord

    rows = ds.count()
    shares = ds.repartition(APPENDED_FILES).split(writers, equal=True)
    uri = f"{_STORES[kind][2]}{BUCKET}/appenders-{writers}"
    barrier = threading.Barrier(writers)
    results: list = [None] * writers

    def append(n: int) -> None:
        barrier.wait(timeout=600)
        results[n] = ray_tfrecord.write_tfrecords(shares[n], uri, filesystem=fs, mode="append",
                                                  max_rows_per_file=-(-rows // APPENDED_FILES))

    threads = [threading.Thread(target=append, args=(n,)) for n in range(writers)]
    proxy.reset()
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    requests = proxy.count()
    if None in results:
        raise RuntimeError(f"an appender of {writers} failed: see its traceback above")
    ids = ray_tfrecord.read_tfrecords(uri, filesystem=fs).to_arrow_refs()
    import ray

    got = np.sort(np.concatenate([t.column("id").to_numpy() for t in ray.get(ids)]))
    if not np.array_equal(got, np.arange(rows)):  # a lost or duplicated row is the worst bug: not a number
        raise RuntimeError(f"{writers} appenders: {len(got)} rows read back, {len(np.unique(got))} distinct ids; "
                           f"expected {rows}")
    retries = sum(r.retries for r in results)
    files = sum(r.num_files for r in results)
    r = {"bench": "objectstore", "dataset": f"{kind}, {writers} concurrent appender{'s' * (writers > 1)}",
         "impl": "ray_tfrecord write_tfrecords append", "rows_per_s": rows / seconds, "mb_per_s": mb / seconds,
         "note": f"{seconds:.1f} s; {retries} commit retries over {writers} commits; {requests / files:.1f} "
                 f"requests per file, {files} files ({LATENCY_S * 1000:.0f} ms a request); every id once"}
    print(f"  {r['dataset']}: {r['note']}", flush=True)
    return r


def _store_rows(kind: str, ds, mb: float, clock: _CommitClock) -> list[dict]:  # type: ignore[no-untyped-def]
    start, filesystem, _ = _STORES[kind]
    out: list[dict] = []
    with start(BUCKET) as endpoint, LatencyProxy(endpoint, LATENCY_S) as proxy:
        fs = filesystem(proxy.endpoint)
        for files in FILE_COUNTS:
            out += _one_count(kind, fs, proxy, ds, files, mb, clock)
        if APPENDERS:  # warm: Ray's workers started, the S3 client made, as the writers above left them
            import ray_tfrecord

            ray_tfrecord.write_tfrecords(ds.limit(100), f"{_STORES[kind][2]}{BUCKET}/warm", filesystem=fs)
        out += [_appenders(kind, fs, proxy, ds, writers, mb) for writers in APPENDERS]
    return out


def run(ctx) -> list[dict]:  # type: ignore[no-untyped-def]
    """Benchmark rows for ``bench/__main__.py``."""
    import ray

    ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    rows = ROWS if ctx.tabular_rows >= 100_000 else 20_000  # --quick: a tenth
    table = _table(rows)
    ds = ray.data.from_arrow(table).materialize()
    clock = _CommitClock()
    out: list[dict] = []
    for kind in os.environ.get("BENCH_OBJECTSTORES", "gcs,s3").split(","):
        out += _store_rows(kind, ds, table.nbytes / 1e6, clock)
    ray.shutdown()
    return out
