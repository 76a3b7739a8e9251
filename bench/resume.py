"""The resumable feed beside the streaming feed, and how its batches mix.

Speed pairs, both feeds of a pair in the same ``TensorflowTrainer`` run (``train.WORKERS`` workers of
``train.CPUS_PER_WORKER``, which leaves Ray Data a CPU for reading on a 2-core machine), over the same
files (the benchmark files listed ``PASSES[dataset]`` times, as hard links):

- ``streaming feed``: ``read_tfrecords`` -> ``get_dataset_shard`` -> ``tf_dataset``: Ray's
  ``streaming_split``, whose epoch starts over after a failure;
- ``ResumableFeed``: the same files planned into record-exact splits (``plan_splits``), each rank
  reading its share in Ray Data tasks: the feed that resumes mid-epoch, every row once.

for the dense tabular columns, the image rows, and the dense rows with the same transform
(``map_batches`` before ``streaming_split``; ``transform=`` in the resumable feed, which reads every
column for it, so the streaming side reads every column too).  Two modes: ``drain`` iterates each
epoch and touches every tensor; ``fit`` is Keras ``fit`` of one Dense layer under
``MultiWorkerMirroredStrategy``.

A pair's feeds take turns in blocks, as a training run feeds them: one untimed epoch (tracing,
start-up), ``EPOCHS`` timed epochs of the same feed in a row, then one more untimed epoch.  The
resumable feed reads an epoch's first blocks while the one before ends: the untimed epochs on each
side make the timed ones read exactly their own rows' worth (the head of the first read before the
timer, the head of the trailing one within it), as every epoch of a long run does; its block is
a new feed with ``run_until``, so that no read of it runs into the other feed's turn.  The turns
alternate which feed goes first.  rows/s: the rows both ranks received (the resumable feed's
weight-0 padding counts, as rows it fed) over the wall-clock span from the first rank's start to
the last rank's end of the timed epochs, median over ``ROUNDS``; a drain's epochs end with a
barrier, as training's collectives keep the ranks in step.

Mixing: distinct labels per 256-row batch on ``write_tfrecords(partition_cols=["label"])`` data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time

import pyarrow as pa

from .train import WORKERS, drain, fit_seconds, keras_model, run_workers, tensors, touch_step

PASSES = {"tabular": 20, "image": 10}
BATCH = 8192
ROUNDS = 3
EPOCHS = 2
STREAM, RESUMABLE = "ray_tfrecord streaming feed (tf_dataset on streaming_split)", "ray_tfrecord ResumableFeed"
# Pair -> (dataset, feature column, with the transform).
PAIRS = {
    "dense": ("tabular", "embedding", False),
    "image": ("image", "pixels", False),
    "dense_transformed": ("tabular", "embedding", True),
}


def preprocess(batch: pa.Table) -> pa.Table:
    """A typical row-wise preprocessing step, vectorised: the label rescaled."""
    import pyarrow.compute as pc

    index = batch.column_names.index("label")
    return batch.set_column(index, "label", pc.multiply(batch.column("label"), 2))


def _timed_drains(dataset, step) -> list[tuple[int, float, float]]:
    """``(rows, start, end)`` (wall clock) of each timed epoch, ended by a barrier: a drain has no
    collective to keep the ranks in step, as training has, and without one a resumable feed's rank
    can take the reading CPU for its next epochs while the other has not finished this one."""
    from ray.train.collective import barrier

    epochs = []
    for _ in range(2 + EPOCHS):
        start = time.time()
        rows = drain(dataset, tensors(step))[0]
        barrier()
        epochs.append((rows, start, time.time()))
    return epochs[1:-1]


def _timed_fit(dataset, feature: str, strategy, rows: int) -> list[tuple[int, float, float]]:
    """``(rows, start, end)`` (wall clock) of each timed epoch of one ``fit``."""
    import tensorflow as tf

    with strategy.scope():
        model = keras_model(tf, [feature], dataset.element_spec)
    times = fit_seconds(model, dataset, 2 + EPOCHS)
    end = time.time() - times[-1]
    ends = [end - sum(times[k + 1:-1]) for k in range(1, 1 + EPOCHS)]
    return [(rows, e - t, e) for t, e in zip(times[1:-1], ends, strict=True)]


def _loop(config: dict) -> None:
    import ray.train
    import tensorflow as tf
    from ray.train.collective import barrier

    from ray_tfrecord.tf import ResumableFeed, tf_dataset

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    step = touch_step()
    results: dict = {}
    for pair in config["pairs"]:
        dataset, feature, transformed = PAIRS[pair]
        stream = tf_dataset(ray.train.get_dataset_shard(pair), feature_columns=feature, label_columns="label",
                            batch_size=BATCH)

        def resumable(dataset=dataset, feature=feature, transformed=transformed):
            feed = ResumableFeed(config["plans"][dataset], feature_columns=feature, label_columns="label",
                                 batch_size=BATCH, transform=preprocess if transformed else None)
            feed.run_until(2 + EPOCHS)
            return feed.dataset()

        makers = {STREAM: lambda stream=stream: stream, RESUMABLE: resumable}
        results[pair] = {mode: {impl: [] for impl in makers} for mode in ("drain", "fit")}
        for mode in ("drain", "fit"):
            for round_ in range(ROUNDS):
                for impl in list(makers)[:: 1 if round_ % 2 == 0 else -1]:
                    barrier()
                    if mode == "drain":
                        measured = _timed_drains(makers[impl](), step)
                    else:
                        rows = results[pair]["drain"][impl][0][0][0]
                        measured = _timed_fit(makers[impl](), feature, strategy, rows)
                    results[pair][mode][impl].append(measured)
    rank = ray.train.get_context().get_world_rank()
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


def _rate(per_rank: list[dict], pair: str, mode: str, impl: str) -> float:
    """Median over rounds of (rows of all ranks) / (first rank's start to last rank's end of the
    timed epochs)."""
    rounds = zip(*(r[pair][mode][impl] for r in per_rank), strict=True)
    return statistics.median(sum(n for epochs in rnd for n, _, _ in epochs)
                             / (max(e for epochs in rnd for _, _, e in epochs)
                                - min(s for epochs in rnd for _, s, _ in epochs))
                             for rnd in rounds)


def _repeated_plan(ctx, name: str, links: list[str], schema: pa.Schema):
    """The splits of ``links`` (the dataset's files, passes times over): the files are planned once
    and their splits repeated under each link's name, not scanned once per link."""
    from ray_tfrecord.tf import plan_splits

    plan = plan_splits(ctx.files(name), schema=schema)
    by_file: dict[str, list] = {}
    for split in plan.splits:
        by_file.setdefault(os.path.basename(split.path), []).append(split)
    splits = tuple(dataclasses.replace(s, path=link) for link in links for s in by_file.get(os.path.basename(link), []))
    return dataclasses.replace(plan, splits=splits)


def run(ctx) -> list[dict]:
    """Benchmark rows for ``bench/__main__.py``: the speed pairs, then the mixing rows."""
    import ray

    import ray_tfrecord

    ray.shutdown()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    # First, on the Ray started here: a second ray.init in this process once lost its raylet.
    mixing = _mixing(ctx)
    schemas = {"tabular": ctx.tabular_schema, "image": ctx.image_schema}
    files = {name: ctx.repeated(name, PASSES[name]) for name in schemas}
    datasets = {}
    for pair, (dataset, feature, transformed) in PAIRS.items():
        read = ray_tfrecord.read_tfrecords(files[dataset], schema=schemas[dataset],
                                           columns=None if transformed else [feature, "label"])
        datasets[pair] = read.map_batches(preprocess, batch_format="pyarrow") if transformed else read
    config = {"plans": {name: _repeated_plan(ctx, name, files[name], schemas[name]) for name in schemas},
              "pairs": list(PAIRS)}
    per_rank = run_workers(_loop, datasets, config, os.path.join(ctx.tmp, "resume-runs"))
    ray.shutdown()

    rows = []
    for pair, (dataset, _, transformed) in PAIRS.items():
        n_rows = ctx.image_rows if dataset == "image" else ctx.tabular_rows
        bytes_per_row = ctx.bytes(dataset) / n_rows
        for mode in ("drain", "fit"):
            rates = {impl: _rate(per_rank, pair, mode, impl) for impl in (STREAM, RESUMABLE)}
            for impl, rate in rates.items():
                note = f"{WORKERS} workers, {mode}, global batch {BATCH}, {EPOCHS} epochs in a row"
                if impl == RESUMABLE:
                    note += f"; {rate / rates[STREAM]:.2f}x the streaming feed, same run"
                rows.append({"bench": f"resume {mode}", "dataset": f"{dataset} ({pair})",
                             "impl": impl + (" + transform" if transformed else ""), "rows_per_s": rate,
                             "mb_per_s": rate * bytes_per_row / 1e6, "note": note})
    return rows + mixing


MIX_ROWS, MIX_LABELS, MIX_BATCH, MIX_WIDTH = 100_000, 10, 256, 200


def _mixing(ctx) -> list[dict]:
    """Distinct labels per 256-row batch on ``write_tfrecords(partition_cols=["label"])`` data (100,000
    rows of ``MIX_WIDTH`` floats, 10 labels, a directory each), 2 ranks: the resumable feed with its
    default ``block_splits``, with ``block_splits=1`` (a split's rows only), and tf.data's usual recipe (files shuffled,
    ``interleave(cycle_length=4)``, ``shuffle(10_000)``).  Memory: the largest block a read task holds
    decoded (``mix`` splits), as Arrow bytes."""
    import glob

    import numpy as np
    import ray
    import tensorflow as tf

    import ray_tfrecord
    from ray_tfrecord._src.data.feed.order import mix_blocks
    from ray_tfrecord.tf import ResumableFeed, plan_splits

    path = os.path.join(ctx.tmp, "by_label")
    ids = np.arange(MIX_ROWS)
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.random.default_rng(0).random(MIX_ROWS * MIX_WIDTH, np.float32)),
                                          MIX_WIDTH)
    if not os.path.exists(path):
        ray_tfrecord.write_tfrecords(ray.data.from_arrow(pa.table({"label": ids % MIX_LABELS, "x": x})), path,
                                     partition_cols=["label"])
    plan = plan_splits(path)
    row_bytes = MIX_WIDTH * 4 + 8
    results = {}
    for mix in (16, 1):
        counts = []
        for rank in range(2):
            feed = ResumableFeed(plan, feature_columns="x", label_columns="label", batch_size=MIX_BATCH, block_splits=mix,
                                 rank=rank, world_size=2)
            counts += [len(set(labels.numpy()[w.numpy() > 0].tolist())) for _, labels, w in feed.dataset()]
        block = max(sum(plan.splits[i].rows for i in b) for b in mix_blocks(len(plan.splits), mix))
        results[f"ResumableFeed, block_splits={mix}"] = (counts, block * row_bytes)
    files = sorted(glob.glob(os.path.join(path, "label=*", "*.tfrecord")))
    label_of = {f: int(f.split("label=")[1].split("/")[0]) for f in files}
    # Each record stands for its file (its label), in the order the recipe reads records: no parsing needed.
    per_file = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=0).interleave(
        lambda f: tf.data.TFRecordDataset(f).map(lambda _: f), cycle_length=4).shuffle(10_000, seed=0).batch(MIX_BATCH)
    counts = [len({label_of[f.decode()] for f in batch.numpy()}) for batch in per_file]
    results["tf.data: files shuffled, interleave(4), shuffle(10_000)"] = (counts, 10_000 * row_bytes)
    rows = []
    for impl, (counts, memory) in results.items():
        single = sum(c == 1 for c in counts) / len(counts)
        rows.append({"bench": "resume mixing", "dataset": f"{MIX_ROWS:,} rows, partition_cols=['label'], 10 labels",
                     "impl": impl, "note": f"median {statistics.median(counts):g} distinct labels per {MIX_BATCH}-row "
                     f"batch, {single:.0%} single-label; holds {memory / 2**20:.0f} MiB of rows decoded"})
    return rows
