"""Packed int64 lists long enough for every path of the native varint decoder: words of eight
one-byte values (decoded in one go), words of one- and two-byte values (decoded eight slots at a
time), words mixing longer lengths, 9- and 10-byte values, and tails shorter than a word. Checked
against protobuf's own parser and against TensorFlow's."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.framing import frame_records, iter_chunks

from . import reference as ref

# Runs of one-byte values (image pixels, counts) between values of every varint length.
VALUES = st.one_of(
    st.integers(128, 255),
    st.integers(-(2**63), 2**63 - 1),
    st.sampled_from([0, 127, 128, 2**56 - 1, 2**56, 2**63 - 1, -1, -(2**63)]),
)
SEGMENTS = st.one_of(
    st.lists(st.integers(0, 127), min_size=1, max_size=24),
    st.lists(st.integers(0, 2**14 - 1), min_size=1, max_size=24),
    st.lists(VALUES, min_size=1, max_size=4),
)
ROWS = st.lists(st.lists(SEGMENTS, max_size=8).map(lambda segs: [v for seg in segs for v in seg]),
                min_size=1, max_size=20)
SCHEMA = pa.schema([pa.field("v", pa.list_(pa.int64()))])


def _decode(payloads: list[bytes]) -> list:
    (chunk,) = iter_chunks(io.BytesIO(frame_records(payloads)), path="mem")
    return codec.decode(chunk, SCHEMA).column(0).to_pylist()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ROWS)
def test_packed_int64_lists_decode_as_protobuf_parses_them(rows):
    payloads = [ref.encode_example({"v": ("int64_list", r)}) for r in rows]
    assert _decode(payloads) == [ref.decode_example(p)["v"][1] for p in payloads]


def test_random_pixels_match_tensorflow():
    # Pixels 0-255 at random: words of one- and two-byte varints in every arrangement, so the
    # eight-slot path runs on most words and ends a field mid-word; one row ends in a 3-byte value.
    rng = np.random.default_rng(7)
    rows = [rng.integers(0, 256, 784).tolist() for _ in range(50)] + [[300, 5, 200, 70000], [16383] * 9 + [16384]]
    payloads = [ref.encode_example({"v": ("int64_list", r)}) for r in rows]
    parsed = tf.io.parse_example(payloads, {"v": tf.io.RaggedFeature(tf.int64)})["v"].to_list()
    assert _decode(payloads) == parsed == rows


def test_runs_of_one_byte_values_match_tensorflow():
    # 784 pixels, mostly zero, as MNIST: whole words of one-byte varints, then mixed words.
    rows = [[0] * 300 + [k % 256 for k in range(200)] + [127] * 284, [5] * 8, [1] * 7, [200] * 9]
    payloads = [ref.encode_example({"v": ("int64_list", r)}) for r in rows]
    parsed = tf.io.parse_example(payloads, {"v": tf.io.RaggedFeature(tf.int64)})["v"].to_list()
    assert _decode(payloads) == parsed == rows
