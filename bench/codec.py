"""Codec throughput on one core: native decode / encode beside tf.data + parse_example, protobuf
parsing, and building tf.train.Example objects in Python, on the same files in the same run."""

from __future__ import annotations

import time

import pyarrow as pa

from ray_tfrecord.core import codec
from ray_tfrecord.core.framing import RecordWriter, iter_chunks

from .datasets import BenchContext, tf_feature_spec

PY_SAMPLE = 5_000  # rows for the pure-Python peers (they are slow; rows/s is what we compare)


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
                rows += codec.decode(chunk, schema).num_rows
    return rows


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


def _decode_native_threads(files: list[str], schema: pa.Schema, threads: int) -> None:
    """The codec releases the GIL, so files decode in parallel threads (what a Ray worker pool does)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda f: _decode_native([f], schema), files))


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
            w.write(codec.encode(batch).data)


def _row(dataset, impl, rows, seconds, nbytes, note=""):
    return {"bench": "codec", "dataset": dataset, "impl": impl, "rows_per_s": rows / seconds,
            "mb_per_s": nbytes / seconds / 1e6 if nbytes else None, "note": note}


def run(ctx: BenchContext) -> list[dict]:
    from .datasets import image_table, tabular_table

    out = []
    for dataset, schema, nrows, make in [("tabular", ctx.tabular_schema, ctx.tabular_rows, tabular_table),
                                        ("image", ctx.image_schema, ctx.image_rows, image_table)]:
        files, nbytes = ctx.files(dataset), ctx.bytes(dataset)
        assert _decode_native(files, schema) == nrows
        t_native = _best(lambda: _decode_native(files, schema))
        t_two = _best(lambda: _decode_native_threads(files, schema, 2))
        t_tf = _best(lambda: _decode_tf(files, schema), repeat=2)
        t_tf1 = _best(lambda: _decode_tf(files, schema, batched=False), repeat=1)
        sample = _payloads(files, PY_SAMPLE)
        t_pb = _best(lambda: _decode_protobuf(sample), repeat=1)
        out += [
            _row(dataset, "decode: ray_tfrecord native, 1 thread", nrows, t_native, nbytes,
                 f"{t_tf / t_native:.1f}x batched tf.data, {t_tf1 / t_native:.0f}x per-record tf.data, "
                 f"{(t_pb / len(sample)) / (t_native / nrows):.0f}x protobuf"),
            _row(dataset, "decode: ray_tfrecord native, 2 threads", nrows, t_two, nbytes,
                 f"{t_tf / t_two:.1f}x batched tf.data"),
            _row(dataset, "decode: tf.data + parse_example, batches of 1024", nrows, t_tf, nbytes, "TF's own threads"),
            _row(dataset, "decode: tf.data + parse_single_example per record", nrows, t_tf1, nbytes,
                 "map, AUTOTUNE parallel calls"),
            _row(dataset, "decode: protobuf Example.FromString", len(sample), t_pb,
                 nbytes * len(sample) / nrows, f"{len(sample):,}-row sample"),
        ]
        table = make(nrows)
        t_enc = _best(lambda: _encode_native(table, f"{ctx.tmp}/enc.tfrecord"))
        rows = table.slice(0, PY_SAMPLE).to_pylist()
        t_py = _best(lambda: _encode_python(rows, table.schema, f"{ctx.tmp}/py.tfrecord"), repeat=1)
        out += [
            _row(dataset, "encode: ray_tfrecord native", nrows, t_enc, nbytes,
                 f"{(t_py / len(rows)) / (t_enc / nrows):.0f}x tf.train.Example"),
            _row(dataset, "encode: tf.train.Example + TFRecordWriter", len(rows), t_py, nbytes * len(rows) / nrows,
                 f"{len(rows):,}-row sample"),
        ]
    return out
