"""Rows per second delivered into a TensorFlow training loop on one worker.

Four ways to feed the same data, side by side in one run:

- ``ray_tfrecord feed (files)``: ``read_tfrecords`` -> ``tf_dataset``; every epoch
  reads and decodes the TFRecord files through Ray Data.
- ``ray_tfrecord feed (materialized)``: the same, after ``Dataset.materialize()``,
  which is what later epochs of a cached dataset cost: the feed alone.
- ``Ray DataIterator.to_tf``: Ray's own feed over the same materialized data.  It
  cannot convert ``fixed_size_list`` columns, so it gets the lists as
  variable-length (the schema ``read_tfrecords`` infers by default), as it would
  in practice.
- ``tf.data + parse_example``: ``TFRecordDataset`` reading the files directly,
  parsed with ``tf.io.parse_example`` in parallel.

The "model" is a compiled step that touches every tensor of the batch and does
nothing else, so the figures measure the feed.  Each figure is a steady rate:
every feed first runs one warm-up epoch (Ray worker start-up, tracing), then
the feeds take turns for a few rounds and the median round counts; within an
epoch the clock starts at the first batch.  MB/s is the TFRecord on-disk size
of the rows delivered.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pyarrow as pa

from .datasets import tf_feature_spec

BATCH = 256
ROUNDS = 3
ROUND_SECONDS = 1.0
# Ray's to_tf builds ragged tensors row by row in Python; a slice gives a stable rate.
TO_TF_ROWS = {"image": 2_000, "tabular": 15_000}


def _variable_length(schema: pa.Schema) -> pa.Schema:
    """The schema with fixed-size lists relaxed to lists, which Ray's to_tf can convert."""
    fields = []
    for f in schema:
        t = pa.list_(f.type.value_type) if pa.types.is_fixed_size_list(f.type) else f.type
        fields.append(pa.field(f.name, t))
    return pa.schema(fields)


def _touch_everything():
    """A training step that reads every tensor of the batch and nothing more."""
    import tensorflow as tf

    def total(t):
        if isinstance(t, tf.RaggedTensor):
            t = t.flat_values
        if t.dtype == tf.string:
            return tf.cast(tf.reduce_sum(tf.strings.length(t)), tf.float32)
        return tf.reduce_sum(tf.cast(t, tf.float32))

    @tf.function(reduce_retracing=True)
    def step(features, label):
        return tf.add_n([total(t) for t in tf.nest.flatten(features, expand_composites=False)] + [total(label)])

    return step


def _epoch_rate(epoch: object, step: Callable) -> tuple[int, float]:
    """Rows and seconds of one epoch, timed from its first batch."""
    start, rows = None, 0
    for features, label in epoch:
        step(features, label)
        if start is None:
            start = time.perf_counter()
        else:
            rows += int(label.shape[0])
    return rows, time.perf_counter() - start


def _measure(feeds: dict[str, object]) -> dict[str, float]:
    """Median rate per feed over interleaved rounds, after one warm-up epoch each.

    Interleaving keeps a burst of load from other processes from landing on one
    implementation only; each round runs a feed's epochs for at least a second.
    """
    step = _touch_everything()
    rates: dict[str, list[float]] = {name: [] for name in feeds}
    for feed in feeds.values():
        _epoch_rate(feed, step)
    for _ in range(ROUNDS):
        for name, feed in feeds.items():
            rows, seconds = 0, 0.0
            while seconds < ROUND_SECONDS:
                r, s = _epoch_rate(feed, step)
                rows, seconds = rows + r, seconds + s
            rates[name].append(rows / seconds)
    return {name: statistics.median(r) for name, r in rates.items()}


def _bench(ctx, name: str) -> list[dict]:
    import ray
    import tensorflow as tf

    import ray_tfrecord
    from ray_tfrecord.tf import tf_dataset

    schema = ctx.image_schema if name == "image" else ctx.tabular_schema
    files = ctx.files(name)
    n_rows = ctx.image_rows if name == "image" else ctx.tabular_rows
    bytes_per_row = ctx.bytes(name) / n_rows
    features = [f for f in schema.names if f != "label"]
    feature_arg = features[0] if len(features) == 1 else features
    feeds: dict[str, object] = {}
    from_files = ray_tfrecord.read_tfrecords(files, schema=schema)
    feeds["ray_tfrecord feed (files)"] = tf_dataset(from_files, feature_columns=feature_arg, label_columns="label", batch_size=BATCH)
    materialized = ray_tfrecord.read_tfrecords(files, schema=schema).materialize()
    feeds["ray_tfrecord feed (materialized)"] = tf_dataset(
        materialized, feature_columns=feature_arg, label_columns="label", batch_size=BATCH
    )
    relaxed = ray_tfrecord.read_tfrecords(files, schema=_variable_length(schema)).limit(TO_TF_ROWS[name]).materialize()
    feeds["Ray DataIterator.to_tf"] = relaxed.iterator().to_tf(feature_arg, "label", batch_size=BATCH)
    spec = tf_feature_spec(schema)
    feeds["tf.data + parse_example"] = (
        tf.data.TFRecordDataset(files, num_parallel_reads=2)
        .batch(BATCH)
        .map(lambda b: tf.io.parse_example(b, spec), num_parallel_calls=2)
        .map(lambda d: ({k: d[k] for k in features} if len(features) > 1 else d[features[0]], d["label"]))
        .prefetch(tf.data.AUTOTUNE)
    )
    results = _measure(feeds)
    ray.shutdown()

    files, cached = results["ray_tfrecord feed (files)"], results["ray_tfrecord feed (materialized)"]

    def ratios(peer: str) -> str:
        return f"feed is {files / results[peer]:.2f}x (files), {cached / results[peer]:.2f}x (materialized)"

    notes = {
        "ray_tfrecord feed (files)": "read_tfrecords -> tf_dataset, every epoch from the files",
        "ray_tfrecord feed (materialized)": "the feed alone (materialized / cached dataset)",
        "Ray DataIterator.to_tf": "lists as variable-length; " + ratios("Ray DataIterator.to_tf"),
        "tf.data + parse_example": "files read directly; " + ratios("tf.data + parse_example"),
    }
    return [
        {
            "bench": "feed",
            "dataset": name,
            "impl": impl,
            "rows_per_s": rate,
            "mb_per_s": rate * bytes_per_row / 1e6,
            "note": notes[impl],
        }
        for impl, rate in results.items()
    ]


def run(ctx) -> list[dict]:
    """Benchmark rows for ``bench/__main__.py``: the image-like and the tabular set."""
    import ray

    rows: list[dict] = []
    for name in ("image", "tabular"):
        ray.shutdown()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        rows += _bench(ctx, name)
    return rows
