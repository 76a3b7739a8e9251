"""Handwritten digits, end to end: TFRecord on disk -> 2-worker TensorFlow training -> batch inference.

1. sklearn's ``load_digits`` (bundled, no download) is split into train and test
   and written as TFRecord, partitioned by label (``label=3/part-....tfrecord``).
2. Both sets are read back with ``read_tfrecords``; the label comes back from the
   directory names as an int.
3. Two Ray Train workers train a small network with
   ``MultiWorkerMirroredStrategy``, fed by ``ray_tfrecord.tf.tf_dataset`` and
   checkpointing every epoch.
4. The trained model from the last checkpoint classifies the test set with Ray
   Data actors; predictions are written as TFRecord, keyed by row id, then read
   back to check there is exactly one per test row and to score them.

Run it directly (starts a local Ray)::

    python train_examples/digits.py

or as a job on a running cluster (``ray start --head``)::

    ray job submit --working-dir . \\
        --runtime-env-json '{"excludes": ["ray_tfrecord"]}' \\
        -- python train_examples/digits.py

(``excludes`` keeps the job from uploading a source copy of ``ray_tfrecord``
without its compiled extension over the package installed on the nodes.)
On a multi-node cluster ``--out`` must be storage every node can reach.
"""

from __future__ import annotations

import logging
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
from ray_tfrecord.tf import MODEL_FILE, ReportCheckpoint, inference, restore, tensorflow_trainer

PIXELS = 64
CLASSES = 10
# Read the pixels back as a fixed-length vector, so the feed yields a dense (batch, 64) tensor.
SCHEMA = pa.schema([("id", pa.int64()), ("pixels", pa.list_(pa.float32(), PIXELS))])


def _digits_table(images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> pa.Table:
    pixels = (images / 16.0).astype(np.float32).reshape(-1)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels), PIXELS),
            "label": pa.array(labels, pa.int64()),
        }
    )


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker."""
    import tensorflow as tf

    from ray_tfrecord.tf import tf_dataset

    tf.keras.utils.set_random_seed(config["seed"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((PIXELS,), name="pixels"),
                tf.keras.layers.Dense(128, activation="relu"),
                tf.keras.layers.Dense(CLASSES, activation="softmax"),
            ]
        )
        model.compile(
            optimizer=tf.keras.optimizers.Adam(config["lr"]),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
    start_epoch = restore(model)
    # Ray Train's report line per epoch and worker carries the metrics; its checkpoint line adds nothing.
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    feed = tf_dataset(
        ray.train.get_dataset_shard("train"),
        feature_columns="pixels",
        label_columns="label",
        batch_size=config["batch_size"],
    )
    model.fit(
        feed,
        epochs=config["epochs"],
        initial_epoch=start_epoch,
        callbacks=[ReportCheckpoint()],
        verbose=0,
    )


def main() -> None:
    parser = _example.flags(__doc__, epochs=15, min_accuracy=0.95)
    parser.add_argument("--batch-size", type=int, default=64, help="global: split across the workers each step")
    args = parser.parse_args()
    started = time.monotonic()
    out = _example.start(args.out, "digits")
    digits = load_digits()
    ids = np.arange(len(digits.target))
    x_train, x_test, y_train, y_test, id_train, id_test = train_test_split(
        digits.data, digits.target, ids, test_size=0.2, stratify=digits.target, random_state=0
    )
    for name, table in [
        ("train", _digits_table(x_train, y_train, id_train)),
        ("test", _digits_table(x_test, y_test, id_test)),
    ]:
        ray_tfrecord.write_tfrecords(
            ray.data.from_arrow(table), os.path.join(out, name), partition_cols=["label"], mode="overwrite"
        )
    print(f"wrote {len(y_train)} train and {len(y_test)} test digits as TFRecord under {out}")

    # The files are grouped by label, so shuffle: a batch of one digit teaches little.
    train_ds = ray_tfrecord.read_tfrecords(os.path.join(out, "train"), schema=SCHEMA).random_shuffle(seed=0)
    trainer = tensorflow_trainer(
        train_loop,
        datasets={"train": train_ds},
        num_workers=args.workers,
        cpus_per_worker=0.5,
        train_loop_config={"epochs": args.epochs, "batch_size": args.batch_size, "lr": 3e-3, "seed": 0},
        storage_path=os.path.join(out, "runs"),
        # TensorFlow's C++ INFO lines (its collective service connecting, per worker); warnings stay.
        env_vars={"TF_CPP_MIN_LOG_LEVEL": "1"},
    )
    print(f"training {args.epochs} epochs on {args.workers} workers", flush=True)
    result = trainer.fit()
    print(f"trained: loss {result.metrics['loss']:.3f}, accuracy {result.metrics['accuracy']:.3f}; "
          f"model in {os.path.join(result.checkpoint.path, MODEL_FILE)}")

    test_ds = ray_tfrecord.read_tfrecords(os.path.join(out, "test"), schema=SCHEMA)
    predictions_dir = os.path.join(out, "predictions")
    inference(
        test_ds,
        os.path.join(result.checkpoint.path, MODEL_FILE),
        predictions_dir,
        feature_columns="pixels",
        key_columns=["id", "label"],
        mode="overwrite",
        num_cpus=0.5,
    )

    predictions = ray_tfrecord.read_tfrecords(
        predictions_dir,
        schema=pa.schema([("id", pa.int64()), ("label", pa.int64()), ("prediction", pa.list_(pa.float32(), CLASSES))]),
    ).to_arrow_refs()
    table = pa.concat_tables(ray.get(predictions))
    got_ids = np.sort(table.column("id").to_numpy())
    assert np.array_equal(got_ids, np.sort(id_test)), (
        f"expected one prediction per test row ({len(id_test)}), got {len(got_ids)}"
    )
    probs = np.asarray(table.column("prediction").combine_chunks().flatten()).reshape(-1, CLASSES)
    accuracy = float(np.mean(probs.argmax(axis=1) == table.column("label").to_numpy()))
    print(f"test accuracy: {accuracy:.4f} on {len(got_ids)} predictions written to {predictions_dir}")
    print(f"done in {time.monotonic() - started:.0f}s")
    _example.check("test accuracy", accuracy, args.min_accuracy)


if __name__ == "__main__":
    main()
