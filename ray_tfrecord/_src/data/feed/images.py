"""Encoded images (JPEG, PNG) -> fixed-size uint8 RGB tensors, a batch at a time, for Ray Data.

``ImageTransform`` is a ``map_batches`` function: it replaces a column of encoded images (the
``image/encoded`` of ``build_imagenet_data.py``, TFDS and the Object Detection API) with a column of
``(height, width, channels)`` uint8 tensors (Ray's fixed-shape tensor extension, which
``tf_dataset`` and ``ResumableFeed`` turn into one dense tensor per batch
without a copy per image) and keeps every other column.

- ``training=True``: the Inception random-resized-crop (area 8-100% of the image, aspect 3/4-4/3, ten
  tries, else the whole image, as tensorflow/models' ImageNet pipeline samples it) and a horizontal
  flip with probability 1/2, each row's draws coming from its seed (below).
- ``training=False``: tensorflow/models' evaluation crop: the centre ``size / (size + 32)`` of the
  shorter side, resized to ``size``.

Decoders: JPEG through the native window decode (``core.jpeg``: only the crop window's blocks go
through the inverse DCT) where the build linked libjpeg-turbo, else, and for CMYK and YCCK, through
simplejpeg; both strict, so a truncated or damaged JPEG is an error, not a grey image, and both decode
at 1/2, 1/4 or 1/8 scale by the DCT when the crop stays at least the output size. Anything else (PNG,
grayscale, 16-bit, palette, alpha) and the resize go through OpenCV. All release the GIL, so
``threads=`` decode images of a batch in parallel.

Randomness. A batch with a ``__seed__`` column (uint64 per row: ``ResumableFeed`` derives it from
``(seed, epoch, the row's place in the data)``) draws each row's crop and flip from that row's seed
alone, so a resumed epoch, another batch size or another block split augments bitwise alike. Without
the column, a row's seed is ``seed=`` mixed with the CRC-32 and length of its encoded bytes: the same
image is cropped the same way wherever it lies (pass ``seed=base + epoch`` for new crops each epoch);
``seed=None`` draws fresh randomness.

Example::

    import numpy as np, pyarrow as pa, simplejpeg
    from ray_tfrecord import ImageTransform

    jpeg = simplejpeg.encode_jpeg(np.zeros((64, 80, 3), np.uint8))
    batch = pa.table({"image/encoded": [jpeg, jpeg], "label": [0, 1]})
    out = ImageTransform(32, training=True, seed=0)(batch)
    assert out.column("image").type.shape == (32, 32, 3) and out.column_names == ["label", "image"]
"""

from __future__ import annotations

import logging
import math
import threading
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from ray_tfrecord._src.core import jpeg
from ray_tfrecord._src.core.errors import DecodeError
from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.data.feed.order import GOLDEN, SEED_COLUMN, splitmix64
from ray_tfrecord._src.data.feed.transforms import WEIGHT_COLUMN

log = logging.getLogger(__name__)

# tensorflow/models' ImageNet preprocessing (official/vision/ops/preprocess_ops.py, resnet's
# imagenet_preprocessing.py): sample_distorted_bounding_box's ranges and tries; the evaluation crop
# keeps size / (size + CROP_PADDING) of the shorter side.
AREA_RANGE = (0.08, 1.0)
ASPECT_RANGE = (3 / 4, 4 / 3)
ATTEMPTS = 10
CROP_PADDING = 32

_JPEG_MAGIC = b"\xff\xd8\xff"
# Uniforms a row draws: per try an area and an aspect, then x, y of the window and the flip.
_DRAWS = 2 * ATTEMPTS + 3


@public("ray_tfrecord")
class ImageError(DecodeError):
    """An encoded image that cannot be decoded: corrupt, truncated, empty, null or not an image."""


def _uniforms(seeds: np.ndarray, count: int) -> np.ndarray:
    """``count`` uniforms in [0, 1) per row, each a function of that row's seed only."""
    with np.errstate(over="ignore"):
        steps = np.arange(1, count + 1, dtype=np.uint64) * GOLDEN
        z = splitmix64(seeds.astype(np.uint64)[:, None] + steps[None, :])
    return (z >> np.uint64(11)).astype(np.float64) * 2.0**-53


