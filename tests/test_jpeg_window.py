"""The native JPEG window decode (core/jpeg.py, native/jpeg.c) against simplejpeg's full decode cut to
the window: every subsampling, DCT scale and window; errors for damage anywhere in the file; the
JPEGs it leaves to a full decoder; and that the build has it wherever it can."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core import jpeg

simplejpeg = pytest.importorskip("simplejpeg")
cv2 = pytest.importorskip("cv2")


def _system_jpeglib() -> bool:
    return any(os.path.exists(os.path.join(d, "jpeglib.h")) for d in ("/usr/include", "/usr/local/include",
                                                                        "/usr/include/x86_64-linux-gnu"))


def test_the_build_has_the_window_decode_wherever_it_can():
    # Python >= 3.12 builds against comma-deps-libjpeg; 3.11 against the system's libjpeg-turbo headers.
    if sys.version_info >= (3, 12) or _system_jpeglib():
        assert jpeg.AVAILABLE, "setup.py should have found libjpeg-turbo"


needs_window_decode = pytest.mark.skipif(not jpeg.AVAILABLE, reason="built without libjpeg-turbo (setup.py)")


def _picture(h: int, w: int, seed: int) -> np.ndarray:
    # Smooth colour gradients plus grain: chroma that subsampling and upsampling visibly act on.
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([(xx * 255 // max(w - 1, 1)), (yy * 255 // max(h - 1, 1)), (xx + yy) % 256], -1)
    return np.clip(base + rng.normal(0, 12, (h, w, 3)), 0, 255).astype(np.uint8)


@needs_window_decode
@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 90), w=st.integers(1, 90), sub=st.sampled_from(["444", "422", "420", "440", "411", "Gray"]),
       denom=st.sampled_from([1, 2, 4, 8]), channels=st.sampled_from([1, 3]), progressive=st.booleans(),
       data=st.data())
def test_window_is_the_full_decode_cut_to_it(h, w, sub, denom, channels, progressive, data):
    # Below 8 * denom pixels other scales of TurboJPEG's (1/8, 1/4, 3/8, 1/2, ...) give the same size,
    # and simplejpeg, asked for a size, may take one of them.
    assume(max(h, w) >= 8 * denom)
    pixels = _picture(h, w, h * 97 + w)
    if sub == "Gray":
        value = simplejpeg.encode_jpeg(pixels[:, :, :1].copy(), 90, colorspace="GRAY", colorsubsampling="Gray")
    elif progressive:
        ok, buf = cv2.imencode(".jpg", pixels[:, :, ::-1], [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])
        assert ok
        value = buf.tobytes()
    else:
        value = simplejpeg.encode_jpeg(pixels, 90, colorsubsampling=sub)
    sh, sw = -(-h // denom), -(-w // denom)
    y = data.draw(st.integers(0, sh - 1))
    x = data.draw(st.integers(0, sw - 1))
    box = (y, x, data.draw(st.integers(1, sh - y)), data.draw(st.integers(1, sw - x)))
    colorspace = "RGB" if channels == 3 else "GRAY"
    full = simplejpeg.decode_jpeg(value, colorspace, min_factor=denom, min_height=sh, min_width=sw)
    assert full.shape[:2] == (sh, sw)
    window = jpeg.decode_window(value, denom, channels, box)
    expected = full[y:y + box[2], x:x + box[3]]
    assert window.shape == (box[2], box[3], channels)
    diff = np.abs(window.astype(int) - expected)
    assert diff.max() <= 4, (diff.max(), box, h, w, sub, denom, channels, progressive)


@needs_window_decode
def test_damage_anywhere_is_an_error_even_below_the_window():
    value = simplejpeg.encode_jpeg(_picture(120, 160, 1), 90)
    assert jpeg.decode_window(value, 1, 3, (0, 0, 16, 16)).shape == (16, 16, 3)
    for cut in (len(value) - 2, len(value) * 3 // 4, len(value) // 2, 300, 3):
        with pytest.raises(ValueError, match=r"Premature end of JPEG file|JPEG datastream contains no image"):
            jpeg.decode_window(value[:cut], 1, 3, (0, 0, 16, 16))
    with pytest.raises(ValueError, match=r"^Not a JPEG file"):
        jpeg.decode_window(b"\x89PNG\r\n\x1a\n" + value[8:], 1, 3, (0, 0, 1, 1))


@needs_window_decode
def test_a_window_outside_the_image_is_refused():
    value = simplejpeg.encode_jpeg(_picture(40, 60, 2), 90)
    for box, denom in [((0, 0, 41, 60), 1), ((39, 0, 2, 1), 1), ((0, 59, 1, 2), 1), ((0, 0, 21, 30), 2)]:
        with pytest.raises(ValueError, match=r"^crop window outside the image: window \(y="):
            jpeg.decode_window(value, denom, 3, box)
    with pytest.raises(ValueError, match=r"^crop window outside the image"):
        jpeg.decode_window(value, 3, 3, (0, 0, 1, 1))


@needs_window_decode
def test_cmyk_is_left_to_a_full_decoder():
    value = simplejpeg.encode_jpeg(np.dstack([_picture(16, 16, 3), np.full((16, 16), 255, np.uint8)]), 90,
                                   colorspace="CMYK")
    with pytest.raises(jpeg.UnsupportedJpeg):
        jpeg.decode_window(value, 1, 3, (0, 0, 8, 8))


def test_without_libjpeg_turbo_the_extension_builds_and_images_decode_whole(tmp_path):
    """RAY_TFRECORD_JPEG=none: the extension builds without the unit, and ImageTransform decodes whole
    JPEGs with simplejpeg."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.fail("a C compiler is needed to build the extension")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = tmp_path / "build"
    env = dict(os.environ, RAY_TFRECORD_JPEG="none")
    subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(build / "lib"),
                    "--build-temp", str(build / "tmp")], cwd=root, env=env, check=True, capture_output=True)
    built = list((build / "lib").rglob("_native*.so"))
    assert len(built) == 1
    probe = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location("
             "'ray_tfrecord._src.core._native', sys.argv[1]); m = importlib.util.module_from_spec(spec); "
             "spec.loader.exec_module(m); print(hasattr(m, 'jpeg_window'), 'JPEG_CORRUPT' in m.STATUS)")
    out = subprocess.run([sys.executable, "-c", probe, str(built[0])], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_a_build_without_it_says_once_that_it_decodes_whole_jpegs(monkeypatch, caplog):
    import pyarrow as pa

    from ray_tfrecord import ImageTransform
    from ray_tfrecord._src.data.feed import images

    monkeypatch.setattr(jpeg, "AVAILABLE", False)
    monkeypatch.setattr(images, "_WHOLE_NOTE", images.threading.Lock())
    value = simplejpeg.encode_jpeg(_picture(60, 80, 4), 90)
    with caplog.at_level("INFO", logger=images.__name__):
        for _ in range(2):
            ImageTransform(32, training=True, seed=0, threads=2)(pa.table({"image/encoded": [value] * 8}))
    notes = [r.getMessage() for r in caplog.records if "decodes whole JPEGs" in r.getMessage()]
    assert len(notes) == 1 and "built without libjpeg-turbo" in notes[0]
