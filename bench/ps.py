"""Parameter servers and the TensorFlow-native reader.

- ``train``: the digits model of ``train_examples/digits_ps.py`` (64 -> 128 -> 10, Adam), trained with
  tf-keras ``fit`` two ways on the same TFRecord files: ``ps_trainer`` (2 workers and 1 parameter
  server, ``ParameterServerStrategy``, each worker fed its shard by ``tfrecord_dataset``, a step is one
  worker's batch of ``BATCH``), and ``tensorflow_trainer`` (2 workers, ``MultiWorkerMirroredStrategy``,
  fed by ``read_tfrecords`` -> ``tf_dataset``, a step is both workers' batches of ``BATCH``, in sync).
  Each run's first epoch (tracing, start-up) is not timed; rows/s is the rows trained per second of the
  median epoch after it, and the note gives steps/s.
- ``reader``: ``tfrecord_dataset`` beside plain ``tf.data.TFRecordDataset`` -> ``batch`` ->
  ``tf.io.parse_example`` with the hand-written spec, both one stream over the same files, drained
  (every tensor touched), best of ``ROUNDS``.  The same TensorFlow ops: the ratio should be about 1.
"""

from __future__ import annotations

import json
import os
import statistics
import time

import numpy as np
import pyarrow as pa

from .datasets import tf_feature_spec

BATCH = 32
READ_BATCH = 1024
ROUNDS = 3
EPOCHS = {False: 6, True: 3}  # by --quick (the first epoch is not timed)
PIXELS, CLASSES = 64, 10


def _model(tf):
    model = tf.keras.Sequential([tf.keras.Input((PIXELS,)), tf.keras.layers.Dense(128, activation="relu"),
                                 tf.keras.layers.Dense(CLASSES, activation="softmax")])
    model.compile(optimizer=tf.keras.optimizers.Adam(3e-3), loss="sparse_categorical_crossentropy")
    return model


def _epoch_clock(tf, seconds: list):
    starts: list = []
    return tf.keras.callbacks.LambdaCallback(
        on_epoch_begin=lambda epoch, logs: starts.append(time.perf_counter()),
        on_epoch_end=lambda epoch, logs: seconds.append(time.perf_counter() - starts[-1]))


def _ps_loop(config):
    import tensorflow as tf

    from ray_tfrecord.tf import tfrecord_dataset

    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.experimental.ParameterServerStrategy(cluster)
    workers = cluster.cluster_spec().num_tasks("worker")
    plan = config["plan"]

    def dataset_fn(input_context):
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        return tfrecord_dataset(plan, feature_columns="pixels", label_columns="label", batch_size=BATCH,
                                shard=(worker, workers), local_shuffle_buffer_size=256, local_shuffle_seed=0).repeat()

    with strategy.scope():
        model = _model(tf)
    seconds: list = []
    model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=config["epochs"],
              steps_per_epoch=config["steps"], callbacks=[_epoch_clock(tf, seconds)], verbose=0)
    return seconds


def _mwms_loop(config):
    import ray.train
    import tensorflow as tf

    from ray_tfrecord.tf import tf_dataset

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = _model(tf)
    feed = tf_dataset(ray.train.get_dataset_shard("train"), feature_columns="pixels", label_columns="label",
                      batch_size=BATCH * 2)
    seconds: list = []
    model.fit(feed, epochs=config["epochs"], callbacks=[_epoch_clock(tf, seconds)], verbose=0)
    # A file, not ray.train.report: Ray Train v2's result keeps only metrics reported with a checkpoint.
    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "w") as f:
            json.dump(seconds, f)


def _digits(root: str) -> str:
    import ray
    from sklearn.datasets import load_digits

    import ray_tfrecord

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    pixels = (digits.data[order] / 16.0).astype(np.float32).reshape(-1)
    table = pa.table({"pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels), PIXELS),
                      "label": pa.array(digits.target[order], pa.int64())})
    path = os.path.join(root, "digits")
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), path, mode="overwrite")
    return path


