"""ImageTransform: exact against the decoders' own decodes, seeded crops that do not depend on batch
boundaries, corrupt values per on_corrupt, and the formats (JPEG, progressive, PNG, grayscale, CMYK, alpha)."""

from __future__ import annotations

import math
import os
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

cv2 = pytest.importorskip("cv2")
simplejpeg = pytest.importorskip("simplejpeg")

from ray_tfrecord import ImageError, ImageTransform  # noqa: E402
from ray_tfrecord._src.core import jpeg  # noqa: E402
from ray_tfrecord._src.data.feed.images import ASPECT_RANGE, crop_boxes  # noqa: E402
from ray_tfrecord._src.data.feed.order import SEED_COLUMN  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "train_examples"))
from imagenet_like import SMOOTH_GRAIN, image_table, write_image_set  # noqa: E402

COLUMN = "image/encoded"
LABEL = "image/class/label"


@pytest.fixture(scope="module")
def photo() -> np.ndarray:
    from sklearn.datasets import load_sample_images

    return cv2.resize(load_sample_images().images[0], (500, 375), interpolation=cv2.INTER_AREA)


def _jpeg(pixels: np.ndarray, **kw) -> bytes:
    return simplejpeg.encode_jpeg(np.ascontiguousarray(pixels), quality=90, **kw)


def _png(pixels: np.ndarray) -> bytes:
    if pixels.ndim == 3 and pixels.shape[2] == 3:
        pixels = pixels[:, :, ::-1]  # OpenCV encodes BGR
    elif pixels.ndim == 3:
        pixels = pixels[:, :, [2, 1, 0, 3]]
    ok, buf = cv2.imencode(".png", np.ascontiguousarray(pixels))
    assert ok
    return buf.tobytes()


