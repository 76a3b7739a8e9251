"""Exact conversions between TFRecord's float32 and Arrow decimals (``decimal128``, ``decimal256``).

Read rule: a float32 becomes the decimal nearest its exact binary value at the type's scale, ties
to even (0.1f is 0.100000001490116…, so 0.10 at scale 2); a value needing more digits than the
precision, NaN and ±inf have no decimal form. Write rule: a decimal becomes its nearest float32
(correctly rounded from the exact decimal, not via float64); it is exact when the read rule gives
the same decimal back.

Both directions are vectorised. A float path covers the common cases and is taken only where it
is provably exact; the rest uses numpy object arrays of Python ints (exact at any scale and
precision, no Python code per value).
"""

from __future__ import annotations

import decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa

_LIMB = 64
_MASK = (1 << _LIMB) - 1
# float64(x) * 10**s is exact for a float32 x when 5**s < 2**29 (24 + 29 significant bits <= 53).
_EXACT_PRODUCT_SCALE = 12
# 10**s is exact in float64 up to 10**22, so an integer below 2**53 over it rounds once.
_EXACT_QUOTIENT_SCALE = 22


def is_decimal(t: pa.DataType) -> bool:
    """Whether ``t`` is a decimal type this package reads and writes as ``float_list``."""
    return pa.types.is_decimal128(t) or pa.types.is_decimal256(t)


def _limbs(t: pa.DataType) -> int:
    return t.byte_width * 8 // _LIMB


def from_float32(arr: pa.Array, t: pa.DataType) -> tuple[pa.Array, np.ndarray]:
    """The ``t`` array of a float32 array under the read rule (same nulls), and a mask of the
    values with no decimal form in ``t`` (null slots included: the caller decides)."""
    n, offset = len(arr), arr.offset
    values = np.frombuffer(arr.buffers()[1], np.float32, count=offset + n)
    unscaled, bad = _scaled_integers(values, t.scale, t.precision)
    limbs = pa.py_buffer(_to_limbs(unscaled, _limbs(t)))
    out = pa.Array.from_buffers(t, n, [arr.buffers()[0], limbs], null_count=arr.null_count, offset=offset)
    return out, bad[offset:]


