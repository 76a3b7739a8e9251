"""Handwritten digits with parameter servers: TFRecord on disk -> 2 workers and 1 parameter server on Ray,
each worker reading its own share of the files with TensorFlow's ops -> test accuracy.

1. sklearn's ``load_digits`` (bundled, no download) is split into train and test and written as
   TFRecord, the rows in a shuffled order, so that every worker's share holds every digit.
2. ``ps_trainer`` starts a parameter server, two workers and a chief as Ray actors; the chief runs
   ``train`` below: tf-keras ``fit`` under ``ParameterServerStrategy``, each worker fed by
   ``tfrecord_dataset`` (its shard of the rows, chosen by its worker index), checkpointing every
   epoch with ``BackupAndRestore`` and logging to TensorBoard.
3. The chief saves the model and scores it on the test set.

Run it directly (starts a local Ray)::

    python train_examples/digits_ps.py

or as a job on a running cluster (``ray start --head``)::

    ray job submit --working-dir . \\
        --runtime-env-json '{"excludes": ["ray_tfrecord"]}' \\
        -- python train_examples/digits_ps.py

On a multi-node cluster ``--out`` must be storage every node can reach.
"""

from __future__ import annotations

import os
import time

import _quiet_tf  # before anything imports TensorFlow: hides its start-up banners
import _example
import numpy as np
import pyarrow as pa
import ray
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

_quiet_tf.install()

import ray_tfrecord
from ray_tfrecord.tf import plan_splits, ps_checkpoint_dir, ps_trainer

PIXELS = 64
CLASSES = 10


def _digits_table(images: np.ndarray, labels: np.ndarray) -> pa.Table:
    pixels = (images / 16.0).astype(np.float32).reshape(-1)
    return pa.table({"pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels), PIXELS),
                     "label": pa.array(labels, pa.int64())})


def train(config: dict) -> dict:
    """Runs on the chief: the workers run the steps it schedules, on the variables the parameter server holds."""
    import tensorflow as tf

    from ray_tfrecord.tf import TensorBoard, tfrecord_dataset

    tf.keras.utils.set_random_seed(config["seed"])
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver()  # the TF_CONFIG ps_trainer wrote
    strategy = tf.distribute.experimental.ParameterServerStrategy(cluster)
    workers = cluster.cluster_spec().num_tasks("worker")
    plan = plan_splits(config["train"])

    def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
        # Traced once for every worker: the index is a tensor each worker fills in with its own.
        worker = tf.distribute.coordinator.experimental_get_current_worker_index()
        feed = tfrecord_dataset(plan, feature_columns="pixels", label_columns="label",
                                batch_size=config["batch_size"], shard=(worker, workers),
                                local_shuffle_buffer_size=256, local_shuffle_seed=config["seed"])
        return feed.repeat()  # the coordinator takes steps_per_epoch steps from whichever workers are free

    with strategy.scope():
        model = tf.keras.Sequential([
            tf.keras.Input((PIXELS,), name="pixels"),
            tf.keras.layers.Dense(128, activation="relu"),
            tf.keras.layers.Dense(CLASSES, activation="softmax"),
        ])
        model.compile(optimizer=tf.keras.optimizers.Adam(config["lr"]), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"])
    model.fit(
        tf.keras.utils.experimental.DatasetCreator(dataset_fn),
        epochs=config["epochs"],
        steps_per_epoch=plan.rows // config["batch_size"],
        # Every epoch's weights and optimizer state go to the run's checkpoints: a cluster started again
        # after a parameter server or the chief stopped resumes from the last one.
        callbacks=[tf.keras.callbacks.BackupAndRestore(ps_checkpoint_dir()), TensorBoard()],
        verbose=0,
    )
    model.save(config["model"])
    test = tfrecord_dataset(plan_splits(config["test"]), feature_columns="pixels", label_columns="label",
                            batch_size=128, drop_last=False)
    trained = tf.keras.models.load_model(config["model"])  # outside the strategy: scored on the chief
    _, accuracy = trained.evaluate(test, verbose=0)
    return {"test_accuracy": float(accuracy), "rows": plan.rows}


def main() -> None:
    parser = _example.flags(__doc__, epochs=15, min_accuracy=0.95)
    parser.add_argument("--ps", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker step")
    args = parser.parse_args()
    started = time.monotonic()
    out = _example.start(args.out, "digits_ps")
    digits = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(digits.data, digits.target, test_size=0.2,
                                                        stratify=digits.target, random_state=0)
    for name, table in [("train", _digits_table(x_train, y_train)), ("test", _digits_table(x_test, y_test))]:
        ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), os.path.join(out, name), mode="overwrite")
    print(f"wrote {len(y_train)} train and {len(y_test)} test digits as TFRecord under {out}")

    trainer = ps_trainer(
        train,
        num_workers=args.workers,
        num_ps=args.ps,
        # Small shares: the tasks mostly wait on each other's RPCs, and a 2-CPU machine holds them all.
        cpus_per_worker=0.25,
        cpus_per_ps=0.25,
        train_loop_config={"train": os.path.join(out, "train"), "test": os.path.join(out, "test"),
                           "model": os.path.join(out, "model.keras"), "epochs": args.epochs,
                           "batch_size": args.batch_size, "lr": 3e-3, "seed": 0},
        storage_path=os.path.join(out, "runs"),
        name="digits_ps",
        tensorboard=True,
    )
    result = trainer.fit()
    accuracy = result.metrics["test_accuracy"]
    print(f"trained {args.epochs} epochs on {args.workers} workers and {args.ps} parameter server(s), "
          f"{result.failures} restart(s)")
    print(f"test accuracy: {accuracy:.4f} on {len(y_test)} test digits; model at {os.path.join(out, 'model.keras')}")
    print(f"done in {time.monotonic() - started:.0f}s")
    _example.check("test accuracy", accuracy, args.min_accuracy)


if __name__ == "__main__":
    main()
