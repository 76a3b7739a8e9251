"""Variable-length sequences, end to end: SequenceExample TFRecords -> ragged input -> 2 workers.

Each record is a ``tf.train.SequenceExample``: an ``id`` and a ``label`` in the
context, and a feature list ``steps`` with a variable number of steps, each a
variable number of token ids.  The label says whether token 3 occurs anywhere.
Ray Data reads the records back as ``list<list<int64>>``; the feed hands that to
Keras as a ``tf.RaggedTensor`` with two ragged dimensions (no padding), and a
small model embeds the tokens, sums each step, max-pools over steps and
classifies.  Validation runs on every worker each epoch, in step.

    python train_examples/sequences.py
    ray job submit --working-dir . --runtime-env-json '{"excludes": ["ray_tfrecord"]}' \\
        -- python train_examples/sequences.py
"""

from __future__ import annotations

import os

import _quiet_tf  # before anything imports TensorFlow: hides its start-up banners
import _example
import numpy as np
import pyarrow as pa
import ray

_quiet_tf.install()

import ray_tfrecord
from ray_tfrecord.tf import ReportCheckpoint, restore, tensorflow_trainer

VOCAB = 10
MARKER = 3
SCHEMA = pa.schema([("id", pa.int64()), ("label", pa.int64()), ("steps", pa.list_(pa.list_(pa.int64())))])


def _sequences(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    steps = [[rng.integers(0, VOCAB, rng.integers(1, 5)).tolist() for _ in range(rng.integers(1, 6))] for _ in range(n)]
    labels = [int(any(MARKER in step for step in seq)) for seq in steps]
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "label": pa.array(labels, pa.int64()),
            "steps": pa.array(steps, SCHEMA.field("steps").type),
        }
    )


def train_loop(config: dict) -> None:
    """Runs on every Ray Train worker."""
    import tensorflow as tf

    from ray_tfrecord.tf import tf_dataset

    class BagOfSteps(tf.keras.layers.Layer):
        """Embeds tokens, sums them within each step, max-pools over the steps."""

        def build(self, input_shape):
            self.table = self.add_weight(name="embedding", shape=(VOCAB, config["dim"]))

        def call(self, steps: tf.RaggedTensor) -> tf.Tensor:
            vectors = steps.with_flat_values(tf.nn.embedding_lookup(self.table, steps.flat_values))
            return tf.reduce_max(tf.reduce_sum(vectors, axis=2), axis=1)

    def feed(name: str) -> tf.data.Dataset:
        return tf_dataset(
            ray.train.get_dataset_shard(name), feature_columns="steps", label_columns="label", batch_size=config["batch_size"]
        )

    tf.keras.utils.set_random_seed(config["seed"])
    # The strategy must exist before any other TensorFlow op runs, feeds included.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    train, valid = feed("train"), feed("valid")
    with strategy.scope():
        steps = tf.keras.Input(type_spec=train.element_spec[0], name="steps")
        hidden = tf.keras.layers.Dense(16, activation="relu")(BagOfSteps()(steps))
        model = tf.keras.Model(steps, tf.keras.layers.Dense(1, activation="sigmoid")(hidden))
        model.compile(
            optimizer=tf.keras.optimizers.Adam(config["lr"]), loss="binary_crossentropy", metrics=["accuracy"]
        )
    model.fit(
        train,
        validation_data=valid,
        epochs=config["epochs"],
        initial_epoch=restore(model),
        callbacks=[ReportCheckpoint(keras_file=False)],
        verbose=0,
    )


def main() -> None:
    args = _example.flags(__doc__, epochs=8, min_accuracy=0.9).parse_args()
    out = _example.start(args.out, "sequences")
    for name, rows, seed in [("train", 4000, 0), ("valid", 1000, 1)]:
        ray_tfrecord.write_tfrecords(
            ray.data.from_arrow(_sequences(rows, seed)),
            os.path.join(out, name),
            record_type="SequenceExample",
            mode="overwrite",
        )
    datasets = {
        name: ray_tfrecord.read_tfrecords(os.path.join(out, name), record_type="SequenceExample", schema=SCHEMA)
        for name in ("train", "valid")
    }
    result = tensorflow_trainer(
        train_loop,
        datasets=datasets,
        num_workers=args.workers,
        cpus_per_worker=0.5,
        train_loop_config={"epochs": args.epochs, "batch_size": 64, "dim": 8, "lr": 1e-2, "seed": 0},
        storage_path=os.path.join(out, "runs"),
    ).fit()
    accuracy = result.metrics["val_accuracy"]
    print(f"validation accuracy after {args.epochs} epochs: {accuracy:.4f} (metrics: {result.metrics})")
    _example.check("validation accuracy", accuracy, args.min_accuracy)


if __name__ == "__main__":
    main()
