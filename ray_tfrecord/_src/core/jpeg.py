"""The native JPEG window decode: the pixels of a crop window, for a fraction of a full decode's work.

libjpeg-turbo's ``jpeg_skip_scanlines`` and ``jpeg_crop_scanline`` (TensorFlow's
``decode_and_crop_jpeg`` uses them too) run the inverse DCT, upsampling and colour conversion only
for the blocks around the window. Unlike TensorFlow's op it still entropy-decodes the whole scan, so
a truncated or damaged JPEG is an error wherever the damage lies. A few pixels may differ by a few
levels (at most 4 in the tests) from decode-then-crop. The extension has it where its build found
libjpeg-turbo (setup.py); ``AVAILABLE`` says whether it did.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np

from . import _native
from ._contract import Status

AVAILABLE: Final[bool] = hasattr(_native, "jpeg_window")


class UnsupportedJpeg(Exception):
    """A JPEG the window decode leaves to a full decoder: CMYK, YCCK, 12-bit, or over 1 GiB to decode."""


def decode_window(data: Any, denom: int, channels: int, box: tuple[int, int, int, int]) -> np.ndarray:
    """The window ``box`` = ``(y, x, h, w)`` of the JPEG ``data`` at ``1/denom`` scale (1, 2, 4, 8).

    Returns a ``(h, w, channels)`` uint8 array (channels 3: RGB, 1: luma). Raises ``ValueError`` with
    libjpeg's reason for a corrupt JPEG or a window outside the (scaled) image, ``UnsupportedJpeg``
    for one only a full decoder takes, ``MemoryError``.
    """
    y, x, h, w = box
    out = np.empty((h, w, channels), np.uint8)
    status, message = _native.jpeg_window(data, denom, channels, y, x, h, w, out)
    if status == Status.OK:
        return out
    if status == Status.JPEG_UNSUPPORTED:
        raise UnsupportedJpeg(message)
    if status == Status.JPEG_BAD_WINDOW:
        raise ValueError(f"{message}: window (y={y}, x={x}, h={h}, w={w}) at 1/{denom} scale")
    raise ValueError(message)
