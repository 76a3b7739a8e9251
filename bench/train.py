"""Rows per second delivered into TensorFlow inside Ray Train: the feed end to end.

One ``TensorflowTrainer`` run of ``WORKERS`` workers (``CPUS_PER_WORKER`` each, which
leaves Ray Data a CPU for reading on a 2-core machine) reads the benchmark files, each
listed ``PASSES[dataset]`` times (distinct hard links) so that per-epoch start-up does not dominate,
and feeds them these ways, side by side in the same workers:

- ``ray_tfrecord feed``: ``read_tfrecords`` -> ``get_dataset_shard`` -> ``tf_dataset``.
- ``ray_tfrecord feed (decode in worker)``: ``read_tfrecords(record_type="ByteArray")``
  -> ``tf_dataset(record_schema=...)``: Ray moves the serialized records and each training
  worker decodes its own.
- ``Ray DataIterator.to_tf``: Ray's feed on the same dataset shard, given the dense
  ``TensorSpec`` of each column (it cannot infer one for ``fixed_size_list``).
- ``tf.data per worker``: each worker reads its share of the files with
  ``TFRecordDataset`` + ``tf.io.parse_example`` (no Ray Data).
- ``ray_tfrecord feed, strategy=`` (fit only): the same shard, ``tf_dataset(...,
  strategy=strategy, steps_per_epoch=...)``, which cuts per-replica batches itself so that
  Keras does not re-split every element.
- ``Ray iter_batches, no TensorFlow`` (drain only): the shard's Arrow batches with no
  tensor made, Ray Data's delivery alone; no Ray feed can pass it.
- ``one batch repeated in memory, no input`` (fit only): one batch of the per-worker files
  repeated for as many steps as a shard gives, so no input cost at all: the rate Keras and
  the collectives allow, which no feed's ``fit`` can pass.

Column sets: ``dense`` (tabular ``embedding`` + ``label``), ``ragged`` (adds the
variable-length ``ids``; ``to_tf`` builds ragged tensors row by row, so it is left out
here) and ``image`` (784 int64 pixels + label). Two modes per feed: ``drain`` iterates the
epoch and touches every tensor; ``fit`` is Keras ``fit`` of a one-layer model under
``MultiWorkerMirroredStrategy`` with global batch ``BATCH``.

Every feed first runs one warm-up epoch (tracing, worker start-up); then the feeds take
turns for ``ROUNDS`` epochs each and the median counts; the ranks meet at a barrier before
every epoch. An epoch is timed whole, from creating its iterator to its last batch, so a
feed's per-epoch start-up is part of its rate (the drain rows note how long the first batch
took). rows/s is the rows both workers received divided by the slower worker's time.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

import pyarrow as pa

from .datasets import tf_feature_spec

WORKERS = 2
CPUS_PER_WORKER = 0.5
# Passes per dataset: an epoch of a few seconds, so that Ray's per-execution start-up (every epoch
# is a new streaming_split execution; its first second runs one read task at a time) is not
# most of what is timed.
PASSES = {"tabular": 40, "image": 10}
BATCH = 8192
ROUNDS = 3
FIT_EPOCHS = 2

# Column set -> (dataset, features, label, feeds it runs).
OURS, LATE, TO_TF, TF_DATA = (
    "ray_tfrecord feed",
    "ray_tfrecord feed (decode in worker)",
    "Ray DataIterator.to_tf",
    "tf.data per worker",
)
# Fit only: our feed with strategy=, per-replica batches that Keras does not re-split.
PER_REPLICA = "ray_tfrecord feed, strategy= (per-replica batches)"
# Drain only: the shard's own iter_batches, pyarrow, no tensors; what every Ray feed is capped by.
RAY_ONLY = "Ray iter_batches, no TensorFlow"
# Fit only: one batch held in memory and repeated for as many steps as a shard gives; no input
# cost at all, so what Keras and the collectives allow, which caps every feed's fit.
NO_INPUT = "one batch repeated in memory, no input"
_ALL = (OURS, LATE, TO_TF, TF_DATA)
SETS = {
    "dense": ("tabular", ["embedding"], "label", _ALL),
    "ragged": ("tabular", ["embedding", "ids"], "label", (OURS, LATE, TF_DATA)),
    "image": ("image", ["pixels"], "label", _ALL),
}


def _spec_of(t: pa.DataType):
    import tensorflow as tf

    from ray_tfrecord._src.tf.tensors import type_spec

    spec = type_spec(t)
    return tf.TensorSpec(spec.shape, spec.dtype) if isinstance(spec, tf.TensorSpec) else spec


def _inputs(features: list[str]):
    return features[0] if len(features) == 1 else features


def _feeds(config: dict, set_name: str) -> dict:
    """The feeds of one column set; each new iterator over one is a new epoch."""
    import ray.train
    import tensorflow as tf

    from ray_tfrecord.tf import tf_dataset

    dataset, features, label, impls = SETS[set_name]
    shard = ray.train.get_dataset_shard(set_name)
    schema = pa.ipc.read_schema(pa.py_buffer(config["schemas"][dataset]))
    ours = tf_dataset(shard, feature_columns=_inputs(features), label_columns=label, batch_size=BATCH)
    feeds = {OURS: ours}
    if LATE in impls:
        late = tf_dataset(
            ray.train.get_dataset_shard(f"{set_name}_records"),
            feature_columns=_inputs(features),
            label_columns=label,
            batch_size=BATCH,
            record_schema=schema,
        )
        feeds[LATE] = late
    options = tf.data.Options()
    # Ray already sharded: Keras must not shard the Ray feeds, nor the per-worker files, again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    if TO_TF in impls:
        specs = {f: _spec_of(schema.field(f).type) for f in features}
        to_tf = shard.to_tf(
            _inputs(features),
            label,
            batch_size=BATCH,
            drop_last=True,
            feature_type_spec=specs[features[0]] if len(features) == 1 else specs,
            label_type_spec=_spec_of(schema.field(label).type),
        ).with_options(options)
        feeds[TO_TF] = to_tf
    context = ray.train.get_context()
    files = config["files"][dataset][context.get_world_rank() :: context.get_world_size()]
    spec = {k: v for k, v in tf_feature_spec(schema).items() if k in features or k == label}
    per_worker = (
        tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
        .batch(BATCH, drop_remainder=True)
        .map(lambda b: tf.io.parse_example(b, spec), num_parallel_calls=tf.data.AUTOTUNE)
        .map(lambda d: ({k: d[k] for k in features} if len(features) > 1 else d[features[0]], d[label]))
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )
    feeds[TF_DATA] = per_worker
    return feeds


def touch_step():
    import tensorflow as tf

    def total(t):
        if isinstance(t, tf.RaggedTensor):
            t = t.flat_values
        return tf.reduce_sum(tf.cast(t, tf.float32))

    @tf.function(reduce_retracing=True)
    def step(features, label):
        return tf.add_n([total(t) for t in tf.nest.flatten(features)] + [total(label)])

    return step


def drain(batches, consume) -> tuple[int, float, float]:
    """Rows, seconds, and seconds until the first batch (Ray's per-epoch start-up, for Ray
    feeds); ``consume`` touches a batch and returns its row count."""
    start, rows, first = time.perf_counter(), 0, None
    for batch in batches:
        n = consume(batch)
        if first is None:
            first = time.perf_counter() - start
        rows += n
    return rows, time.perf_counter() - start, first


def tensors(step):
    """``_drain``'s consumer for a feed of ``(features, label)`` tensors."""

    def consume(batch) -> int:
        features, label = batch[:2]  # ResumableFeed's elements also carry a weight
        step(features, label)
        return int(label.shape[0])

    return consume