def to_float32(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """The float32 values of a decimal array under the write rule, and a mask of the valid values
    that do not read back as themselves. Where the nearest float32 would read back with one digit
    more than the precision (9999999999 as decimal128(10, 0) is 1e10f), its neighbour toward
    zero is used, so what is written always reads back under the column's type."""
    t, n = arr.type, len(arr)
    k = _limbs(t)
    words = np.frombuffer(arr.buffers()[1], np.uint64, count=(arr.offset + n) * k)[arr.offset * k:].reshape(n, k)
    small = _fits_int64(words)
    if small is not None and 0 <= t.scale <= _EXACT_QUOTIENT_SCALE and (np.abs(small) <= 2**53).all():
        nearest = small.astype(np.float64) / 10.0**t.scale
        unscaled = small
    else:
        unscaled = _from_limbs(words)
        if t.scale >= 0:
            nearest = (unscaled / 10**t.scale).astype(np.float64)
        else:  # clipped where float64 would overflow: far beyond float32, so infinite either way
            nearest = (unscaled * 10**-t.scale).clip(-(2**200), 2**200).astype(np.float64)
    out = _round_to_float32(nearest, unscaled, t.scale)
    back, bad = _scaled_integers(out, t.scale, t.precision)
    out[bad] = np.nextafter(out[bad], np.float32(0))
    changed = bad | (back != unscaled).astype(bool)
    if arr.null_count:
        changed &= np.asarray(arr.is_valid())
    return out, changed


def text(arr: pa.Array, i: int) -> str:
    """Element ``i`` of a decimal array, written out (for error messages; pyarrow's own
    conversion refuses scales beyond the type's maximum precision)."""
    k = _limbs(arr.type)
    words = np.frombuffer(arr.buffers()[1], np.uint64, count=(arr.offset + i + 1) * k)[(arr.offset + i) * k:]
    unscaled = int(_from_limbs(words.reshape(1, k))[0])
    return str(decimal.Decimal(unscaled).scaleb(-arr.type.scale, context=decimal.Context(prec=200)))


def digits(value: float, scale: int) -> int:
    """How many digits ``value`` needs at ``scale`` under the read rule (for error messages)."""
    context = decimal.Context(prec=400 + abs(scale), rounding=decimal.ROUND_HALF_EVEN)
    q = context.quantize(decimal.Decimal(value), decimal.Decimal(1).scaleb(-scale))
    return max(len(q.as_tuple().digits), 1)


# ------------------------------------------------------------------------------------------------


def _scaled_integers(values: np.ndarray, scale: int, precision: int) -> tuple[np.ndarray, np.ndarray]:
    """round_half_even(v * 10**scale) for each float32 ``v`` (int64 array, or object array of
    Python ints when they do not fit), and the mask of those that are not finite or reach
    10**precision (they are 0 in the result)."""
    bad = ~np.isfinite(values)
    if 0 <= scale <= _EXACT_PRODUCT_SCALE:
        scaled = np.rint(np.where(bad, 0, values).astype(np.float64) * 10.0**scale)
        if (np.abs(scaled) < 2.0**63).all():
            ints = scaled.astype(np.int64)
            if precision <= 18:
                bad |= np.abs(ints) >= 10**precision
                ints[bad] = 0
            return ints, bad
    mant, exp = np.frexp(np.where(bad, 0, values).astype(np.float64))
    m = (mant * 2.0**53).astype(np.int64)  # exact: a float32's significand has 24 bits
    e = exp.astype(np.int64) - 53
    num = np.abs(m).astype(object) * 10**max(scale, 0) << np.maximum(e, 0).astype(object)
    den = 10**max(-scale, 0) << np.maximum(-e, 0).astype(object)
    q, r = num // den, num % den
    twice = 2 * r
    up = (twice > den) | ((twice == den) & (q % 2 == 1))
    ints = np.where(m < 0, -(q + up.astype(bool)), q + up.astype(bool))
    over = np.abs(ints) >= 10**precision
    bad |= over.astype(bool)
    ints[bad] = 0
    return ints, bad


def _to_limbs(ints: np.ndarray, k: int) -> bytes:
    """Little-endian two's-complement words of each integer, ``k`` 64-bit words apiece."""
    out = np.empty((len(ints), k), np.uint64)
    if ints.dtype == np.int64:
        out[:, 0] = ints.view(np.uint64)
        out[:, 1:] = (ints >> 63).view(np.uint64)[:, None]  # the sign extension: all ones or zeros
    else:
        for i in range(k):
            out[:, i] = ((ints >> (_LIMB * i)) & _MASK).astype(np.uint64)
    return out.tobytes()


def _fits_int64(words: np.ndarray) -> np.ndarray | None:
    """The values as int64 when every one's upper words are its sign extension, else None."""
    low = words[:, 0].view(np.int64)
    return low if (words[:, 1:] == (low >> 63).view(np.uint64)[:, None]).all() else None


def _from_limbs(words: np.ndarray) -> np.ndarray:
    """Python ints (object array) from little-endian two's-complement words."""
    k = words.shape[1]
    ints = words[:, k - 1].view(np.int64).astype(object)
    for i in range(k - 2, -1, -1):
        ints = (ints << _LIMB) + words[:, i].astype(object)
    return ints


def _round_to_float32(nearest: np.ndarray, unscaled: np.ndarray, scale: int) -> np.ndarray:
    """The float32 nearest each exact ``unscaled * 10**-scale``, given ``nearest``, its float64
    rounding. Rounding twice is wrong only when the float64 lands exactly on a float32 midpoint
    the exact value is not on; those (rare) values are decided exactly."""
    with np.errstate(over="ignore"):  # beyond float32's range the nearest is an infinity
        out = nearest.astype(np.float32)
    wide = np.where(np.isinf(out), np.copysign(2.0**128, nearest), out.astype(np.float64))
    toward = np.where(wide > nearest, -np.inf, np.inf).astype(np.float32)
    other = np.nextafter(out, toward)
    mid = (wide + np.where(np.isinf(other), np.copysign(2.0**128, nearest), other.astype(np.float64))) / 2
    for i in np.flatnonzero((mid == nearest) & (wide != nearest)):
        exact = Fraction(int(unscaled[i])) * Fraction(10) ** -scale
        if (exact > Fraction(mid[i])) == (other[i] > out[i]) and exact != Fraction(mid[i]):
            out[i] = other[i]
    return out
