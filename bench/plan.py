"""The time ``plan_splits`` takes over a directory without index sidecars, the first and the second time.

The bench files are TensorFlow's writer's (no sidecars, no recorded schema), linked under a fresh
directory with a fresh index cache each run. The first plan scans every file in Ray tasks (every
record's CRC checked) and keeps the indexes; the second finds them and reads each file's fingerprint
(its first and last 4 KiB) only. ``keep_index=False`` scans every time: what every plan cost before
the indexes were kept. Rows/s and MB/s are the rows and on-disk bytes planned per second.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

SPLIT_BYTES = 8 * 1024 * 1024
REPEATS = 3


def _fresh_copy(ctx, dataset: str, into: Path) -> str:
    directory = into / dataset
    directory.mkdir(parents=True)
    for f in ctx.files(dataset):
        try:
            os.link(f, directory / Path(f).name)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(f, directory / Path(f).name)
    return str(directory)


def _bench(ctx, dataset: str, scratch: Path) -> list[dict]:
    from ray_tfrecord._src.data.feed.indexing import CACHE_DIR_ENV
    from ray_tfrecord.tf import plan_splits

    schema = ctx.tabular_schema if dataset == "tabular" else ctx.image_schema
    rows, size = (ctx.tabular_rows if dataset == "tabular" else ctx.image_rows), ctx.bytes(dataset)
    # Untimed: the scan tasks' workers start and import the package once, whichever plan comes first.
    plan_splits(_fresh_copy(ctx, dataset, scratch / "warm-up"), schema=schema, split_bytes=SPLIT_BYTES,
                keep_index=False)
    labels = ("plan, no index kept (scan)", "plan, first run (scan in Ray tasks)", "plan, second run (kept index)")
    timings: dict[str, list[float]] = {label: [] for label in labels}
    for repeat in range(REPEATS):  # each time a fresh directory and cache: the median counts
        os.environ[CACHE_DIR_ENV] = str(scratch / f"cache-{dataset}-{repeat}")
        directory = _fresh_copy(ctx, dataset, scratch / str(repeat))
        for label, keep in zip(labels, (False, True, True), strict=True):
            t0 = time.perf_counter()
            plan = plan_splits(directory, schema=schema, split_bytes=SPLIT_BYTES, keep_index=keep)
            timings[label].append(time.perf_counter() - t0)
            assert plan.rows == rows, (plan.rows, rows)
    files = len(ctx.files(dataset))
    median = {label: statistics.median(times) for label, times in timings.items()}
    first = median[labels[1]]
    return [{"bench": "plan", "dataset": dataset, "impl": label, "rows_per_s": rows / seconds,
             "mb_per_s": size / seconds / 1e6,
             "note": f"{seconds:.3f} s (median of {REPEATS}) for {files} files ({len(plan.splits)} splits)"
                     + (f"; {first / seconds:.0f}x faster than the first" if label == labels[2] else "")}
            for label, seconds in median.items()]


def run(ctx) -> list[dict]:
    """Benchmark rows for ``bench/__main__.py``: the image-like and the tabular set."""
    import ray

    ray.shutdown()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    saved = os.environ.get("RAY_TFRECORD_CACHE_DIR")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(dir=ctx.tmp) as scratch:
        try:
            for name in ("image", "tabular"):
                rows += _bench(ctx, name, Path(scratch))
        finally:
            if saved is None:
                os.environ.pop("RAY_TFRECORD_CACHE_DIR", None)
            else:
                os.environ["RAY_TFRECORD_CACHE_DIR"] = saved
    ray.shutdown()
    return rows
