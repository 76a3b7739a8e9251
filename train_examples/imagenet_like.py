"""ImageNet-style TFRecords made on the spot from real photos: nothing is downloaded.

The records carry the keys TensorFlow's ``build_imagenet_data.py`` writes (``image/encoded``,
``image/class/label`` from 1, ``image/height``, ``image/format``, ...). The pixels are cut from the
two photos scikit-learn ships (``load_sample_images``: a temple in China, a flower), rescaled to
ImageNet's usual sizes (500x375, 375x500, 500x333, ...) with a little sensor-like grain, and
encoded as JPEG at quality 90: about 105 KB each, as ImageNet's are on average (``grain=7``: about
72 KB, as in sets of smoother or smaller photos).

Four classes a small network can learn: the photo (temple or flower) times its colours (as taken,
or with the red, green and blue channels rotated).

    from imagenet_like import write_image_set
    files = write_image_set("/tmp/images", 1000)
"""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa

import ray_tfrecord

CLASSES = 4
SYNSETS = ["n00000001", "n00000002", "n00000003", "n00000004"]
TEXTS = ["temple", "temple, colours rotated", "flower", "flower, colours rotated"]
# (width, height): the commonest ImageNet sizes.
SIZES = [(500, 375), (375, 500), (500, 333), (333, 500), (500, 400), (400, 500), (500, 500), (640, 480)]
QUALITY = 90
# The grain's standard deviation (of 255): it brings the files to ImageNet's mean size at quality 90.
GRAIN = 17.0
# The grain of the smaller set the benchmark also decodes (about 70 KiB a JPEG).
SMOOTH_GRAIN = 7.0


def _photos() -> list[np.ndarray]:
    from sklearn.datasets import load_sample_images

    return list(load_sample_images().images)


def image_table(n: int, seed: int = 0, *, start: int = 0, grain: float = GRAIN) -> pa.Table:
    """``n`` records (rows ``start`` to ``start + n`` of the set drawn from ``seed``) as an Arrow table.

    ``grain``: the noise's standard deviation (of 255); the JPEGs' size grows with it.
    """
    import cv2
    import simplejpeg

    photos = _photos()
    # One field of grain, cut at a random place for each image (drawing it per image costs more than the JPEG).
    field = np.random.default_rng(seed).normal(0.0, grain, (700, 700, 3)).astype(np.int16)
    encoded, labels, heights, widths, names = [], [], [], [], []
    for i in range(start, start + n):
        rng = np.random.default_rng([seed, i])
        label = int(rng.integers(CLASSES))
        photo = photos[label // 2]
        width, height = SIZES[int(rng.integers(len(SIZES)))]
        # A window of the photo with the output's aspect, covering 40-100% of what fits.
        fit = min(photo.shape[0] / height, photo.shape[1] / width) * np.sqrt(rng.uniform(0.4, 1.0))
        ch, cw = int(height * fit), int(width * fit)
        y = int(rng.integers(photo.shape[0] - ch + 1))
        x = int(rng.integers(photo.shape[1] - cw + 1))
        pixels = cv2.resize(photo[y:y + ch, x:x + cw], (width, height), interpolation=cv2.INTER_LINEAR)
        if label % 2:
            pixels = pixels[:, :, [1, 2, 0]]
        gy, gx = (int(v) for v in rng.integers(0, 700 - 640 + 1, 2))
        grain = field[gy:gy + height, gx:gx + width]
        pixels = np.clip(pixels + grain, 0, 255).astype(np.uint8)
        encoded.append(simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=QUALITY, colorsubsampling="420"))
        labels.append(label + 1)  # build_imagenet_data.py keeps 0 for the background class
        heights.append(height)
        widths.append(width)
        names.append(f"{SYNSETS[label]}_{i}.JPEG")
    return pa.table({
        "image/encoded": pa.array(encoded, pa.binary()),
        "image/format": pa.array([b"JPEG"] * n, pa.binary()),
        "image/colorspace": pa.array([b"RGB"] * n, pa.binary()),
        "image/channels": pa.array([3] * n, pa.int64()),
        "image/height": pa.array(heights, pa.int64()),
        "image/width": pa.array(widths, pa.int64()),
        "image/class/label": pa.array(labels, pa.int64()),
        "image/class/synset": pa.array([SYNSETS[v - 1].encode() for v in labels], pa.binary()),
        "image/class/text": pa.array([TEXTS[v - 1].encode() for v in labels], pa.binary()),
        "image/filename": pa.array([s.encode() for s in names], pa.binary()),
    })


def write_image_set(directory: str, n: int, *, files: int = 4, seed: int = 0, grain: float = GRAIN) -> list[str]:
    """Write ``n`` records as ``files`` TFRecord files under ``directory``; returns their paths."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    per_file = -(-n // files)
    for k in range(files):
        rows = min(per_file, n - k * per_file)
        if rows <= 0:
            break
        path = os.path.join(directory, f"train-{k:05d}-of-{files:05d}")
        with open(path, "wb") as f:
            f.write(bytes(ray_tfrecord.encode(image_table(rows, seed, start=k * per_file, grain=grain)).data))
        paths.append(path)
    return paths