def content_seeds(values: list[Any], seed: int) -> np.ndarray:
    """The seeds of rows without a ``__seed__`` column: ``seed`` mixed with each value's CRC-32 and length."""
    keys = np.array([(zlib.crc32(v) << 32) | (len(v) & 0xFFFFFFFF) if v is not None else 0 for v in values],
                    dtype=np.uint64)
    with np.errstate(over="ignore"):
        return splitmix64(np.array([seed & 0xFFFFFFFFFFFFFFFF], np.uint64) * GOLDEN) ^ keys


def crop_boxes(seeds: np.ndarray | None, heights: np.ndarray, widths: np.ndarray,
               size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Each row's crop window ``(y, x, h, w)`` in its full-size image, and whether to flip it.

    ``seeds`` given: the training crop and flip drawn from each row's seed; None: the evaluation
    centre crop, no flip.  Every window lies inside its image and is at least one pixel.
    """
    heights = np.asarray(heights, np.int64)
    widths = np.asarray(widths, np.int64)
    if seeds is None:
        out_h, out_w = size
        scale = min(out_h, out_w) / (min(out_h, out_w) + CROP_PADDING)
        # The largest window of the output's aspect inside the image, then its central fraction.
        fit = np.minimum(heights / out_h, widths / out_w)
        h = np.maximum((fit * out_h * scale).astype(np.int64), 1)
        w = np.maximum((fit * out_w * scale).astype(np.int64), 1)
        boxes = np.stack([(heights - h + 1) // 2, (widths - w + 1) // 2, h, w], axis=1)
        return boxes, np.zeros(len(heights), bool)
    u = _uniforms(seeds, _DRAWS)
    area = heights * widths
    target = (AREA_RANGE[0] + (AREA_RANGE[1] - AREA_RANGE[0]) * u[:, 0:2 * ATTEMPTS:2]) * area[:, None]
    log_lo, log_hi = math.log(ASPECT_RANGE[0]), math.log(ASPECT_RANGE[1])
    aspect = np.exp(log_lo + (log_hi - log_lo) * u[:, 1:2 * ATTEMPTS:2])
    w = np.rint(np.sqrt(target * aspect)).astype(np.int64)
    h = np.rint(np.sqrt(target / aspect)).astype(np.int64)
    fits = (w >= 1) & (h >= 1) & (w <= widths[:, None]) & (h <= heights[:, None])
    first = np.argmax(fits, axis=1)
    rows = np.arange(len(heights))
    found = fits[rows, first]
    h = np.where(found, h[rows, first], heights)
    w = np.where(found, w[rows, first], widths)
    y = np.minimum((u[:, -3] * (heights - h + 1)).astype(np.int64), heights - h)
    x = np.minimum((u[:, -2] * (widths - w + 1)).astype(np.int64), widths - w)
    return np.stack([y, x, h, w], axis=1), u[:, -1] < 0.5


def _cv2() -> Any:
    import cv2

    # The transform runs one image per thread of its own; OpenCV's pool on top would oversubscribe.
    cv2.setNumThreads(1)
    return cv2


# Taken, never released, by the first decode of a build without the window decode: one note a process.
_WHOLE_NOTE = threading.Lock()

_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        if threads not in _POOLS:
            _POOLS[threads] = ThreadPoolExecutor(threads, thread_name_prefix="ray_tfrecord-images")
        return _POOLS[threads]


@public("ray_tfrecord")
class ImageTransform:
    """A Ray Data ``map_batches`` function: encoded images -> ``(height, width, channels)`` uint8 tensors.

    Args:
        size: output ``height`` (and ``width``), or ``(height, width)``.
        training: random-resized-crop and flip from each row's seed (True) or the evaluation
            centre crop (False).
        column: the column of encoded images (binary); ``build_imagenet_data.py`` calls it
            ``image/encoded``.
        output: the name of the tensor column that replaces ``column``.
        seed: where a batch has no ``__seed__`` column, the seed each row's is derived from (see the
            module's doc); None: fresh randomness. Unused when ``training=False``.
        channels: 3 (RGB: grayscale is repeated, alpha dropped, CMYK converted) or 1 (luma).
        on_corrupt: ``"raise"``: an [`ImageError`][ray_tfrecord.ImageError] naming the file (with
            ``read_tfrecords(include_paths=True)``), column and row; ``"skip"``: leave the row out
            and log it, or, in a batch with a ``__weight__`` column (ResumableFeed's), keep it as a
            black image with weight 0, so every rank still feeds equal batches and it is not
            trained on. ``skipped`` counts them in this process.
        threads: images of a batch decoded at once (the decoders release the GIL).

    Use it with ``batch_format="pyarrow"`` (a dict of numpy arrays works too) and, right after
    ``read_tfrecords``, ``batch_size=None``: Ray then runs it inside the read task, where a batch size
    would keep it in a task of its own and send every encoded block through the object store first
    (on 2 CPUs, 960-1,000 images/s against 860-890 with ``batch_size=64``). A task then holds one
    read block decoded: about 1.4x the block's encoded bytes for 224x224 crops of ImageNet-size JPEGs.
    """

    def __init__(self, size: int | tuple[int, int], *, training: bool, column: str = "image/encoded",
                 output: str = "image", seed: int | None = None, channels: Literal[1, 3] = 3,
                 on_corrupt: Literal["raise", "skip"] = "raise", threads: int = 1) -> None:
        self.size = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        if min(self.size) < 1:
            raise ValueError(f"size={size!r}: give a positive height (and width)")
        if channels not in (1, 3):
            raise ValueError(f"channels={channels!r}: give 3 (RGB) or 1 (grayscale)")
        if on_corrupt not in ("raise", "skip"):
            raise ValueError(f"on_corrupt={on_corrupt!r}: give 'raise' or 'skip'")
        if threads < 1:
            raise ValueError(f"threads={threads!r}: give 1 or more")
        self.training = training
        self.column = column
        self.output = output
        self.seed = seed
        self.channels = channels
        self.on_corrupt = on_corrupt
        self.threads = threads
        self.skipped = 0

    def __repr__(self) -> str:
        return (f"ImageTransform({self.size}, training={self.training}, column={self.column!r}, "
                f"output={self.output!r}, seed={self.seed!r}, channels={self.channels}, "
                f"on_corrupt={self.on_corrupt!r}, threads={self.threads})")

    def __call__(self, batch: pa.Table | Mapping[str, Any]) -> pa.Table | dict[str, Any]:
        table = batch if isinstance(batch, pa.Table) else pa.table(dict(batch))
        if self.column not in table.column_names:
            raise ValueError(f"the batch has no column {self.column!r} (it has {table.column_names}); "
                             "pass column= the name of the encoded images")
        values = _values(table.column(self.column), self.column)
        images, failures = self._decode(values, self._seeds(table, values))
        table = self._settle(table, images, failures)
        if isinstance(batch, pa.Table):
            return table
        out = {name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names}
        out[self.output] = images if not failures or WEIGHT_COLUMN in table.column_names \
            else np.delete(images, sorted(failures), axis=0)
        return out

    def _seeds(self, table: pa.Table, values: list[Any]) -> np.ndarray | None:
        if not self.training:
            return None
        if SEED_COLUMN in table.column_names:
            return table.column(SEED_COLUMN).to_numpy().astype(np.uint64, copy=False)
        if self.seed is None:
            return np.random.default_rng().integers(0, 2**64, len(values), dtype=np.uint64)
        return content_seeds(values, self.seed)

    def _decode(self, values: list[Any], seeds: np.ndarray | None) -> tuple[np.ndarray, dict[int, str]]:
        images = np.zeros((len(values), *self.size, self.channels), np.uint8)
        cv2 = _cv2()
        headers = [_header(v) for v in values]
        heights = np.array([h[0] for h in headers], np.int64)
        widths = np.array([h[1] for h in headers], np.int64)
        ok = (heights > 0) & (widths > 0)
        boxes, flips = crop_boxes(seeds, np.where(ok, heights, 1), np.where(ok, widths, 1), self.size)

        def one(i: int) -> str | None:
            if not ok[i]:
                return headers[i][2]
            try:
                decode_window(values[i], boxes[i], self.size, self.channels, out=images[i], flip=bool(flips[i]),
                              cv2=cv2)
            except (ValueError, cv2.error) as e:
                images[i] = 0
                return str(e).strip().splitlines()[-1] or type(e).__name__
            return None

        if self.threads == 1 or len(values) < 2:
            results = [one(i) for i in range(len(values))]
        else:
            results = list(_pool(self.threads).map(one, range(len(values))))
        return images, {i: r for i, r in enumerate(results) if r is not None}

    def _settle(self, table: pa.Table, images: np.ndarray, failures: dict[int, str]) -> pa.Table:
        """The output table: ``column`` replaced by the images; failed rows raised, dropped or weighted 0."""
        paths = table.column("path").to_pylist() if failures and "path" in table.column_names else None
        for i, reason in failures.items():
            path = paths[i] if paths else None
            if self.on_corrupt == "raise":
                hint = "" if paths else ", or read with include_paths=True to see the file"
                raise ImageError(f"row {i} of this batch is not a decodable image ({reason}); pass "
                                 f"on_corrupt='skip' to leave such rows out and count them{hint}",
                                 path=path, column=self.column)
            log.warning("%s", ImageError(f"row {i} of this batch is not a decodable image ({reason}); skipped",
                                         path=path, column=self.column))
        self.skipped += len(failures)
        index = table.column_names.index(self.column)
        table = table.remove_column(index)
        table = table.append_column(self.output, _tensor_array(images))
        if not failures:
            return table
        if WEIGHT_COLUMN in table.column_names:
            weight = table.column(WEIGHT_COLUMN).to_numpy().copy()
            weight[sorted(failures)] = 0
            return table.set_column(table.column_names.index(WEIGHT_COLUMN), WEIGHT_COLUMN,
                                    pa.array(weight, table.schema.field(WEIGHT_COLUMN).type))
        keep = np.ones(len(table), bool)
        keep[sorted(failures)] = False
        return table.filter(pa.array(keep))


def decode_window(value: Any, box: np.ndarray, size: tuple[int, int], channels: int, *, out: np.ndarray,
                  flip: bool = False, cv2: Any = None) -> None:
    """Decode the window ``box`` = ``(y, x, h, w)`` of one encoded image, resized to ``size``, into ``out``.

    A JPEG whose window stays at least ``size`` at 1/2 (1/4, 1/8) scale is decoded at that scale by
    libjpeg-turbo's DCT and the window scaled with it; where the native window decode is built
    (``jpeg.AVAILABLE``) only the window's blocks are decoded. Raises ``ValueError`` or ``cv2.error``
    for data the decoders refuse.
    """
    cv2 = cv2 or _cv2()
    buf = np.frombuffer(value, np.uint8)
    if bytes(buf[:3]) == _JPEG_MAGIC:
        window = _jpeg_window(value, tuple(int(v) for v in box), size, channels)
    else:
        y, x, h, w = (int(v) for v in box)
        flags = cv2.IMREAD_IGNORE_ORIENTATION | (cv2.IMREAD_COLOR_RGB if channels == 3 else cv2.IMREAD_GRAYSCALE)
        image = cv2.imdecode(buf, flags)
        if image is None:
            raise ValueError("neither a JPEG nor an image OpenCV can decode")
        window = image[y:y + h, x:x + w]
    target = out.reshape(size) if channels == 1 else out
    if flip:
        cv2.flip(cv2.resize(window, size[::-1], interpolation=cv2.INTER_LINEAR), 1, dst=target)
    else:
        cv2.resize(window, size[::-1], dst=target, interpolation=cv2.INTER_LINEAR)


def _jpeg_window(value: Any, box: tuple[int, ...], size: tuple[int, int], channels: int) -> np.ndarray:
    """The pixels of the window ``box`` of a JPEG, at the smallest DCT scale that keeps it at least ``size``."""
    import simplejpeg

    y, x, h, w = box
    factor = min(h / size[0], w / size[1])
    denom = next((d for d in (8, 4, 2) if factor >= d), 1)
    if denom > 1:
        full_h, full_w = simplejpeg.decode_jpeg_header(value)[:2]
        scaled_h, scaled_w = -(-full_h // denom), -(-full_w // denom)
        sy, sx = scaled_h / full_h, scaled_w / full_w
        y, x = int(y * sy), int(x * sx)
        h = max(min(round(h * sy), scaled_h - y), 1)
        w = max(min(round(w * sx), scaled_w - x), 1)
    if jpeg.AVAILABLE:
        try:
            return jpeg.decode_window(value, denom, channels, (y, x, h, w))
        except jpeg.UnsupportedJpeg:
            pass
    elif _WHOLE_NOTE.acquire(blocking=False):
        log.info("ImageTransform decodes whole JPEGs: ray_tfrecord was built without libjpeg-turbo, so "
                 "without its window decode (see docs/install.md: Python >= 3.12 brings one; on 3.11 "
                 "install libjpeg-turbo's headers and reinstall)")
    colorspace = "RGB" if channels == 3 else "GRAY"
    if denom == 1:
        return simplejpeg.decode_jpeg(value, colorspace)[y:y + h, x:x + w]
    # 1/denom exactly: the least factor at least denom whose image is at least the scaled size.
    image = simplejpeg.decode_jpeg(value, colorspace, min_factor=denom, min_height=scaled_h, min_width=scaled_w)
    return image[y:y + h, x:x + w]


def _header(value: Any) -> tuple[int, int, str]:
    """``(height, width, "")`` of an encoded image, or ``(0, 0, reason)`` if it has none."""
    if value is None:
        return 0, 0, "the value is null"
    if len(value) == 0:
        return 0, 0, "the value is empty"
    if bytes(value[:3]) == _JPEG_MAGIC:
        import simplejpeg

        try:
            h, w = simplejpeg.decode_jpeg_header(value)[:2]
        except ValueError as e:
            return 0, 0, str(e)
        return h, w, ""
    return _other_header(value)


def _other_header(value: Any) -> tuple[int, int, str]:
    # PNG keeps its size in the IHDR chunk; other formats are decoded once to learn it.
    buf = bytes(value[:24])
    if buf[:8] == b"\x89PNG\r\n\x1a\n" and buf[12:16] == b"IHDR":
        return int.from_bytes(buf[20:24], "big"), int.from_bytes(buf[16:20], "big"), ""
    cv2 = _cv2()
    try:
        image = cv2.imdecode(np.frombuffer(value, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as e:
        return 0, 0, str(e).strip().splitlines()[-1]
    if image is None:
        return 0, 0, "neither a JPEG nor an image OpenCV can decode"
    return image.shape[0], image.shape[1], ""


def _values(column: pa.ChunkedArray | pa.Array, name: str) -> list[Any]:
    """Per-row zero-copy views of a binary column's values (None for a null)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_binary_view(arr.type) or pa.types.is_string_view(arr.type):
        arr = arr.cast(pa.large_binary())
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise ValueError(f"column {name!r} is {arr.type}, not encoded images (binary); pass column= the "
                         "column of encoded JPEG or PNG bytes")
    offsets_buf, data_buf = arr.buffers()[1:3]
    dtype = np.int64 if pa.types.is_large_binary(arr.type) else np.int32
    offsets = np.frombuffer(offsets_buf, dtype)[arr.offset:arr.offset + len(arr) + 1]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    valid = arr.is_valid().to_numpy(zero_copy_only=False) if arr.null_count else None
    return [None if valid is not None and not valid[i] else data[offsets[i]:offsets[i + 1]]
            for i in range(len(arr))]


def _tensor_array(images: np.ndarray) -> pa.ExtensionArray:
    from ray.data.extensions import ArrowTensorArray

    return ArrowTensorArray.from_numpy(images)
