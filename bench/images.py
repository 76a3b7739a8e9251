"""ImageNet-style JPEGs decoded, randomly cropped, flipped and resized to 224x224: images per second.

One run, two sets of files (``train_examples/imagenet_like.py``: 500x375-class JPEGs at quality 90,
about 105 KB each as ImageNet's average, and a smoother set of about 72 KB), the same cores for every
line:

- ``ray_tfrecord``: ``read_tfrecords`` -> ``map_batches(ImageTransform(224, training=True),
  batch_size=None)`` in Ray Data (fused into the read tasks) -> ``tf_dataset``, drained; and the same
  feed into Keras ``fit`` of a tiny CNN.
- ``tf.data reference``: tensorflow/models' ImageNet input: ``interleave`` of ``TFRecordDataset``,
  ``parse_single_example``, ``sample_distorted_bounding_box`` + ``decode_and_crop_jpeg`` (decodes only
  the window), ``random_flip_left_right``, ``resize``, AUTOTUNE; drained, and into the same ``fit``.
- ``tf.data reference, one iterator``: the reference's rate with no pass starting in the timing: each
  round takes an epoch's worth of images from one iterator over the reference repeated. A new
  iterator (each pass of the other lines, as ``fit`` makes one an epoch) sometimes waits about a
  second for TensorFlow's first batch, which halves a short pass's rate.
- ``tf.data full decode``: the same with ``decode_jpeg`` of the whole image, then the crop.
- ``limit`` lines, one per decoder the section uses: one thread of it decoding the same bytes, times
  the cores, what a perfectly parallel decode would reach. simplejpeg's full decodes (ImageTransform's
  decoder where the build has no window decode, and the line the ratios are taken against),
  ImageTransform's native window decode on random-resized-crop windows (where the build has it),
  TensorFlow's ``decode_jpeg`` (the full-decode pipeline's) and ``decode_and_crop_jpeg`` on the same
  windows (the reference's).
- ``ray_tfrecord, Ray Data only``: the same Ray Data pipeline drained by ``iter_batches`` with no
  TensorFlow, so that the feed's own share shows beside it.

Every feed is built once and each pass is an epoch over it, as ``fit(epochs=...)`` iterates; an epoch
lists the set ``PASSES`` times. Each line runs one warm-up pass (Ray's workers start, TensorFlow
traces), then the lines take turns for three rounds and the median round counts (the spread is in the
note); images per core-second is images/s over the cores.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from .datasets import repeated

SIZE = 224
BATCH = 64
IMAGES = 2_000
QUICK_IMAGES = 400
# The image set listed this many times an epoch (hard links), so that an epoch lasts seconds: every
# epoch is a new Ray Data execution, whose first second runs one task at a time in Ray 2.60
# (docs/benchmarks.md), which a training epoch of real length does not feel.
PASSES = 4
ROUNDS = 3
# More batches than tf.data's AUTOTUNE buffers hold ahead here: taken untimed before a one-iterator round.
AHEAD_BATCHES = 32
CLASSES = 4


def _imagenet_like():
    """``train_examples/imagenet_like.py``, which makes the image sets."""
    examples = str(Path(__file__).resolve().parent.parent / "train_examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    import imagenet_like

    return imagenet_like


def _image_set(ctx, n: int, grain: float) -> list[str]:
    """The set's files, once (``n`` images of that grain)."""
    directory = Path(ctx.tmp).parent / "imagenet_like" / f"{n}-grain{grain:g}"
    if not (directory / "_DONE").exists():
        _imagenet_like().write_image_set(str(directory), n, files=8, seed=0, grain=grain)
        (directory / "_DONE").touch()
    return sorted(str(p) for p in directory.glob("train-*"))