def fit_seconds(model, dataset, epochs: int, **fit_options) -> list[float]:
    """Keras ``fit`` of ``model`` on ``dataset`` for ``epochs`` epochs: each epoch's seconds."""
    import tensorflow as tf

    times: list[float] = []

    class Clock(tf.keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            times.append(time.perf_counter())

        def on_epoch_end(self, epoch, logs=None):
            times[-1] = time.perf_counter() - times[-1]

    model.fit(dataset, epochs=epochs, callbacks=[Clock()], verbose=0, **fit_options)
    return times


def keras_model(tf, features: list[str], element_spec):
    """One Dense layer over the dense inputs (and a ragged column's mean value)."""

    class Scaled(tf.keras.layers.Layer):
        def call(self, t):
            if isinstance(t, tf.RaggedTensor):
                return tf.expand_dims(tf.reduce_mean(tf.cast(t % 1024, tf.float32), 1), 1) / 1024.0
            return tf.cast(t, tf.float32) / 256.0

    spec = element_spec[0]
    specs = spec if isinstance(spec, dict) else {features[0]: spec}
    inputs = {}
    for name, s in specs.items():
        ragged = isinstance(s, tf.RaggedTensorSpec)
        inputs[name] = tf.keras.Input((None,) if ragged else s.shape[1:], dtype=s.dtype, ragged=ragged, name=name)
    parts = [Scaled()(x) for x in inputs.values()]
    merged = parts[0] if len(parts) == 1 else tf.keras.layers.Concatenate()(parts)
    model = tf.keras.Model(inputs if len(inputs) > 1 else inputs[features[0]], tf.keras.layers.Dense(1)(merged))
    model.compile(optimizer=tf.keras.optimizers.SGD(0.001), loss="mse")
    return model


def _loop(config: dict) -> None:
    import ray.train
    import tensorflow as tf
    from ray.train.collective import barrier

    from ray_tfrecord.tf import tf_dataset

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = ray.train.get_context().get_world_rank()
    step = touch_step()
    results: dict[str, dict[str, list]] = {}
    for set_name in config["sets"]:
        _, features, label, _ = SETS[set_name]
        feeds = _feeds(config, set_name)
        drains = {name: (lambda feed=feed: drain(feed, tensors(step))) for name, feed in feeds.items()}
        shard = ray.train.get_dataset_shard(set_name)
        # Ray Data's delivery alone: the shard's Arrow batches, no tensor made.
        drains[RAY_ONLY] = lambda: drain(
            shard.iter_batches(batch_size=BATCH, batch_format="pyarrow", drop_last=True), lambda b: b.num_rows
        )
        drained = {name: [] for name in drains}
        for run in drains.values():
            barrier()
            run()
        for _ in range(config["rounds"]):
            for name, run in drains.items():
                # Both ranks start together, so no feed's time holds the other rank's lag
                # from the feed before (Ray's split waits for every rank to start an epoch).
                barrier()
                drained[name].append(run())
        fitted = {}
        steps = drained[OURS][0][0] // BATCH
        # The batch comes from the per-worker files, not a Ray feed: abandoning a Ray epoch part
        # way would leave the split waiting on it.
        repeated = tf.data.Dataset.from_tensors(next(iter(feeds[TF_DATA]))).repeat(steps)
        # Keras steps of BATCH // WORKERS rows per replica: the rows the other feeds give.
        replica_steps = drained[OURS][0][0] // (BATCH // WORKERS)
        per_replica = tf_dataset(
            shard,
            feature_columns=_inputs(features),
            label_columns=label,
            batch_size=BATCH,
            steps_per_epoch=replica_steps,
            strategy=strategy,
        )
        fits = {**feeds, PER_REPLICA: per_replica, NO_INPUT: repeated.with_options(feeds[TF_DATA].options())}
        for name, feed in fits.items():
            # The per-replica feed reads our feed's shard and rows; its element_spec is per replica.
            like = OURS if name == PER_REPLICA else name
            with strategy.scope():
                model = keras_model(tf, features, fits[like].element_spec)
            barrier()
            times = fit_seconds(model, feed, 1 + config["fit_epochs"],
                                steps_per_epoch=replica_steps if name == PER_REPLICA else None)
            rows = steps * BATCH if name == NO_INPUT else drained[like][0][0]
            fitted[name] = [(rows, t, None) for t in times[1:]]
        results[set_name] = {"drain": drained, "fit": fitted}
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def run_workers(loop, datasets: dict, config: dict, storage_path: str) -> list[dict]:
    """``loop`` on ``WORKERS`` Ray Train workers of ``CPUS_PER_WORKER``; each rank writes its results
    as JSON into ``config["out"]`` (a temporary directory): the ranks' results, by rank."""
    from ray_tfrecord.tf import tensorflow_trainer

    with tempfile.TemporaryDirectory() as out:
        tensorflow_trainer(loop, datasets=datasets, num_workers=WORKERS, cpus_per_worker=CPUS_PER_WORKER,
                           train_loop_config={**config, "out": out}, storage_path=storage_path).fit()
        per_rank = []
        for rank in range(WORKERS):
            with open(os.path.join(out, f"rank{rank}.json")) as f:
                per_rank.append(json.load(f))
    return per_rank


def _rates(per_rank: list[dict], set_name: str, mode: str) -> dict[str, tuple[float, float | None]]:
    """Per feed: the median over rounds of (rows of all ranks) / (slowest rank's seconds), and
    the median of the slowest rank's wait for its first batch (drain only)."""
    out = {}
    for impl in per_rank[0][set_name][mode]:
        rounds = list(zip(*(r[set_name][mode][impl] for r in per_rank), strict=True))
        rate = statistics.median(sum(rows for rows, _, _ in rnd) / max(s for _, s, _ in rnd) for rnd in rounds)
        # None: fit epochs, or a rank whose epoch gave no batch (tiny --quick data).
        firsts = [max(f for _, _, f in rnd if f is not None) for rnd in rounds if any(f is not None for *_, f in rnd)]
        out[impl] = (rate, statistics.median(firsts) if firsts else None)
    return out


def run(ctx) -> list[dict]:
    """Benchmark rows for ``bench/__main__.py``: every column set, drain and fit."""
    import ray

    import ray_tfrecord
    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    schemas = {"tabular": ctx.tabular_schema, "image": ctx.image_schema}
    files = {name: ctx.repeated(name, PASSES[name]) for name in schemas}
    datasets = {}
    for set_name, (dataset, features, label, _) in SETS.items():
        datasets[set_name] = ray_tfrecord.read_tfrecords(
            files[dataset], schema=schemas[dataset], columns=[*features, label]
        )
        datasets[f"{set_name}_records"] = ray_tfrecord.read_tfrecords(files[dataset], record_type="ByteArray")
    config = {
        "sets": list(SETS),
        "files": files,
        "schemas": {k: s.serialize().to_pybytes() for k, s in schemas.items()},
        "rounds": ROUNDS,
        "fit_epochs": FIT_EPOCHS,
    }
    per_rank = run_workers(_loop, datasets, config, os.path.join(ctx.tmp, "train-runs"))
    ray.shutdown()

    rows = []
    for set_name, (dataset, _, _, _) in SETS.items():
        n_rows = ctx.image_rows if dataset == "image" else ctx.tabular_rows
        bytes_per_row = ctx.bytes(dataset) / n_rows
        for mode in ("drain", "fit"):
            measured = _rates(per_rank, set_name, mode)
            rates = {impl: rate for impl, (rate, _) in measured.items()}
            best = max(rates[OURS], rates[LATE], rates.get(PER_REPLICA, 0.0))
            for impl in measured:
                rate, first = measured[impl]
                note = f"{WORKERS} workers, {mode}, global batch {BATCH}"
                if first is not None:
                    note += f", first batch after {first:.2f}s"
                if impl in (RAY_ONLY, NO_INPUT):
                    note += f"; ours reaches {best / rate:.0%} of it"
                elif impl not in (OURS, LATE, PER_REPLICA):
                    note += f"; ours is {rates[OURS] / rate:.2f}x, {best / rate:.2f}x at best"
                rows.append(
                    {
                        "bench": f"train {mode}",
                        "dataset": f"{dataset} ({set_name})",
                        "impl": impl,
                        "rows_per_s": rate,
                        "mb_per_s": rate * bytes_per_row / 1e6,
                        "note": note,
                    }
                )
    return rows
