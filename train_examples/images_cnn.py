"""A small CNN on ImageNet-style JPEG TFRecords, the images decoded and augmented in Ray Data.

1. ``imagenet_like.py`` writes train and validation TFRecords with ``build_imagenet_data.py``'s keys
   (``image/encoded`` JPEGs at quality 90, ``image/class/label`` from 1), cut from the photos
   scikit-learn ships: nothing is downloaded.
2. Training reads them through the resumable feed (``ResumableFeed``), whose Ray Data tasks run ``ImageTransform``:
   decode, random-resized-crop and flip drawn from each row's seed (so a resumed epoch augments as
   an uninterrupted one would), resize, out as one dense uint8 tensor per batch.
3. Validation decodes with the evaluation crop, and the script prints the accuracy and the images
   per second training reached.

Run it directly (starts a local Ray)::

    python train_examples/images_cnn.py            # --fast: a smaller set, a few seconds of training

or as a job on a running cluster (``ray start --head``)::

    ray job submit --working-dir . \\
        --runtime-env-json '{"excludes": ["ray_tfrecord"]}' \\
        -- python train_examples/images_cnn.py

On a multi-node cluster ``--out`` must be storage every node can reach.
"""

from __future__ import annotations

import os
import time

import _quiet_tf  # before anything imports TensorFlow: hides its start-up banners
import _example
from imagenet_like import CLASSES, write_image_set

_quiet_tf.install()

import pyarrow as pa

import ray_tfrecord
from ray_tfrecord import ImageTransform
from ray_tfrecord.tf import ResumableFeed, plan_splits, tf_dataset

LABEL = "image/class/label"
# The columns the feed reads: the JPEG bytes and the label.
SCHEMA = pa.schema([("image/encoded", pa.binary()), (LABEL, pa.int64())])


def _model(size: int):
    import tensorflow as tf

    model = tf.keras.Sequential([
        tf.keras.Input((size, size, 3), dtype="uint8", name="image"),
        tf.keras.layers.Rescaling(1 / 127.5, offset=-1),
        tf.keras.layers.Conv2D(16, 3, strides=2, activation="relu"),
        tf.keras.layers.Conv2D(32, 3, strides=2, activation="relu"),
        tf.keras.layers.GlobalAveragePooling2D(),
        tf.keras.layers.Dense(CLASSES),
    ])
    model.compile(tf.keras.optimizers.Adam(3e-3),
                  tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model


def _from_one(label):
    return label - 1  # build_imagenet_data.py's labels start at 1


def main() -> None:
    parser = _example.flags(__doc__, epochs=4, min_accuracy=None, workers=False,
                            min_accuracy_help="fail below this (default 0.9; --fast: 0.5, chance is 0.25)")
    parser.add_argument("--images", type=int, default=2000, help="training images")
    parser.add_argument("--size", type=int, default=96, help="the crops' height and width")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--fast", action="store_true", help="240 images, 3 epochs at 48x48 (for tests)")
    args = parser.parse_args()
    if args.fast:
        args.images, args.epochs, args.size, args.batch_size = 240, 3, 48, 32
    if args.min_accuracy is None:
        args.min_accuracy = 0.5 if args.fast else 0.9
    started = time.monotonic()
    out = _example.start(args.out, "images_cnn")
    train_dir, val_dir = os.path.join(out, "train"), os.path.join(out, "validation")
    write_image_set(train_dir, args.images, files=4, seed=0)
    val_images = max(args.images // 4, 64)
    write_image_set(val_dir, val_images, files=2, seed=1)
    print(f"wrote {args.images} training and {val_images} validation JPEG records under {out}")

    # The resumable feed: each epoch's order and each row's crop and flip come from (seed, epoch, row),
    # so a run resumed from a checkpoint (ReportCheckpoint under Ray Train) trains on the same images.
    plan = plan_splits(train_dir, schema=SCHEMA)
    feed = ResumableFeed(plan, feature_columns="image", label_columns=LABEL, batch_size=args.batch_size, seed=0,
                         transform=ImageTransform(args.size, training=True), transform_options={"batch_size": 64})
    # No pass past the last epoch: the feed starts reading the next epoch ahead, and none should be left
    # running when the script ends.
    feed.run_until(args.epochs)
    model = _model(args.size)
    train = feed.dataset().map(lambda image, label, weight: (image, _from_one(label), weight))
    losses, epoch_seconds = [], []
    for epoch in range(args.epochs):
        # One fit per epoch, each a new pass over the feed: the next epoch, in its own seeded order.
        images = feed.steps() * args.batch_size
        start = time.perf_counter()
        history = model.fit(train, epochs=epoch + 1, initial_epoch=epoch, steps_per_epoch=feed.steps(),
                            shuffle=False, verbose=0)
        epoch_seconds.append((images, time.perf_counter() - start))
        losses.append(history.history["loss"][-1])
    # Steady state: the epochs after the first, which starts Ray Data's workers and traces the step.
    steady = epoch_seconds[1:] or epoch_seconds
    images_per_s = sum(n for n, _ in steady) / sum(s for _, s in steady)
    print(f"trained {args.epochs} epochs, loss {losses[0]:.3f} -> {losses[-1]:.3f}")

    # batch_size=None: whole blocks, so Ray decodes inside the read task instead of in a task of its own.
    val = ray_tfrecord.read_tfrecords(val_dir, columns=["image/encoded", LABEL]).map_batches(
        ImageTransform(args.size, training=False), batch_format="pyarrow", batch_size=None)
    val_feed = tf_dataset(val, feature_columns="image", label_columns=LABEL, batch_size=args.batch_size,
                                       drop_last=False).map(lambda image, label: (image, _from_one(label)))
    _, accuracy = model.evaluate(val_feed, steps=-(-val_images // args.batch_size), verbose=0)
    print(f"validation accuracy: {accuracy:.4f}; training fed {images_per_s:,.0f} images/s "
          f"(decode, crop, flip and resize in Ray Data); done in {time.monotonic() - started:.0f}s")
    _example.check("validation accuracy", accuracy, args.min_accuracy)


if __name__ == "__main__":
    main()
