"""Hypothesis strategies for TFRecord features: every kind, empty lists, int64 extremes,
NaN/inf floats, non-UTF-8 bytes, missing features."""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import strategies as st

INT64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, -1, 1, 2**63 - 1, -(2**63), 127, 128, -129]))
FLOAT32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
BYTES = st.binary(max_size=24)
KINDS = {"int64_list": INT64, "float_list": FLOAT32, "bytes_list": BYTES}
NAMES = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=8)


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same_floats(a: list, b: list) -> bool:
    """Bitwise float32 equality that treats any NaN as equal to any NaN."""
    if len(a) != len(b):
        return False
    return all((math.isnan(x) and math.isnan(y)) or np.float32(x) == np.float32(y) and
               math.copysign(1, x) == math.copysign(1, y) for x, y in zip(a, b))


@st.composite
def column_specs(draw, max_columns: int = 6):
    """{name: (kind, mode)} where mode is 'scalar', 'list' or 'fixed:n'."""
    names = draw(st.lists(NAMES, min_size=1, max_size=max_columns, unique=True))
    specs = {}
    for name in names:
        kind = draw(st.sampled_from(sorted(KINDS)))
        mode = draw(st.sampled_from(["scalar", "list", "list", "fixed"]))
        if mode == "fixed":
            mode = f"fixed:{draw(st.integers(1, 4))}"
        specs[name] = (kind, mode)
    return specs


@st.composite
def rows_for(draw, specs: dict, min_rows: int = 0, max_rows: int = 12):
    """Rows as {name: (kind, values)}; a feature may be missing; lists may be empty."""
    rows = []
    for _ in range(draw(st.integers(min_rows, max_rows))):
        row = {}
        for name, (kind, mode) in specs.items():
            if draw(st.integers(0, 5)) == 0:
                continue
            if mode == "scalar":
                n = 1
            elif mode.startswith("fixed"):
                n = int(mode.split(":")[1])
            else:
                n = draw(st.integers(0, 5))
            row[name] = (kind, draw(st.lists(KINDS[kind], min_size=n, max_size=n)))
        rows.append(row)
    return rows
