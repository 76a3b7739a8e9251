"""Soak: read -> transform -> write through Ray Data with an object store several times
smaller than the data.

The dataset is image-like (784 int64 pixels and a label per record, as in ``datasets.py``),
generated once under ``ctx.tmp`` with the codec, sized to ``SCALE`` times the object store
once decoded (pixels are 1-2 byte varints on disk and 8-byte int64 in Arrow, so the on-disk
size is ~5x smaller). Ray is restarted with ``STORE_BYTES`` of object store and blocks of
``STORE_BYTES / 8`` (Ray's default 128 MiB block would not fit). The transform inverts the
pixels in Arrow; the write is ``write_tfrecords`` into ``ctx.tmp``.

Reported: rows/s and input MB/s (on-disk TFRecord bytes read) of the whole pipeline, wall
clock from the first task to ``_SUCCESS`` (not Ray start-up nor data generation); the peak
RSS of every worker that ran the transform (``VmHWM``, read once the pipeline is done, so it
covers the read and write tasks those processes also ran; it includes the object-store pages
a worker mapped) and of the driver; bytes spilled; and rows in == rows out, checked by
reading the output back. Any mismatch raises instead of reporting a figure.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import List

import pyarrow as pa
import pyarrow.compute as pc

from .datasets import image_table

STORE_BYTES = 256 << 20
SCALE = 8  # decoded dataset / object store
ROW_BYTES = (784 + 1) * 8  # one decoded image row in Arrow
ROWS_PER_FILE = 20_000
_MB = 1e6


def _generate(directory: Path, rows: int) -> None:
    """Write ``rows`` image rows as TFRecord files with the codec (once: reused while the
    ``_DONE`` marker says the directory is complete)."""
    from ray_tfrecord import RecordWriter, encode

    if (directory / "_DONE").exists():
        return
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    for k, start in enumerate(range(0, rows, ROWS_PER_FILE)):
        table = image_table(min(ROWS_PER_FILE, rows - start), seed=k)
        with RecordWriter(open(directory / f"part-{k:05d}.tfrecord", "wb")) as w:
            w.write(encode(table).data)
    (directory / "_DONE").touch()


def _peak_rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith("VmHWM:"))


def _invert_and_note_pid(pid_dir: str):
    def invert(batch: pa.Table) -> pa.Table:
        Path(pid_dir, str(os.getpid())).touch()
        pixels = batch.column("pixels").combine_chunks()
        inverted = pa.FixedSizeListArray.from_arrays(pc.subtract(255, pixels.flatten()), 784)
        return batch.set_column(batch.schema.get_field_index("pixels"), "pixels", inverted)

    return invert


def _spilled_mb() -> float:
    # Ray's memory summary has a line "Spilled <n> MiB, <k> objects, ..." once anything spilled.
    import ray
    from ray._private.internal_api import memory_summary

    summary = memory_summary(address=ray.get_runtime_context().gcs_address, stats_only=True)
    for line in summary.splitlines():
        if line.startswith("Spilled"):
            return float(line.split()[1])
    return 0.0


def run(ctx) -> List[dict]:
    """One benchmark row for ``bench/__main__.py``."""
    import ray

    import ray_tfrecord

    rows_in = SCALE * STORE_BYTES // ROW_BYTES
    src = Path(ctx.tmp) / f"soak-image-{rows_in}"
    _generate(src, rows_in)
    in_bytes = sum(p.stat().st_size for p in src.glob("*.tfrecord"))
    out = Path(ctx.tmp) / "soak-out"
    shutil.rmtree(out, ignore_errors=True)

    ray.shutdown()
    # "local": a cluster of our own, never one someone else started with `ray start`.
    ray.init(address="local", num_cpus=os.cpu_count(), object_store_memory=STORE_BYTES,
             include_dashboard=False, log_to_driver=False)
    try:
        data_ctx = ray.data.DataContext.get_current()
        data_ctx.enable_progress_bars = False
        data_ctx.target_max_block_size = STORE_BYTES // 8
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets this process's peak RSS: count the pipeline, not what ran before
        with tempfile.TemporaryDirectory() as pid_dir:
            t0 = time.perf_counter()
            ds = ray_tfrecord.read_tfrecords(str(src), schema=image_table(1).schema)
            ds = ds.map_batches(_invert_and_note_pid(pid_dir), batch_format="pyarrow")
            result = ray_tfrecord.write_tfrecords(ds, str(out))
            seconds = time.perf_counter() - t0
            worker_peaks = sorted(_peak_rss(int(p)) for p in os.listdir(pid_dir))
        rows_back = ray_tfrecord.read_tfrecords(str(out), schema=image_table(1).schema).count()
        spilled = _spilled_mb()
    finally:
        ray.shutdown()
    if not result.num_rows == rows_back == rows_in:
        raise AssertionError(f"rows in {rows_in:,}, written {result.num_rows:,}, read back {rows_back:,}")
    shutil.rmtree(out)

    peaks = ", ".join(f"{p / 2**20:,.0f}" for p in worker_peaks)
    note = (f"{rows_in * ROW_BYTES / 2**30:.1f} GiB decoded through a {STORE_BYTES >> 20} MiB object store "
            f"({os.cpu_count()} CPU, {result.num_files} files); peak RSS per worker {peaks} MiB, driver "
            f"{_peak_rss(os.getpid()) / 2**20:,.0f} MiB; spilled {spilled:,.0f} MiB; "
            f"rows in == rows out ({rows_in:,})")
    return [{
        "bench": "soak",
        "dataset": "image",
        "impl": "ray_tfrecord read -> map_batches -> write",
        "rows_per_s": rows_in / seconds,
        "mb_per_s": in_bytes / _MB / seconds,
        "note": note,
    }]