def _train(ctx, quick: bool) -> list[dict]:
    import ray

    import ray_tfrecord
    from ray_tfrecord.tf import plan_splits, ps_trainer, tensorflow_trainer

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        path = _digits(ctx.tmp)
        plan = plan_splits(path)
        epochs = EPOCHS[quick]
        ps = ps_trainer(_ps_loop, num_workers=2, num_ps=1, cpus_per_worker=0.25, cpus_per_ps=0.25,
                        train_loop_config={"plan": plan, "epochs": epochs, "steps": plan.rows // BATCH},
                        storage_path=os.path.join(ctx.tmp, "runs"), name="bench_ps").fit()
        ps_rate = (plan.rows // BATCH) * BATCH / statistics.median(ps.metrics[1:])
        out = os.path.join(ctx.tmp, "mwms_seconds.json")
        tensorflow_trainer(_mwms_loop, datasets={"train": ray_tfrecord.read_tfrecords(path)}, num_workers=2,
                           cpus_per_worker=0.5, train_loop_config={"epochs": epochs, "out": out},
                           storage_path=os.path.join(ctx.tmp, "runs"), name="bench_mwms").fit()
        with open(out) as f:
            mwms_rate = (plan.rows // (2 * BATCH)) * 2 * BATCH / statistics.median(json.load(f)[1:])
    finally:
        ray.shutdown()
    bytes_per_row = sum(os.path.getsize(p) for p in {s.path for s in plan.splits}) / plan.rows
    return [
        {"bench": "ps", "dataset": "digits", "impl": "ps_trainer, 2 workers + 1 PS, tfrecord_dataset",
         "rows_per_s": ps_rate, "mb_per_s": ps_rate * bytes_per_row / 1e6,
         "note": f"{ps_rate / BATCH:.0f} steps/s of {BATCH} rows (one worker's); "
                 f"{ps_rate / mwms_rate:.2f}x MultiWorkerMirroredStrategy"},
        {"bench": "ps", "dataset": "digits", "impl": "tensorflow_trainer, 2 workers (MWMS), tf_dataset",
         "rows_per_s": mwms_rate, "mb_per_s": mwms_rate * bytes_per_row / 1e6,
         "note": f"{mwms_rate / (2 * BATCH):.0f} steps/s of {2 * BATCH} rows (both workers', in sync)"},
    ]


def _drain(dataset) -> tuple[int, float]:
    import tensorflow as tf

    start, rows = time.perf_counter(), 0
    for features, label in dataset:
        for t in tf.nest.flatten((features, label), expand_composites=True):
            t.numpy()
        rows += int(label.shape[0])
    return rows, time.perf_counter() - start


def _reader(ctx, name: str) -> list[dict]:
    import tensorflow as tf

    from ray_tfrecord.tf import plan_splits, tfrecord_dataset

    schema = ctx.image_schema if name == "image" else ctx.tabular_schema
    files = ctx.files(name)
    features = [f for f in schema.names if f != "label"]
    spec = tf_feature_spec(schema)
    plan = plan_splits(files, schema=schema)
    ours = tfrecord_dataset(plan, feature_columns=features, label_columns="label", batch_size=READ_BATCH,
                            drop_last=False)
    plain = (tf.data.TFRecordDataset(files).batch(READ_BATCH)
             .map(lambda b: tf.io.parse_example(b, spec), num_parallel_calls=tf.data.AUTOTUNE)
             .map(lambda d: ({k: d[k] for k in features}, d["label"])).prefetch(tf.data.AUTOTUNE))
    best: dict[str, float] = {}
    for _ in range(ROUNDS):
        for impl, dataset in (("tfrecord_dataset", ours), ("tf.data + parse_example", plain)):
            rows, seconds = _drain(dataset)
            assert rows == plan.rows, (impl, rows, plan.rows)
            best[impl] = max(best.get(impl, 0.0), rows / seconds)
    bytes_per_row = ctx.bytes(name) / plan.rows
    ours, plain_rate = best["tfrecord_dataset"], best["tf.data + parse_example"]
    ratio = ours / plain_rate
    return [
        {"bench": "ps", "dataset": name, "impl": "reader: tfrecord_dataset", "rows_per_s": ours,
         "mb_per_s": ours * bytes_per_row / 1e6,
         "note": f"{ratio:.2f}x plain tf.data; spec from the plan's schema"},
        {"bench": "ps", "dataset": name, "impl": "reader: tf.data + parse_example",
         "rows_per_s": plain_rate, "mb_per_s": plain_rate * bytes_per_row / 1e6,
         "note": "hand-written spec, the same files"},
    ]


def run(ctx) -> list[dict]:
    quick = ctx.tabular_rows < 100_000  # --quick's datasets: the sections get no flag of their own
    rows = _reader(ctx, "tabular") + _reader(ctx, "image")
    for r in rows:
        print(f"  {r['dataset']:8s} {r['impl']:40s} {r['rows_per_s']:>12,.0f} rows/s  {r['note']}", flush=True)
    trained = _train(ctx, quick)
    for r in trained:
        print(f"  {r['dataset']:8s} {r['impl']:48s} {r['rows_per_s']:>10,.0f} rows/s  {r['note']}", flush=True)
    return rows + trained
