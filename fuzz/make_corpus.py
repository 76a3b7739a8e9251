"""Regenerate the seed corpora in fuzz/corpus/<target>/ from valid records.

Records come from this package's encoder and from TensorFlow's writer (when TensorFlow is
installed), wrapped in each target's input format (see fuzz/fuzz_native.c):

- scan: a flags byte, then a framed TFRecord stream.
- decode_example / decode_sequence: a column spec, then records as [u16 length][payload].
- inspect: a record-type byte, then records as above.
- encode: generator bytes (the target builds Arrow-like buffers from them).
- pool: 3-byte operations (slot, size; bit 7 of the slot byte: on a new thread) on the buffer pool.
- tensor: a declared shape (rank byte, bit 7: bfloat16 widened; a byte per dimension), then a
  TensorProto: tf.io.serialize_tensor's of every dtype, typed-value forms, broken ones (needs TensorFlow).

Files named regression-* (inputs that once found a bug) are kept.

Usage: python fuzz/make_corpus.py [OUTDIR]   (default: fuzz/corpus)
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core._contract import Kind, Shape
from ray_tfrecord._src.core.framing import frame_records

BYTES, FLOAT, INT64, NULL = Kind.BYTES, Kind.FLOAT, Kind.INT64, Kind.NULL
SCALAR, LIST, FIXED, SEQ = Shape.SCALAR, Shape.LIST, Shape.FIXED, Shape.SEQUENCE


def batches() -> list[tuple[pa.RecordBatch, str, list[tuple[str, int, int, int]]]]:
    """(batch, record type, decode spec as (name, kind, shape, fixed_n)) triples."""
    rng = random.Random(7)
    n = 6
    flat = pa.record_batch({
        "id": pa.array(range(n), pa.int64()),
        "score": pa.array([rng.uniform(-1, 1) for _ in range(n)], pa.float32()),
        "label": pa.array([b"cat", b"", None, b"dog", b"\xff\x00", b"x" * 40], pa.binary()),
        "tags": pa.array([[1, -1, 2**62], [], None, [0], [-(2**63)], [7] * 9], pa.list_(pa.int64())),
        "vec": pa.array([[0.5, -0.0], [1.0, 2.0], [3.0, 4.0], None, [5.0, 6.0], [7.0, 8.0]], pa.list_(pa.float32(), 2)),
        "words": pa.array([["a", "bc"], [], None, ["é"], [""], ["z"] * 3], pa.list_(pa.string())),
        "none": pa.array([[], [], None, [], [], []], pa.list_(pa.null())),
    })
    flat_spec = [("id", INT64, SCALAR, 0), ("score", FLOAT, SCALAR, 0), ("label", BYTES, SCALAR, 0),
                 ("tags", INT64, LIST, 0), ("vec", FLOAT, FIXED, 2), ("words", BYTES, LIST, 0), ("none", NULL, LIST, 0)]
    wide = pa.record_batch({f"f{i:02d}": pa.array([[i] * (i % 3)] * 3, pa.list_(pa.int64())) for i in range(12)})
    wide_spec = [(f"f{i:02d}", INT64, LIST, 0) for i in range(0, 12, 2)]
    seq = pa.record_batch({
        "len": pa.array([2, 0, 1], pa.int64()),
        "frames": pa.array([[[1, 2], [3]], [], None], pa.list_(pa.list_(pa.int64()))),
        "feats": pa.array([[[0.5], [1.5, 2.5]], [[]], [[9.0]]], pa.list_(pa.list_(pa.float32()))),
        "toks": pa.array([[[b"a"], []], [[b"bb", b"c"]], None], pa.list_(pa.list_(pa.binary()))),
        "empty": pa.array([[[]], [], [[], []]], pa.list_(pa.list_(pa.null()))),
    })
    seq_spec = [("len", INT64, SCALAR, 0), ("frames", INT64, SEQ, 0), ("feats", FLOAT, SEQ, 0),
                ("toks", BYTES, SEQ, 0), ("empty", NULL, SEQ, 0)]
    return [(flat, "Example", flat_spec), (wide, "Example", wide_spec), (flat, "SequenceExample", flat_spec),
            (seq, "SequenceExample", seq_spec)]


def tf_payloads() -> tuple[list[bytes], list[bytes], bytes]:
    """Example and SequenceExample payloads written by TensorFlow, and a TF-written file's bytes."""
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf
    except ImportError:
        return [], [], b""
    f = tf.train.Feature
    ex = [tf.train.Example(features=tf.train.Features(feature={
        "i": f(int64_list=tf.train.Int64List(value=[k, -k, 1 << 40])),
        "f": f(float_list=tf.train.FloatList(value=[k / 3])),
        "b": f(bytes_list=tf.train.BytesList(value=[b"v%d" % k, b""])),
        "e": f(),
    })).SerializeToString() for k in range(4)]
    sq = [tf.train.SequenceExample(
        context=tf.train.Features(feature={"i": f(int64_list=tf.train.Int64List(value=[k]))}),
        feature_lists=tf.train.FeatureLists(feature_list={
            "s": tf.train.FeatureList(feature=[f(int64_list=tf.train.Int64List(value=[j] * j)) for j in range(k)]),
            "t": tf.train.FeatureList(feature=[f(bytes_list=tf.train.BytesList(value=[b"w"]))]),
        })).SerializeToString() for k in range(4)]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "tf.tfrecord")
        with tf.io.TFRecordWriter(path) as w:
            for r in ex + sq:
                w.write(r)
        data = Path(path).read_bytes()
    return ex, sq, data


