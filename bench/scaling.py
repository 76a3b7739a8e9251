"""How reads scale: planning time, first-batch latency and throughput versus the number of files
(1, 100, 10,000 files of ~100 KB) and versus the size of one file (1 MB to 2 GB, split reads on).

    python -m bench --only scaling      # about 5 minutes; not part of the default run

The files hold the tabular benchmark records, written by this package (``encode`` and
``framing.RecordWriter``), each with its index sidecar (``index.build_index``), as
``write_tfrecords`` leaves them; they are generated under ``bench/data/scaling`` and deleted
afterwards. Ray runs with 2 CPUs. Per case:

- *open*: ``read_tfrecords(...)`` returning: listing and schema, on the driver;
- *plan*: ``get_read_tasks`` for the read-task count ``read_tfrecords`` picks (file probes,
  index sidecars, byte ranges), on the driver;
- *first batch*: from the start of ``iter_batches`` to the first batch in hand;
- *throughput*: draining ``iter_batches`` (pyarrow, 1024 rows), planning and start-up included.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Iterator, List, Tuple

import pyarrow.fs as pafs

from .datasets import DATA, tabular_table
from .ray_io import BATCH_SIZE

ROOT = DATA / "scaling"
UNIT_ROWS = 16_000  # records encoded once (~10 MB) and repeated to fill the files
COUNT_FILE_BYTES = 100_000
COUNTS = (1, 100, 10_000)
SIZES = (1 << 20, 32 << 20, 256 << 20, 2 << 30)


def _unit() -> Tuple[bytes, List[int]]:
    """The framed bytes of ``UNIT_ROWS`` records and the offset after each record."""
    import io

    from ray_tfrecord import encode, iter_chunks

    table = tabular_table(UNIT_ROWS, seed=7)
    data = bytes(encode(table).data)
    ends = []
    for chunk in iter_chunks(io.BytesIO(data), path="unit", chunk_bytes=len(data)):
        ends.extend((chunk.offsets() + chunk.lengths + 16).tolist())
    return data, ends


def _framed(data: bytes, ends: List[int], nbytes: int) -> Iterator[bytes]:
    """Whole records adding up to about ``nbytes`` (the unit repeated, then a prefix of it)."""
    whole, rest = divmod(nbytes, len(data))
    for _ in range(whole):
        yield data
    cut = max((e for e in ends if e <= rest), default=ends[0] if not whole else 0)
    if cut:
        yield data[:cut]


def _write(path: Path, pieces: Iterator[bytes]) -> None:
    from ray_tfrecord import RecordWriter

    with RecordWriter(open(path, "wb")) as w:
        for piece in pieces:
            w.write(piece)


def _index(paths: List[Path]) -> None:
    from ray_tfrecord._src.core.index import build_index, write_index

    fs = pafs.LocalFileSystem()
    for p in paths:
        write_index(fs, str(p), build_index(fs, str(p)))


def _measure(paths: str) -> dict:
    import ray

    import ray_tfrecord
    from ray_tfrecord import TFRecordDatasource
    from ray_tfrecord._src.data.read.planning import default_read_tasks

    t0 = time.perf_counter()
    ray_tfrecord.read_tfrecords(paths)
    t_open = time.perf_counter() - t0
    source = TFRecordDatasource(paths)
    tasks = default_read_tasks(source.estimate_inmemory_data_size() or 0,
                               ray.data.DataContext.get_current().target_max_block_size)
    t0 = time.perf_counter()
    n_tasks = len(source.get_read_tasks(tasks))
    t_plan = time.perf_counter() - t0

    ds = ray_tfrecord.read_tfrecords(paths)
    rows, first = 0, None
    t0 = time.perf_counter()
    for batch in ds.iter_batches(batch_size=BATCH_SIZE, batch_format="pyarrow"):
        if first is None:
            first = time.perf_counter() - t0
        rows += len(batch)
    secs = time.perf_counter() - t0
    return {"open": t_open, "plan": t_plan, "tasks": n_tasks, "first": first, "rows": rows, "secs": secs}


def _row(case: str, nbytes: int, m: dict) -> dict:
    note = (f"{m['tasks']} read tasks; open {m['open'] * 1e3:,.0f} ms, plan {m['plan'] * 1e3:,.0f} ms, "
            f"first batch {m['first'] * 1e3:,.0f} ms")
    return {"bench": "scaling", "dataset": "tabular", "impl": case, "rows_per_s": m["rows"] / m["secs"],
            "mb_per_s": nbytes / 1e6 / m["secs"], "note": note, **m}


def run(ctx) -> List[dict]:
    """Benchmark rows for ``bench/__main__.py``: one per file count and one per file size."""
    import ray

    shutil.rmtree(ROOT, ignore_errors=True)
    ROOT.mkdir(parents=True)
    data, ends = _unit()
    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    out = []
    try:
        for count in COUNTS:
            d = ROOT / f"count-{count}"
            d.mkdir()
            piece = b"".join(_framed(data, ends, COUNT_FILE_BYTES))
            paths = [d / f"part-{k:05d}.tfrecord" for k in range(count)]
            for p in paths:
                _write(p, iter([piece]))
            _index(paths)
            if count == COUNTS[0]:
                _measure(str(d))  # untimed: worker start-up and imports
            out.append(_row(f"{count:,} file{'s' if count > 1 else ''} of {len(piece) / 1e3:.0f} KB", len(piece) * count, _measure(str(d))))
            shutil.rmtree(d)
        for size in SIZES:
            d = ROOT / f"size-{size}"
            d.mkdir()
            path = d / "part-00000.tfrecord"
            _write(path, _framed(data, ends, size))
            _index([path])
            nbytes = os.path.getsize(path)
            out.append(_row(f"1 file of {nbytes / 1e6:,.0f} MB", nbytes, _measure(str(d))))
            shutil.rmtree(d)
    finally:
        shutil.rmtree(ROOT, ignore_errors=True)
        ray.shutdown()
    return out
