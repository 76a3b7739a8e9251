"""Codec throughput: native decode / encode beside tf.data + parse_example, protobuf parsing, and
building tf.train.Example objects in Python, on the same files in the same run; and native decode
on 1, 2, 4, ... threads (``--threads``), each thread decoding its own files, with the share of a
chunk's decode that holds the GIL."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import pyarrow as pa

from ray_tfrecord import Decoder, RecordWriter, decode, encode, iter_chunks

from .datasets import BenchContext, tf_feature_spec

PY_SAMPLE = 5_000  # rows for the pure-Python peers (they are slow; rows/s is what we compare)
THREAD_ROWS = 100_000  # rows each thread decodes at least, so that a thread's start-up does not count


def _best(fn, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _decode_native(files: list[str], schema: pa.Schema) -> int:
    rows = 0
    for path in files:
        with open(path, "rb") as f:
            for chunk in iter_chunks(f, path=path):
                rows += decode(chunk, schema).num_rows
    return rows


def _decode_files(files: list[str], decoder: Decoder) -> float:
    """Decodes the files; returns the seconds spent in ``decoder.decode`` (framing excluded)."""
    spent = 0.0
    for path in files:
        with open(path, "rb") as f:
            for chunk in iter_chunks(f, path=path):
                t0 = time.perf_counter()
                decoder.decode(chunk)
                spent += time.perf_counter() - t0
    return spent


def gil_share(files: list[str], schema: pa.Schema) -> float:
    """The share of ``Decoder.decode``'s time that holds the GIL, on one thread: its time less the
    time its native call spent without the GIL (``Decoder.native_seconds``), over its time."""
    decoder = Decoder(schema)
    _decode_files(files, decoder)  # warm: the page cache and the buffer pool
    before = decoder.native_seconds
    spent = _decode_files(files, decoder)
    return 1 - (decoder.native_seconds - before) / spent


def _decode_threads(files: list[str], decoder: Decoder, threads: int) -> None:
    """Files decode in parallel threads (what a Ray worker pool does), one decoder shared by all."""
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda f: _decode_files([f], decoder), files))


def default_threads() -> list[int]:
    """1, 2, 4, ... up to the CPU count, and the CPU count itself."""
    cpus = os.cpu_count() or 1
    counts = [1 << k for k in range(cpus.bit_length()) if 1 << k <= cpus]
    return counts if counts[-1] == cpus else [*counts, cpus]


def _thread_rows(ctx: BenchContext, dataset: str, schema: pa.Schema, nrows: int, threads: list[int]) -> list[dict]:
    """Decode on each thread count, every thread decoding the dataset's files over at least
    THREAD_ROWS rows (distinct copies per thread, so the work grows with the threads and no two
    threads share a file)."""
    decoder = Decoder(schema)
    passes = -(-THREAD_ROWS // nrows)
    nbytes = ctx.bytes(dataset) * passes
    out, first = [], None
    for t in threads:
        files = ctx.repeated(dataset, t * passes)
        _decode_threads(files, decoder, t)  # warm: the page cache and the buffer pool
        seconds = _best(partial(_decode_threads, files, decoder, t))
        rate = nrows * passes * t / seconds
        first = first or (t, rate)
        note = (f"GIL held {gil_share(ctx.files(dataset), schema):.1%} of decode" if t == 1 else
                f"{rate / first[1]:.2f}x {first[0]} thread{'s' if first[0] > 1 else ''}")
        out.append(_row(dataset, f"decode: ray_tfrecord native, {t} thread{'s' if t > 1 else ''}", nrows * passes * t,
                        seconds, nbytes * t, note))
    return out


def _decode_tf(files: list[str], schema: pa.Schema, batched: bool = True) -> None:
    """TF's two idioms: parse_example on batches of 1024 (its fastest), or per record via map."""
    import tensorflow as tf

    spec = tf_feature_spec(schema)
    ds = tf.data.TFRecordDataset(files)
    if batched:
        ds = ds.batch(1024).map(lambda x: tf.io.parse_example(x, spec))
    else:
        ds = ds.map(lambda x: tf.io.parse_single_example(x, spec), num_parallel_calls=tf.data.AUTOTUNE)
    for _ in ds.prefetch(2):
        pass