def spec_bytes(spec: list[tuple[str, int, int, int]]) -> bytes:
    out = bytearray([len(spec)])
    for name, kind, shape, n in spec:
        raw = name.encode()
        out += bytes([kind | shape << 2 | len(raw) << 4, n]) + raw
    return bytes(out)


def records_bytes(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack("<H", len(p)) + p for p in payloads)


def _pool_seeds() -> list[bytes]:
    """Take/give sequences over the pool target's 16 slots, a few operations to a few hundred."""
    rng = random.Random(13)
    return [bytes(rng.randrange(256) for _ in range(3 * n)) for n in (4, 16, 64, 256)]


def _jpeg_seeds() -> list[bytes]:
    """Small JPEGs of each kind the window decode meets, each behind a five-byte window (fuzz_jpeg)."""
    import cv2
    import numpy as np
    import simplejpeg

    rng = np.random.default_rng(17)
    pixels = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
    images = [simplejpeg.encode_jpeg(pixels, 85, colorsubsampling=sub) for sub in ("444", "422", "420", "411")]
    images.append(simplejpeg.encode_jpeg(pixels[:, :, :1].copy(), 85, colorspace="GRAY", colorsubsampling="Gray"))
    images.append(simplejpeg.encode_jpeg(np.dstack([pixels, pixels[:, :, 0]]), 85, colorspace="CMYK"))
    images.append(cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_PROGRESSIVE, 1])[1].tobytes())
    images.append(images[2][: len(images[2]) // 2])
    windows = [bytes([0, 4, 8, 15, 23]), bytes([1, 0, 0, 19, 27]), bytes([6, 2, 3, 1, 1]), bytes([3, 0, 0, 4, 6])]
    return [window + image for image in images for window in windows]


def _tensor_seeds() -> list[bytes]:
    """TensorProtos behind the shape they declare (fuzz_tensor): every dtype tf.io.serialize_tensor
    writes, typed-value fields (packed, unpacked, a fill), and broken ones; none without TensorFlow."""
    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import numpy as np
        import tensorflow as tf
    except ImportError:
        return []

    def seed(proto: bytes, shape: list[int], widen: bool = False) -> bytes:
        return bytes([len(shape) | widen << 7, *shape]) + proto

    def typed(dtype: int, shape: list[int], field_bytes: bytes) -> bytes:
        """A TensorProto written by hand: dtype, shape, then the typed field's bytes as given."""
        dims = b"".join(b"\x12" + bytes([2, 8, d]) for d in shape)
        return bytes([8, dtype, 0x12, len(dims)]) + dims + field_bytes

    seeds = []
    values = np.arange(-3, 3).reshape(2, 3)
    for dtype in (tf.float32, tf.float64, tf.int32, tf.uint8, tf.int16, tf.int8, tf.int64, tf.bool,
                  tf.bfloat16, tf.uint16, tf.float16, tf.uint32, tf.uint64):
        tensor = tf.cast(values if dtype.is_bool or not dtype.is_unsigned else values + 3, dtype)
        seeds.append(seed(tf.io.serialize_tensor(tensor).numpy(), [2, 3]))
    bf16 = tf.io.serialize_tensor(tf.constant([[1.5, -2.0]], tf.bfloat16)).numpy()
    seeds.append(seed(bf16, [1, 2], widen=True))
    f32 = tf.io.serialize_tensor(tf.constant([[0.5, 1.0, 2.0], [3.0, 4.0, 5.0]])).numpy()
    seeds += [
        seed(tf.io.serialize_tensor(tf.constant(7.0)).numpy(), []),  # a scalar
        seed(tf.io.serialize_tensor(tf.zeros([0, 3])).numpy(), [0, 3]),  # no elements
        seed(f32[: len(f32) // 2], [2, 3]),  # truncated
        seed(f32[:-25] + bytes([0x7F]) + f32[-24:], [2, 3]),  # tensor_content claims 127 bytes
        seed(f32[:-25] + bytes([20]) + f32[-24:-4], [2, 3]),  # 20 bytes of content: one value short
        seed(tf.make_tensor_proto(5.0, shape=[2, 3]).SerializeToString(), [2, 3]),  # float_val filled
        seed(tf.make_tensor_proto(np.int64(-9), shape=[4]).SerializeToString(), [4]),  # int64_val
        seed(typed(3, [3], bytes([0x38, 1, 0x38, 2, 0x38, 0x7F])), [3]),  # int_val unpacked
        seed(typed(6, [2], bytes([0x3A, 2, 0x80, 1])), [2]),  # int8's int_val 128: out of range
        seed(typed(10, [3], bytes([0x5A, 2, 1, 0])), [3]),  # bool_val packed, then the last repeated
        seed(typed(14, [2], bytes([0x6A, 4, 0xC0, 0x7F, 0x80, 0x3F])), [2], widen=True),  # half_val
        seed(typed(1, [2], bytes([0x2D, 0, 0, 0x80, 0x3F] * 3)), [2]),  # three float_val for two
    ]
    return seeds


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus")
    targets = ("scan", "decode_example", "decode_sequence", "inspect", "encode", "pool", "tensor", "jpeg")
    seeds: dict[str, list[bytes]] = {t: [] for t in targets}
    streams, example_payloads, sequence_payloads = [], [], []
    for batch, rtype, spec in batches():
        enc = codec.encode(batch, rtype)
        data = bytes(enc.data)
        streams.append(data)
        offs = list(enc.offsets) + [len(data)]
        payloads = [data[a + 12:b - 4] for a, b in zip(offs, offs[1:])]
        target = "decode_example" if rtype == "Example" else "decode_sequence"
        seeds[target].append(spec_bytes(spec[:7]) + records_bytes(payloads))
        (example_payloads if rtype == "Example" else sequence_payloads).append(payloads)
        seeds["inspect"].append(bytes([rtype == "SequenceExample"]) + records_bytes(payloads))
    tf_ex, tf_seq, tf_file = tf_payloads()
    if tf_ex:
        ex_spec = [("i", INT64, LIST, 0), ("f", FLOAT, SCALAR, 0), ("b", BYTES, FIXED, 2), ("e", NULL, LIST, 0)]
        seq_spec = [("i", INT64, SCALAR, 0), ("s", INT64, SEQ, 0), ("t", BYTES, SEQ, 0)]
        seeds["decode_example"].append(spec_bytes(ex_spec) + records_bytes(tf_ex))
        seeds["decode_sequence"].append(spec_bytes(seq_spec) + records_bytes(tf_seq))
        seeds["inspect"] += [b"\x00" + records_bytes(tf_ex), b"\x01" + records_bytes(tf_seq)]
        streams.append(tf_file)
    for data in streams:
        for flags in (0x03, 0x07, 0x0F, 0x01, 0x05):
            seeds["scan"].append(bytes([flags]) + data)
        seeds["scan"].append(bytes([0x17, 100]) + data[5:])
    seeds["scan"].append(b"\x07" + frame_records([b"", b"a" * 300, b""]))
    rng = random.Random(11)
    for first in range(0, 256, 5):
        seeds["encode"].append(bytes([first]) + bytes(rng.randrange(256) for _ in range(rng.randrange(16, 400))))
    seeds["pool"] = _pool_seeds()
    seeds["tensor"] = _tensor_seeds()
    seeds["jpeg"] = _jpeg_seeds()
    for target, items in seeds.items():
        d = out / target
        d.mkdir(parents=True, exist_ok=True)
        for old in d.iterdir():
            if not old.name.startswith("regression-"):  # reproducers of past findings stay
                old.unlink()
        for item in items:
            (d / hashlib.sha1(item).hexdigest()).write_bytes(item)
        print(f"{target}: {len(items)} seeds, {sum(map(len, items))} bytes")


if __name__ == "__main__":
    main()
