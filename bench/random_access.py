"""Random access over plain TFRecord (``ray_tfrecord.TFRecordSource``) beside sequential reads of the same
files and Grain over ArrayRecord holding the same serialized records, same run.

- one by one (``source[i]``, as Grain calls it) and in batches of 256 (``__getitems__``, as PyTorch's
  DataLoader calls it), in a random order over the whole dataset; warm: every block's record offsets
  known. With the default block cache (64 MiB: the tabular dataset fits) and with none (``cache_bytes=0``:
  what a dataset much larger than the cache costs, a read per record);
- sequential: our codec over the files in order (``iter_chunks`` + ``Decoder``, in this process), and the
  source's records in order;
- Grain: ``MapDataset.source(...).shuffle(seed).batch(256)``, a global shuffle, over our source's
  serialized records and over ``ArrayRecordDataSource`` (files ``ArrayRecordWriter`` wrote with
  ``group_size:1``, the setting for random access), each batch decoded by the same ``decode_records``;
  ours decoded by the source itself; and Grain's ``DataLoader`` (``IndexSampler(shuffle=True)``, its 16
  reader threads, no worker processes on 2 cores) over each;
- S3 (moto) and GCS (fake-gcs-server) behind bench/proxy.py's 20 ms a request: records one by one in a
  random order, the requests each cost (counted by the proxy), cold (first touches) and warm.

    python -m bench --only random_access
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa

from bench.proxy import LatencyProxy
from tests.filesystems import fake_gcs, gcs_filesystem, moto_s3, s3_filesystem

BATCH = 256
ROUNDS = 3
LATENCY_S = 0.020
STORE_RECORDS = 150  # random records read one by one on each object store: 3 s at 20 ms each
# Records timed per figure where a record costs tens of microseconds or more (one by one, Grain).
TIMED = 10_000
_STORES = {"s3": (moto_s3, s3_filesystem, "s3://"), "gcs": (fake_gcs, gcs_filesystem, "gs://")}


def _rates(runs: dict[str, tuple[int, Callable[[], object]]]) -> dict[str, float]:
    """Each run's median rows/s over a few rounds, the runs taking turns within each round, so that a burst of
    load from other processes does not land on one of them only."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(ROUNDS):
        for name, (_, run) in runs.items():
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)
    return {name: runs[name][0] / statistics.median(t) for name, t in times.items()}


def _records(files: list[str]) -> list[bytes]:
    import pyarrow.fs as pafs

    from ray_tfrecord import iter_chunks

    out = []
    for path in files:
        with pafs.LocalFileSystem().open_input_stream(path) as f:
            for chunk in iter_chunks(f, path=path):
                out += [bytes(chunk.record(i)) for i in range(len(chunk))]
    return out