def _tiny_cnn():
    import tensorflow as tf
    from tensorflow import keras

    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3), dtype="uint8"),
        keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(8, 5, strides=4, activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(CLASSES),
    ])
    model.compile("adam", tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _drain_ray(ds) -> float:
    """Images per second of one pass over a Ray Dataset, its batches as Ray gives them (no TensorFlow)."""
    n, start = 0, time.perf_counter()
    for batch in ds.iter_batches(batch_size=BATCH, batch_format="pyarrow"):
        n += batch.num_rows
    return n / (time.perf_counter() - start)


def _steady(feed, n: int):
    """A function timing the next ``n`` images of one iterator over ``feed`` repeated, kept across calls:
    the feed's rate with no start of a pass in it. The batches the pipeline made ahead while other lines
    ran (its prefetch and parallel-map buffers) are taken first, untimed, so they do not count as speed."""
    iterator = None

    def measure() -> float:
        nonlocal iterator
        if iterator is None:
            iterator = iter(feed.repeat())
        for _ in range(AHEAD_BATCHES):
            next(iterator)
        done, start = 0, time.perf_counter()
        while done < n:
            _, label = next(iterator)
            done += int(label.shape[0])
        return done / (time.perf_counter() - start)

    return measure


def _drain(feed) -> float:
    """Images per second of one pass over ``feed``."""
    n, start = 0, time.perf_counter()
    for _, label in feed:
        n += int(label.shape[0])
    return n / (time.perf_counter() - start)


def _fitter(feed, n: int):
    """A function fitting one epoch of ``feed`` into a tiny CNN (the same model each call): images/s."""
    model = _tiny_cnn()

    def fit() -> float:
        start = time.perf_counter()
        model.fit(feed, epochs=1, steps_per_epoch=n // BATCH, shuffle=False, verbose=0)
        return (n // BATCH) * BATCH / (time.perf_counter() - start)

    return fit


def _tf_pipeline(files: list[str], full_decode: bool, cores: int):
    import tensorflow as tf

    spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(serialized):
        f = tf.io.parse_single_example(serialized, spec)
        encoded = f["image/encoded"]
        shape = tf.image.extract_jpeg_shape(encoded)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            shape, tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]), min_object_covered=0.1,
            aspect_ratio_range=[3 / 4, 4 / 3], area_range=[0.08, 1.0], max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        if full_decode:
            image = tf.io.decode_jpeg(encoded, channels=3)[y:y + h, x:x + w]
        else:
            image = tf.io.decode_and_crop_jpeg(encoded, tf.stack([y, x, h, w]), channels=3)
        image = tf.image.random_flip_left_right(image)
        image = tf.cast(tf.image.resize(image, [SIZE, SIZE]), tf.uint8)
        return image, f["image/class/label"] - 1

    return (tf.data.Dataset.from_tensor_slices(files)
            .interleave(tf.data.TFRecordDataset, cycle_length=cores, num_parallel_calls=tf.data.AUTOTUNE)
            .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(BATCH, drop_remainder=True)
            .prefetch(tf.data.AUTOTUNE))


def _ours(files: list[str], cores: int):
    """Our Ray Dataset of decoded images, and the feed over it."""
    import ray_tfrecord.tf

    # batch_size=None: whole blocks, so Ray fuses the decode into the read task (a batch size would
    # keep them apart, every encoded block making an extra trip through the object store).
    ds = ray_tfrecord.read_tfrecords(files, columns=["image/encoded", "image/class/label"]).map_batches(
        ray_tfrecord.ImageTransform(SIZE, training=True, seed=0, threads=cores), batch_format="pyarrow",
        batch_size=None)
    feed = ray_tfrecord.tf.tf_dataset(ds, feature_columns="image", label_columns="image/class/label", batch_size=BATCH)
    return ds, feed.map(lambda image, label: (image, label - 1))


def _encoded(files: list[str]) -> list[bytes]:
    import pyarrow as pa

    import ray_tfrecord
    from ray_tfrecord import iter_chunks

    decoder = ray_tfrecord.Decoder(pa.schema([("image/encoded", pa.binary())]))
    values = []
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter_chunks(fh, path=f):
                values.extend(decoder.decode(chunk).column("image/encoded").to_pylist())
    return values


def _limit(values: list[bytes], cores: int) -> float:
    """One thread of simplejpeg decoding every image in full, times the cores."""
    import simplejpeg

    start = time.perf_counter()
    for v in values:
        simplejpeg.decode_jpeg(v)
    return cores * len(values) / (time.perf_counter() - start)


def _window_limit(values: list[bytes], cores: int):
    """One thread of ImageTransform's native window decode (libjpeg-turbo's crop API) on each image's
    random-resized-crop window, the same windows as the ``decode_and_crop_jpeg`` line, times the cores;
    None where the build has no window decode."""
    import numpy as np
    import simplejpeg

    from ray_tfrecord._src.core import jpeg  # not public: ImageTransform's decoder
    from ray_tfrecord._src.data.feed.images import crop_boxes  # not public: the window draw ImageTransform uses

    if not jpeg.AVAILABLE:
        return None
    shapes = np.array([simplejpeg.decode_jpeg_header(v)[:2] for v in values])
    boxes, _ = crop_boxes(np.arange(len(values), dtype=np.uint64), shapes[:, 0], shapes[:, 1], (SIZE, SIZE))
    windows = [tuple(int(b) for b in box) for box in boxes]

    def measure() -> float:
        start = time.perf_counter()
        for v, box in zip(values, windows):
            jpeg.decode_window(v, 1, 3, box)
        return cores * len(values) / (time.perf_counter() - start)

    return measure


def _tf_limit(values: list[bytes], cores: int, window: bool):
    """One thread of TensorFlow's decoder over every image, times the cores: ``decode_jpeg`` in full, or
    ``decode_and_crop_jpeg`` on each image's random-resized-crop window (ImageTransform's draw, which
    follows the reference's distribution). A ``tf.data`` map on one thread, so no Python runs per image."""
    import numpy as np
    import simplejpeg
    import tensorflow as tf

    from ray_tfrecord._src.data.feed.images import crop_boxes  # not public: the window draw ImageTransform uses

    if window:
        shapes = np.array([simplejpeg.decode_jpeg_header(v)[:2] for v in values])
        boxes, _ = crop_boxes(np.arange(len(values), dtype=np.uint64), shapes[:, 0], shapes[:, 1], (SIZE, SIZE))
        data = tf.data.Dataset.from_tensor_slices((values, boxes.astype(np.int32))).map(
            lambda v, box: tf.io.decode_and_crop_jpeg(v, box, channels=3))
    else:
        data = tf.data.Dataset.from_tensor_slices(values).map(lambda v: tf.io.decode_jpeg(v, channels=3))
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    data = data.with_options(options)

    def measure() -> float:
        start = time.perf_counter()
        for _ in data:
            pass
        return cores * len(values) / (time.perf_counter() - start)

    return measure


def run(ctx) -> list[dict]:
    import ray

    cores = 2
    n = QUICK_IMAGES if ctx.image_rows < 20_000 else IMAGES
    maker = _imagenet_like()
    sets = [_image_set(ctx, n, grain) for grain in (maker.SMOOTH_GRAIN, maker.GRAIN)]
    ray.shutdown()
    ray.init(address="local", num_cpus=cores, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    rows = []
    for once in sets:
        rows += _one_set(once, n, cores)
    ray.shutdown()
    return rows


WINDOW_LIMIT = "limit: ray_tfrecord window decode"
NOTES = {
    "limit: simplejpeg full decode": "one thread of simplejpeg full decodes x {cores} cores",
    WINDOW_LIMIT: "one thread of ImageTransform's window decode (libjpeg-turbo's crop API; the whole scan "
                  "still entropy-decoded) on the same windows x {cores} cores",
    "limit: TensorFlow decode_jpeg": "one thread of tf.io.decode_jpeg, full decodes, x {cores} cores",
    "limit: TensorFlow decode_and_crop_jpeg": "one thread of tf.io.decode_and_crop_jpeg on random-resized-crop "
                                              "windows (the reference's decoder) x {cores} cores",
    "tf.data reference": "tensorflow/models: decode_and_crop_jpeg (the window only), flip, AUTOTUNE",
    "tf.data reference, one iterator": "the reference's next epoch of images from one iterator over it "
                                       "repeated: no pass starts in it (a new pass sometimes waits about "
                                       "a second for TensorFlow's first batch)",
    "tf.data full decode": "decode_jpeg of the whole image, then the crop",
    "ray_tfrecord, Ray Data only": "read_tfrecords -> ImageTransform in Ray Data -> iter_batches, no TensorFlow",
    "ray_tfrecord": "read_tfrecords -> ImageTransform in Ray Data -> tf_dataset, drained",
    "ray_tfrecord -> fit": "the same feed into Keras fit of a tiny CNN",
    "tf.data reference -> fit": "the reference pipeline into the same fit",
}
FULL_LIMIT = "limit: simplejpeg full decode"
STEADY = "tf.data reference, one iterator"


def _one_set(once: list[str], n: int, cores: int) -> list[dict]:
    """The section's lines on one set of files."""
    megabytes = sum(os.path.getsize(f) for f in once) / 1e6
    values = _encoded(once)
    files = repeated(once, Path(once[0]).parent / "passes", PASSES)
    # Each feed is built once and iterated once per pass, as fit(epochs=...) does.
    reference = _tf_pipeline(files, full_decode=False, cores=cores)
    full = _tf_pipeline(files, full_decode=True, cores=cores)
    ds, ours = _ours(files, cores)
    lines = {
        FULL_LIMIT: lambda: _limit(values, cores),
        WINDOW_LIMIT: _window_limit(values, cores),
        "limit: TensorFlow decode_jpeg": _tf_limit(values, cores, window=False),
        "limit: TensorFlow decode_and_crop_jpeg": _tf_limit(values, cores, window=True),
        "tf.data reference": lambda: _drain(reference),
        STEADY: _steady(reference, n * PASSES),
        "tf.data full decode": lambda: _drain(full),
        "ray_tfrecord, Ray Data only": lambda: _drain_ray(ds),
        "ray_tfrecord": lambda: _drain(ours),
        "ray_tfrecord -> fit": _fitter(ours, n * PASSES),
        "tf.data reference -> fit": _fitter(reference, n * PASSES),
    }
    lines = {name: measure for name, measure in lines.items() if measure is not None}
    # A warm-up pass each (Ray's workers, TensorFlow's tracing), then rounds taking turns, so that a
    # burst of load from other processes does not land on one line only; the median round counts.
    for measure in lines.values():
        measure()
    rounds: dict[str, list[float]] = {name: [] for name in lines}
    for _ in range(ROUNDS):
        for name, measure in lines.items():
            rounds[name].append(measure())
    rates = {name: statistics.median(r) for name, r in rounds.items()}
    spread = {name: f"{min(r):,.0f}-{max(r):,.0f}" for name, r in rounds.items()}

    rows = []
    for impl, rate in rates.items():
        note = (f"{rate / cores:,.0f} images per core-second (rounds {spread[impl]}/s); "
                f"{NOTES[impl].format(cores=cores)}")
        if impl.startswith("ray_tfrecord"):
            peer = "tf.data reference -> fit" if impl.endswith("fit") else "tf.data reference"
            note += f"; {rate / rates[peer]:.2f}x {peer}, {rate / rates[FULL_LIMIT]:.0%} of the full-decode limit"
            if not impl.endswith("fit"):
                note += f", {rate / rates[STEADY]:.2f}x the reference's one-iterator rate"
        rows.append({"bench": "images", "dataset": f"{n:,} JPEGs x {PASSES} an epoch ({megabytes / n * 1e3:.0f} KB), "
                     f"{cores} CPUs",
                     "impl": impl, "rows_per_s": rate, "mb_per_s": rate * megabytes / n, "note": note})
    return rows
