"""The Dataproc pattern on Ray: CSV with gaps -> statistics artifact -> impute -> TFRecord -> train.

1. sklearn's breast-cancer table (bundled, no download) is written as CSV with
   10% of the measurements blanked out, as raw exports often are.
2. Ray Data reads the CSV and computes every column's mean and standard deviation,
   ignoring the gaps.  These statistics are the preprocessing artifact, saved as
   JSON next to the data so serving can apply the very same transform.
3. Ray fills each gap with its column mean, standardises, packs the 30 values
   into one fixed-length feature and writes TFRecord (train and test).
4. Two Ray Train workers train a classifier on the TFRecords and validate on
   the test split every epoch.

    python train_examples/csv_impute.py
    ray job submit --working-dir . --runtime-env-json '{"excludes": ["ray_tfrecord"]}' \\
        -- python train_examples/csv_impute.py
"""

from __future__ import annotations

import json
import os

import _quiet_tf  # before anything imports TensorFlow: hides its start-up banners
import _example
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
from sklearn.datasets import load_breast_cancer

_quiet_tf.install()

import ray_tfrecord
from ray_tfrecord.tf import ReportCheckpoint, restore, tensorflow_trainer

MISSING = 0.1


def _write_csv_with_gaps(path: str) -> list[str]:
    data = load_breast_cancer()
    rng = np.random.default_rng(0)
    x = data.data.copy()
    x[rng.random(x.shape) < MISSING] = np.nan
    columns = [f"m{i}" for i in range(x.shape[1])]
    header = ["id", *columns, "label"]
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        for i, (row, label) in enumerate(zip(x, data.target, strict=True)):
            cells = ["" if np.isnan(v) else repr(float(v)) for v in row]
            f.write(",".join([str(i), *cells, str(int(label))]) + "\n")
    return columns


def _impute_and_pack(batch: pa.Table, columns: list[str], stats: dict) -> pa.Table:
    scaled = [
        pc.divide(pc.subtract(pc.fill_null(batch.column(c), stats[c]["mean"]), stats[c]["mean"]), stats[c]["std"])
        for c in columns
    ]
    # Row-major (rows, columns) float32 matrix, flattened into one fixed-length feature per row.
    matrix = np.stack([np.asarray(s, dtype=np.float32) for s in scaled], axis=1)
    return pa.table(
        {
            "id": batch.column("id"),
            "measurements": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), len(columns)),
            "label": batch.column("label"),
        }
    )


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker."""
    import tensorflow as tf

    from ray_tfrecord.tf import tf_dataset

    tf.keras.utils.set_random_seed(config["seed"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    def feed(name: str, batch_size: int) -> tf.data.Dataset:
        return tf_dataset(
            ray.train.get_dataset_shard(name), feature_columns="measurements", label_columns="label", batch_size=batch_size
        )

    with strategy.scope():
        model = tf.keras.Sequential(
            [
                tf.keras.Input((config["width"],), name="measurements"),
                tf.keras.layers.Dense(16, activation="relu"),
                tf.keras.layers.Dense(1, activation="sigmoid"),
            ]
        )
        model.compile(optimizer=tf.keras.optimizers.Adam(1e-2), loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(
        feed("train", config["batch_size"]),
        # Small validation batches: the remainder dropped to keep ranks in step stays small.
        validation_data=feed("test", 8),
        epochs=config["epochs"],
        initial_epoch=restore(model),
        callbacks=[ReportCheckpoint()],
        verbose=0,
    )


def main() -> None:
    args = _example.flags(__doc__, epochs=15, min_accuracy=0.9).parse_args()
    out = _example.start(args.out, "csv_impute")
    csv_path = os.path.join(out, "measurements.csv")
    columns = _write_csv_with_gaps(csv_path)
    raw = ray.data.read_csv(csv_path)

    means, stds = raw.mean(columns), raw.std(columns)
    stats = {c: {"mean": means[f"mean({c})"], "std": stds[f"std({c})"]} for c in columns}
    with open(os.path.join(out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    print(f"column statistics (the preprocessing artifact) saved to {out}/stats.json")

    prepared = raw.map_batches(
        _impute_and_pack, batch_format="pyarrow", fn_kwargs={"columns": columns, "stats": stats}
    ).materialize()
    for name, test_rows in [("train", False), ("test", True)]:
        split = prepared.filter(lambda row, test_rows=test_rows: (row["id"] % 5 == 0) == test_rows)
        ray_tfrecord.write_tfrecords(split, os.path.join(out, name), mode="overwrite")
    schema = pa.schema(
        [("id", pa.int64()), ("measurements", pa.list_(pa.float32(), len(columns))), ("label", pa.int64())]
    )
    datasets = {name: ray_tfrecord.read_tfrecords(os.path.join(out, name), schema=schema) for name in ("train", "test")}

    result = tensorflow_trainer(
        train_loop,
        # The files are small and in id order: shuffle so every batch mixes both classes.
        datasets={"train": datasets["train"].random_shuffle(seed=0), "test": datasets["test"]},
        num_workers=args.workers,
        cpus_per_worker=0.5,
        train_loop_config={"epochs": args.epochs, "batch_size": 32, "width": len(columns), "seed": 0},
        storage_path=os.path.join(out, "runs"),
    ).fit()
    accuracy = result.metrics["val_accuracy"]
    print(f"test accuracy on imputed data: {accuracy:.4f} (metrics: {result.metrics})")
    _example.check("test accuracy", accuracy, args.min_accuracy)


if __name__ == "__main__":
    main()