def _array_records(records: list[bytes], directory: str, files: int) -> list[str]:
    import os

    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(directory, exist_ok=True)
    paths, per = [], -(-len(records) // files)
    for k in range(files):
        paths.append(os.path.join(directory, f"part-{k:05d}.array_record"))
        w = ArrayRecordWriter(paths[-1], "group_size:1")
        for r in records[k * per:(k + 1) * per]:
            w.write(r)
        w.close()
    return paths


def _local_rows(ctx, files: list[str], schema: pa.Schema) -> list[dict]:  # type: ignore[no-untyped-def]
    import grain

    from ray_tfrecord import Decoder, TFRecordSource, decode_records, iter_chunks
    from ray_tfrecord._src.data.feed.random_access import DEFAULT_CACHE_BYTES

    n = ctx.tabular_rows
    mb = ctx.bytes("tabular") / 1e6
    order = np.random.default_rng(0).permutation(n)
    batches = [order[i:i + BATCH] for i in range(0, n, BATCH)]
    timed = min(n, TIMED) // BATCH * BATCH
    runs: dict[str, tuple[int, Callable[[], object]]] = {}
    notes: dict[str, str] = {}

    def add(impl: str, rows: int, run: Callable[[], object], note: str) -> None:
        runs[impl], notes[impl] = (rows, run), note

    decoder = Decoder(schema)

    def sequential() -> None:
        for path in files:
            with open(path, "rb") as f:
                for chunk in iter_chunks(f, path=path):
                    decoder.decode(chunk)

    add("in-process ray_tfrecord codec, sequential", n, sequential, "iter_chunks + Decoder over the files")
    for cache, label in ((DEFAULT_CACHE_BYTES, "cache 64 MiB"), (0, "no cache")):
        source = TFRecordSource(files, schema=schema, cache_bytes=cache)
        source.__getitems__(range(n))  # warm: every block touched once
        add(f"ray_tfrecord TFRecordSource, random, one by one ({label})", timed,
            lambda s=source: [s[int(i)] for i in order[:timed]], "source[i] in a random order, warm")
        add(f"ray_tfrecord TFRecordSource, random, batches of {BATCH} ({label})", n,
            lambda s=source: [s.__getitems__(b) for b in batches], "__getitems__, random order, warm")
    in_order = [np.arange(i, min(n, i + BATCH)) for i in range(0, n, BATCH)]
    add(f"ray_tfrecord TFRecordSource, in order, batches of {BATCH}", n,
        lambda: [source.__getitems__(b) for b in in_order], "__getitems__ over 0, 1, 2, ... (no cache)")

    raw = TFRecordSource(files, schema=schema, raw=True)
    arrays = grain.sources.ArrayRecordDataSource(_array_records(_records(files), f"{ctx.tmp}/array_record",
                                                                len(files)))
    assert len(arrays) == len(raw) == n

    def decoded(records: list[bytes]) -> pa.RecordBatch:
        return decode_records(pa.array(records, pa.binary()), schema)

    # The same decode for both storages: the figures differ by the reads alone.
    for name, src in (("ray_tfrecord TFRecordSource", raw), ("ArrayRecordDataSource", arrays)):
        src[0]
        ds = grain.MapDataset.source(src).shuffle(seed=0).batch(BATCH, batch_fn=decoded)
        add(f"Grain MapDataset over {name}", timed, lambda ds=ds: [ds[j] for j in range(timed // BATCH)],
            "shuffle(seed).batch(256), serialized records decoded by decode_records per batch")
        loader = grain.DataLoader(data_source=src, operations=[grain.transforms.Batch(BATCH)],
                                  sampler=grain.samplers.IndexSampler(n, shuffle=True, seed=0, num_epochs=1),
                                  worker_count=0)
        add(f"Grain DataLoader over {name}", timed,
            lambda loader=loader: list(itertools.islice(loader, timed // BATCH)),
            "IndexSampler(shuffle=True), 16 reader threads, serialized records batched")
    fixed = [f.name for f in schema if not pa.types.is_list(f.type)]
    ours = TFRecordSource(files, schema=schema, columns=fixed)
    ours[0]
    ds = grain.MapDataset.source(ours).shuffle(seed=0).batch(BATCH)
    add("Grain MapDataset over ray_tfrecord TFRecordSource (decoded)", timed,
        lambda: [ds[j] for j in range(timed // BATCH)],
        f"records decoded by the source, {len(fixed)} fixed-shape columns, stacked by Grain")
    return [{"bench": "random_access", "dataset": "tabular", "impl": impl, "rows_per_s": rate,
             "mb_per_s": rate * mb / n, "note": notes[impl]} for impl, rate in _rates(runs).items()]


def _store_rows(kind: str, files: list[str], schema: pa.Schema, n: int) -> list[dict]:
    from ray_tfrecord import TFRecordSource

    start, filesystem, scheme = _STORES[kind]
    order = np.random.default_rng(1).permutation(n)[:STORE_RECORDS]
    out = []
    with start("bench") as endpoint, LatencyProxy(endpoint, LATENCY_S) as proxy:
        fs = filesystem(proxy.endpoint)
        keys = [f"bench/tabular/{k:05d}.tfrecord" for k in range(len(files))]
        for path, key in zip(files, keys):
            with open(path, "rb") as src, fs.open_output_stream(key) as dst:
                dst.write(src.read())
        source = TFRecordSource([f"{scheme}{k}" for k in keys], schema=schema, filesystem=fs, cache_bytes=0)
        for phase in ("cold", "warm"):
            if phase == "warm":
                source.__getitems__(range(n))
            proxy.reset()
            t0 = time.perf_counter()
            for i in order:
                source[int(i)]
            seconds = time.perf_counter() - t0
            requests = proxy.count() / len(order)
            out.append({"bench": "random_access", "dataset": "tabular",
                        "impl": f"ray_tfrecord TFRecordSource on {kind.upper()}, random, one by one ({phase})",
                        "rows_per_s": len(order) / seconds, "mb_per_s": None,
                        "note": f"{LATENCY_S * 1000:.0f} ms a request: {requests:.2f} requests a record"
                                f"{' (blocks touched first, files opened)' if phase == 'cold' else ''}"})
    return out


def run(ctx) -> list[dict]:  # type: ignore[no-untyped-def]
    """Benchmark rows for ``bench/__main__.py``."""
    files, schema = ctx.files("tabular"), ctx.tabular_schema
    rows = _local_rows(ctx, files, schema)
    for kind in _STORES:
        rows += _store_rows(kind, files, schema, ctx.tabular_rows)
    return rows