def _resize(window: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    return cv2.resize(window, size[::-1], interpolation=cv2.INTER_LINEAR)


def _images(out: pa.Table, name: str = "image") -> np.ndarray:
    return out.column(name).combine_chunks().to_numpy_ndarray()


# --- exactness -------------------------------------------------------------------------------------------

def assert_window_decode_close(actual: np.ndarray, expected: np.ndarray) -> None:
    """The native window decode against decode-then-crop: a few edge pixels up to 4 levels apart
    (the chroma upsampling at the window's edge), the rest equal; bit for bit without it."""
    diff = np.abs(actual.astype(int) - expected)
    if not jpeg.AVAILABLE:
        np.testing.assert_array_equal(actual, expected)
    assert diff.max() <= 4 and (diff > 0).mean() < 0.01, (diff.max(), (diff > 0).mean())


@pytest.mark.parametrize("training", [True, False])
def test_output_is_the_decoders_full_decode_cut_to_the_window(photo, training):
    """Crops that stay under twice the output (no DCT scaling): the decoder's full decode, cut to the
    window crop_boxes gives, resized, and flipped where it says (up to the window decode's edges)."""
    jpeg = _jpeg(photo)
    n, size = 24, (224, 224)
    seeds = np.arange(n, dtype=np.uint64) * np.uint64(7919)
    out = _images(ImageTransform(size, training=training)(
        pa.table({COLUMN: [jpeg] * n, SEED_COLUMN: pa.array(seeds, pa.uint64())})))
    boxes, flips = crop_boxes(seeds if training else None, [375] * n, [500] * n, size)
    full = simplejpeg.decode_jpeg(jpeg)
    checked = 0
    for i, ((y, x, h, w), flip) in enumerate(zip(boxes, flips)):
        if min(h / size[0], w / size[1]) >= 2:
            continue
        expected = _resize(full[y:y + h, x:x + w], size)
        assert_window_decode_close(out[i], expected[:, ::-1] if flip else expected)
        checked += 1
    assert checked >= n // 2
    assert not training or 0 < flips.sum() < n


def test_dct_scaled_decode_matches_the_full_decode_of_its_window(photo):
    """Small outputs decode at 1/2..1/8 scale: the same window as the full decode, up to resampling."""
    jpeg = _jpeg(photo)
    size = (32, 32)
    seeds = np.arange(16, dtype=np.uint64)
    out = _images(ImageTransform(size, training=True)(
        pa.table({COLUMN: [jpeg] * 16, SEED_COLUMN: pa.array(seeds, pa.uint64())})))
    boxes, flips = crop_boxes(seeds, [375] * 16, [500] * 16, size)
    full = simplejpeg.decode_jpeg(jpeg)
    def distance(i: int, y: int, x: int, h: int, w: int) -> float:
        expected = cv2.resize(full[y:y + h, x:x + w], (32, 32), interpolation=cv2.INTER_AREA)
        return float(np.abs(out[i].astype(int) - (expected[:, ::-1] if flips[i] else expected)).mean())

    for i, (y, x, h, w) in enumerate(boxes):
        here = distance(i, y, x, h, w)
        # Resampling differs (DCT scaling + bilinear vs area), so compare with the window a quarter over.
        shifted = distance(i, min(y + h // 4, 375 - h), min(x + w // 4, 500 - w), h, w)
        assert here < 25 and (here < shifted / 2 or (y + h // 4 > 375 - h and x + w // 4 > 500 - w)), (i, here, shifted)


def test_evaluation_crop_is_tensorflow_models_centre_crop():
    # tensorflow/models: crop = int(224 / (224 + 32) * min(h, w)), offsets ((h - crop) + 1) // 2.
    for h, w in [(375, 500), (500, 333), (224, 224), (1000, 37)]:
        (box,), _ = crop_boxes(None, [h], [w], (224, 224))
        crop = int(224 / 256 * min(h, w))
        assert tuple(box) == ((h - crop + 1) // 2, (w - crop + 1) // 2, crop, crop)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1), st.integers(1, 3000), st.integers(1, 3000))
def test_training_windows_follow_the_inception_ranges(seed, h, w):
    (box,), _ = crop_boxes(np.array([seed], np.uint64), [h], [w], (224, 224))
    y, x, ch, cw = (int(v) for v in box)
    assert 0 <= y and 0 <= x and ch >= 1 and cw >= 1 and y + ch <= h and x + cw <= w
    if (ch, cw) != (h, w):  # else: no try fitted, the whole image
        area = ch * cw / (h * w)
        # Rounding to whole pixels moves area and aspect by at most half a pixel a side.
        slack = 1 / min(ch, cw)
        assert 0.08 * (1 - 2 * slack) <= area <= 1.0
        assert ASPECT_RANGE[0] * (1 - 2 * slack) <= cw / ch <= ASPECT_RANGE[1] * (1 + 2 * slack)


def test_crops_cover_the_ranges_not_one_corner():
    seeds = np.arange(4000, dtype=np.uint64)
    boxes, flips = crop_boxes(seeds, [375] * 4000, [500] * 4000, (224, 224))
    area = boxes[:, 2] * boxes[:, 3] / (375 * 500)
    assert area.min() < 0.1 and area.max() > 0.95
    assert abs(flips.mean() - 0.5) < 0.05
    centres = (boxes[:, 1] + boxes[:, 3] / 2) / 500
    assert centres.min() < 0.2 and centres.max() > 0.8


# --- seeds -----------------------------------------------------------------------------------------------

def test_row_seeds_make_batches_independent_of_their_boundaries():
    table = image_table(12, seed=3)
    table = table.append_column(SEED_COLUMN, pa.array(np.arange(100, 112), pa.uint64()))
    transform = ImageTransform(64, training=True)
    whole = _images(transform(table))
    for cut in (1, 5, 7):
        parts = [transform(table.slice(s, cut)) for s in range(0, 12, cut)]
        np.testing.assert_array_equal(np.concatenate([_images(p) for p in parts]), whole)
    # Another seed column crops differently.
    other = table.set_column(table.column_names.index(SEED_COLUMN), SEED_COLUMN,
                             pa.array(np.arange(200, 212), pa.uint64()))
    assert not np.array_equal(_images(transform(other)), whole)


def test_without_a_seed_column_crops_follow_seed_and_content():
    table = image_table(10, seed=4)
    a = _images(ImageTransform(48, training=True, seed=5)(table))
    reordered = _images(ImageTransform(48, training=True, seed=5)(table.take(list(range(9, -1, -1)))))
    np.testing.assert_array_equal(reordered[::-1], a)
    assert not np.array_equal(_images(ImageTransform(48, training=True, seed=6)(table)), a)


def test_threads_give_the_same_bits():
    table = image_table(9, seed=5)
    one = _images(ImageTransform(40, training=True, seed=1)(table))
    np.testing.assert_array_equal(_images(ImageTransform(40, training=True, seed=1, threads=3)(table)), one)


def test_same_seed_same_bits_through_ray_data_whatever_the_blocks(ray_local, tmp_path):
    import ray

    import ray_tfrecord

    write_image_set(str(tmp_path), 24, files=3, seed=6)
    transform = ImageTransform(32, training=True, seed=9)

    def run(batch_size: int, blocks: int | None) -> dict[bytes, bytes]:
        ds = ray_tfrecord.read_tfrecords(str(tmp_path))
        if blocks:
            ds = ds.repartition(blocks)
        rows = ds.map_batches(transform, batch_format="pyarrow", batch_size=batch_size).take_all()
        return {r["image/filename"]: r["image"].tobytes() for r in rows}

    first = run(5, None)
    assert len(first) == 24
    assert run(11, 7) == first
    assert ray.is_initialized()


# --- corrupt values --------------------------------------------------------------------------------------

def _bad_values(photo: np.ndarray) -> dict[str, bytes | None]:
    jpeg, png = _jpeg(photo), _png(photo)
    return {"truncated JPEG": jpeg[: len(jpeg) // 2], "JPEG without its last bytes": jpeg[:-2],
            "truncated PNG": png[:-1], "text": b"not an image at all", "empty": b"", "null": None,
            "JPEG header only": jpeg[:600]}


def test_corrupt_values_raise_naming_file_column_and_row(photo, tmp_path):
    good = _jpeg(photo)
    for what, bad in _bad_values(photo).items():
        table = pa.table({COLUMN: pa.array([good, bad, good], pa.binary()),
                          "path": ["/data/train-00001", "/data/train-00002", "/data/train-00003"]})
        with pytest.raises(ImageError) as e:
            ImageTransform(32, training=False)(table)
        message = str(e.value)
        assert message.startswith("/data/train-00002, column 'image/encoded': row 1 of this batch is not a "
                                  "decodable image ("), (what, message)
        assert message.endswith("); pass on_corrupt='skip' to leave such rows out and count them"), message
        assert e.value.path == "/data/train-00002" and e.value.column == COLUMN


def test_the_message_without_paths_says_how_to_get_them(photo):
    with pytest.raises(ImageError, match=r"^column 'image/encoded': row 0 of this batch is not a decodable image "
                       r"\(the value is empty\); pass on_corrupt='skip' to leave such rows out and count them, "
                       r"or read with include_paths=True to see the file$"):
        ImageTransform(32, training=False)(pa.table({COLUMN: [b""]}))


def test_skip_leaves_bad_rows_out_and_counts_them(photo, caplog):
    good = _jpeg(photo)
    bad = _bad_values(photo)
    values = [good, *bad.values(), good]
    transform = ImageTransform(32, training=False, on_corrupt="skip")
    out = transform(pa.table({COLUMN: pa.array(values, pa.binary()), "label": list(range(len(values)))}))
    assert out.column("label").to_pylist() == [0, len(values) - 1]
    assert transform.skipped == len(bad)
    images = _images(out)
    np.testing.assert_array_equal(images[0], images[1])
    assert images.mean() > 20  # decoded pixels, not a black fill
    assert sum("skipped" in r.getMessage() for r in caplog.records) == len(bad)


def test_skip_keeps_the_place_with_weight_zero_in_the_resumable_feeds_batches(photo):
    good = _jpeg(photo)
    table = pa.table({COLUMN: pa.array([good, b"junk", good], pa.binary()),
                      SEED_COLUMN: pa.array([1, 2, 3], pa.uint64()),
                      "__weight__": pa.array([1.0, 1.0, 0.0], pa.float32())})
    out = ImageTransform(32, training=True, on_corrupt="skip")(table)
    assert out.column("__weight__").to_pylist() == [1.0, 0.0, 0.0]
    assert out.schema.field("__weight__").type == pa.float32()
    assert _images(out)[1].max() == 0 and _images(out)[0].max() > 0


def test_a_column_that_is_not_bytes_is_refused():
    with pytest.raises(ValueError, match=r"column 'image/encoded' is int64, not encoded images \(binary\)"):
        ImageTransform(32, training=False)(pa.table({COLUMN: [1, 2]}))
    with pytest.raises(ValueError, match=r"the batch has no column 'image/encoded' \(it has \['x'\]\)"):
        ImageTransform(32, training=False)(pa.table({"x": [b""]}))


# --- formats ---------------------------------------------------------------------------------------------

# Windows under twice the output: no DCT scaling, so JPEGs too are their decoder's full decode.
FORMAT_SIZE = (200, 240)


def _eval(value: bytes, size=FORMAT_SIZE, channels=3) -> np.ndarray:
    return _images(ImageTransform(size, training=False, channels=channels)(pa.table({COLUMN: [value]})))[0]


def _eval_window(pixels: np.ndarray, size=FORMAT_SIZE) -> np.ndarray:
    (y, x, h, w), = crop_boxes(None, [pixels.shape[0]], [pixels.shape[1]], size)[0]
    return _resize(pixels[y:y + h, x:x + w], size)


def test_png_is_lossless_so_the_output_is_the_source_pixels_resized(photo):
    np.testing.assert_array_equal(_eval(_png(photo)), _eval_window(photo))


def test_png_with_alpha_drops_the_alpha(photo):
    alpha = np.dstack([photo, np.linspace(0, 255, photo.shape[1], dtype=np.uint8)[None, :].repeat(375, 0)])
    np.testing.assert_array_equal(_eval(_png(alpha)), _eval_window(photo))


def test_grayscale_png_and_jpeg_repeat_the_luma(photo):
    gray = cv2.cvtColor(photo, cv2.COLOR_RGB2GRAY)
    out = _eval(_png(gray))
    expected = _eval_window(gray)
    for c in range(3):
        np.testing.assert_array_equal(out[:, :, c], expected)
    jpeg = _eval(_jpeg(gray[:, :, None], colorspace="GRAY", colorsubsampling="Gray"))
    assert (jpeg[:, :, 0] == jpeg[:, :, 1]).all() and (jpeg[:, :, 1] == jpeg[:, :, 2]).all()
    assert np.abs(jpeg[:, :, 0].astype(int) - expected).mean() < 3


def test_sixteen_bit_png_comes_out_eight_bit(photo):
    deep = photo.astype(np.uint16) * 257
    np.testing.assert_array_equal(_eval(_png(deep)), _eval_window(photo))


def test_progressive_jpeg_equals_its_baseline_twin(photo):
    ok, progressive = cv2.imencode(".jpg", photo[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90,
                                                               cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
    assert ok
    full = simplejpeg.decode_jpeg(progressive.tobytes())
    assert_window_decode_close(_eval(progressive.tobytes()), _eval_window(full))
    assert np.abs(full.astype(int) - photo).mean() < 3


def test_cmyk_jpeg_comes_out_rgb(photo):
    # Adobe's convention, which Photoshop writes: inverted ink values, read as YCCK.
    cmyk = np.dstack([photo, np.full(photo.shape[:2], 255, np.uint8)])
    value = _jpeg(cmyk, colorspace="CMYK")
    assert simplejpeg.decode_jpeg_header(value)[2] in ("CMYK", "YCCK")
    out = _eval(value)
    assert np.abs(out.astype(int) - _eval_window(photo)).mean() < 4


def test_one_channel_output(photo):
    out = _eval(_png(photo), channels=1)
    assert out.shape == (*FORMAT_SIZE, 1)
    gray = cv2.cvtColor(photo, cv2.COLOR_RGB2GRAY)
    assert np.abs(out[:, :, 0].astype(int) - _eval_window(gray)).mean() < 2


# --- the set and the feed --------------------------------------------------------------------------------

def test_image_set_is_imagenet_like():
    table = image_table(40, seed=0)
    sizes = np.array([len(v) for v in table.column(COLUMN).to_pylist()])
    assert 70_000 < sizes.mean() < 150_000
    labels = table.column("image/class/label").to_numpy()
    assert set(labels) <= {1, 2, 3, 4} and len(set(labels)) == 4
    first = table.slice(0, 1).to_pylist()[0]
    h, w, _ = simplejpeg.decode_jpeg_header(first[COLUMN])[:3]
    assert (h, w) == (first["image/height"], first["image/width"]) and first["image/format"] == b"JPEG"
    assert table.slice(5, 3).equals(image_table(3, seed=0, start=5))
    # The benchmark's smaller set: the same images with less grain, about 70 KiB a JPEG.
    smooth = image_table(40, seed=0, grain=SMOOTH_GRAIN)
    smooth_sizes = np.array([len(v) for v in smooth.column(COLUMN).to_pylist()])
    assert 60_000 < smooth_sizes.mean() < 85_000 and (smooth_sizes < sizes).all()
    assert smooth.drop_columns([COLUMN]).equals(table.drop_columns([COLUMN]))


def test_tf_dataset_takes_the_tensor_column_as_one_dense_uint8_batch(ray_local, tmp_path):
    import ray_tfrecord.tf

    write_image_set(str(tmp_path), 10, files=2, seed=7)
    ds = ray_tfrecord.read_tfrecords(str(tmp_path)).map_batches(
        ImageTransform((24, 32), training=False), batch_format="pyarrow")
    feed = ray_tfrecord.tf.tf_dataset(ds, feature_columns=["image"], label_columns="image/class/label", batch_size=10)
    (features, label), = feed.take(1)
    assert features["image"].dtype.name == "uint8" and tuple(features["image"].shape) == (10, 24, 32, 3)
    assert features["image"].numpy().mean() > 20
    assert math.prod(label.shape) == 10


def test_the_resumable_feed_augments_a_resumed_epoch_bit_for_bit_as_an_uninterrupted_one(ray_local, tmp_path):
    from ray_tfrecord._src.data.feed.splits import plan_splits
    from ray_tfrecord._src.tf.resume import ResumableFeed

    write_image_set(str(tmp_path / "set"), 40, files=4, seed=8)
    plan = plan_splits(str(tmp_path / "set"), schema=image_table(1).select([COLUMN, "image/filename", LABEL]).schema,
                       split_bytes=300_000)

    def feed() -> ResumableFeed:
        return ResumableFeed(plan, feature_columns=["image", "image/filename"], label_columns=LABEL, batch_size=8, seed=3,
                             rank=0, world_size=1, transform=ImageTransform(32, training=True))

    def rows(f: ResumableFeed, steps: int | None = None) -> dict[bytes, bytes]:
        out = {}
        for step, (x, _, weight) in enumerate(f.dataset()):
            if steps is not None and step == steps:
                break
            for name, image, w in zip(x["image/filename"].numpy(), x["image"].numpy(), weight.numpy()):
                if w:
                    out[name] = image.tobytes()
        return out

    whole = rows(feed())
    assert len(whole) == 40
    first = feed()
    before = rows(first, 2)
    first.save(str(tmp_path), 2)
    resumed = feed()
    resumed.load(str(tmp_path))
    after = rows(resumed)
    assert len(before) == 16 and not set(before) & set(after)
    assert {**before, **after} == whole
    # The next epoch crops anew.
    again = feed()
    rows(again)
    assert rows(again) != whole


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_example_trains_past_chance_and_reports_its_rate(tmp_path):
    """``train_examples/images_cnn.py --fast`` as a user runs it: it learns (four classes, chance is 0.25)
    and its log is readable."""
    import subprocess

    from tests.test_examples_quiet import readable_log_problems

    example = os.path.join(os.path.dirname(__file__), "..", "train_examples", "images_cnn.py")
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "RAY_COLOR_PREFIX")}
    env["RAY_ADDRESS"] = "local"
    run = subprocess.run([sys.executable, example, "--fast", "--out", str(tmp_path / "out")], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=800)
    assert run.returncode == 0, run.stdout[-5000:]
    assert "trained 3 epochs, loss " in run.stdout
    assert " images/s (decode, crop, flip and resize in Ray Data)" in run.stdout
    assert readable_log_problems(run.stdout, max_lines=200) == []


def test_fixed_shape_tensor_columns_become_dense_tensors_ray_s_and_arrow_s():
    from ray.data.extensions import ArrowTensorArray

    from ray_tfrecord._src.tf.tensors import tensors_from_arrow, type_spec

    images = np.arange(4 * 2 * 3 * 3, dtype=np.uint8).reshape(4, 2, 3, 3)
    for column in (ArrowTensorArray.from_numpy(images), pa.FixedShapeTensorArray.from_numpy_ndarray(images)):
        assert type_spec(column.type).shape.as_list() == [None, 2, 3, 3]
        tensor = tensors_from_arrow(pa.table({"image": column.slice(1, 2)}))["image"]
        assert tensor.dtype.name == "uint8"
        np.testing.assert_array_equal(tensor.numpy(), images[1:3])
    permuted = pa.fixed_shape_tensor(pa.uint8(), (2, 3, 3), permutation=[1, 0, 2])
    with pytest.raises(TypeError, match="has no TensorFlow equivalent"):
        type_spec(permuted)