def _payloads(files: list[str], n: int) -> list[bytes]:
    out = []
    with open(files[0], "rb") as f:
        for chunk in iter_chunks(f, path=files[0]):
            out.extend(bytes(chunk.record(i)) for i in range(len(chunk)))
            if len(out) >= n:
                break
    return out[:n]


def _decode_protobuf(payloads: list[bytes]) -> None:
    from tensorflow.core.example import example_pb2

    for p in payloads:
        ex = example_pb2.Example.FromString(p)
        {k: list(getattr(v, v.WhichOneof("kind")).value) for k, v in ex.features.feature.items()}


def _encode_python(rows: list[dict], schema: pa.Schema, path: str) -> None:
    import tensorflow as tf

    def feature(v, t):
        leaf = t.value_type if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) else t
        vals = v if isinstance(v, list) else [v]
        if pa.types.is_integer(leaf):
            return tf.train.Feature(int64_list=tf.train.Int64List(value=vals))
        if pa.types.is_floating(leaf):
            return tf.train.Feature(float_list=tf.train.FloatList(value=vals))
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=vals))

    types = {f.name: f.type for f in schema}
    with tf.io.TFRecordWriter(path) as w:
        for row in rows:
            ex = tf.train.Example(features=tf.train.Features(feature={k: feature(v, types[k]) for k, v in row.items()}))
            w.write(ex.SerializeToString())


def _encode_native(table: pa.Table, path: str) -> None:
    with RecordWriter(open(path, "wb")) as w:
        for batch in table.to_batches(max_chunksize=8192):
            w.write(encode(batch).data)


def _row(dataset, impl, rows, seconds, nbytes, note=""):
    return {"bench": "codec", "dataset": dataset, "impl": impl, "rows_per_s": rows / seconds,
            "mb_per_s": nbytes / seconds / 1e6 if nbytes else None, "note": note}


def run(ctx: BenchContext, threads: list[int] | None = None) -> list[dict]:
    from .datasets import image_table, tabular_table

    threads = threads or default_threads()
    out = []
    for dataset, schema, nrows, make in [("tabular", ctx.tabular_schema, ctx.tabular_rows, tabular_table),
                                        ("image", ctx.image_schema, ctx.image_rows, image_table)]:
        files, nbytes = ctx.files(dataset), ctx.bytes(dataset)
        assert _decode_native(files, schema) == nrows
        t_native = _best(partial(_decode_native, files, schema))
        t_tf = _best(partial(_decode_tf, files, schema), repeat=2)
        t_tf1 = _best(partial(_decode_tf, files, schema, batched=False), repeat=1)
        sample = _payloads(files, PY_SAMPLE)
        t_pb = _best(partial(_decode_protobuf, sample), repeat=1)
        out += [
            _row(dataset, "decode: ray_tfrecord native (decode)", nrows, t_native, nbytes,
                 f"{t_tf / t_native:.1f}x batched tf.data, {t_tf1 / t_native:.0f}x per-record tf.data, "
                 f"{(t_pb / len(sample)) / (t_native / nrows):.0f}x protobuf"),
            *_thread_rows(ctx, dataset, schema, nrows, threads),
            _row(dataset, "decode: tf.data + parse_example, batches of 1024", nrows, t_tf, nbytes, "TF's own threads"),
            _row(dataset, "decode: tf.data + parse_single_example per record", nrows, t_tf1, nbytes,
                 "map, AUTOTUNE parallel calls"),
            _row(dataset, "decode: protobuf Example.FromString", len(sample), t_pb,
                 nbytes * len(sample) / nrows, f"{len(sample):,}-row sample"),
        ]
        table = make(nrows)
        t_enc = _best(partial(_encode_native, table, f"{ctx.tmp}/enc.tfrecord"))
        rows = table.slice(0, PY_SAMPLE).to_pylist()
        t_py = _best(partial(_encode_python, rows, table.schema, f"{ctx.tmp}/py.tfrecord"), repeat=1)
        out += [
            _row(dataset, "encode: ray_tfrecord native", nrows, t_enc, nbytes,
                 f"{(t_py / len(rows)) / (t_enc / nrows):.0f}x tf.train.Example"),
            _row(dataset, "encode: tf.train.Example + TFRecordWriter", len(rows), t_py, nbytes * len(rows) / nrows,
                 f"{len(rows):,}-row sample"),
        ]
    return out
