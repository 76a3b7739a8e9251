"""codec.Encoder: the native encoder reads Arrow's layouts in place through the C data interface
(int64, float32, binary and string values; lists, large lists, fixed-size lists, lists of lists),
and must write exactly what the columns converted in Python write, errors included."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pytest

import ray_tfrecord
from ray_tfrecord._src.core import _native, codec
from ray_tfrecord._src.core._columns import Narrowing, encode_column
from ray_tfrecord._src.core._contract import RecordTypeCode
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.framing import iter_chunks
from ray_tfrecord._src.core.types import column_spec

from . import reference as ref


def table(n: int) -> pa.Table:
    rng = np.random.default_rng(5)
    lists = [None if k % 4 == 1 else rng.integers(-9, 2**40, int(rng.integers(0, 4))).tolist() for k in range(n)]
    words = [None if k % 3 == 2 else "w" * (k % 5) for k in range(n)]
    return pa.table({
        "i": pa.array([None if k % 5 == 3 else k - 7 for k in range(n)], pa.int64()),
        "f": pa.array(rng.standard_normal(n).astype(np.float32)),
        "b": pa.array([bytes([k % 256]) * (k % 3) for k in range(n)], pa.binary()),
        "s": pa.array(words, pa.string()),
        "ls": pa.array(words, pa.large_string()),
        "l": pa.array(lists, pa.list_(pa.int64())),
        "L": pa.array(lists, pa.large_list(pa.int64())),
        "fx": pa.array([None if k % 6 == 0 else [k, -k] for k in range(n)], pa.list_(pa.float32(), 2)),
        "lb": pa.array([None if w is None else [w.encode(), b"x"] for w in words], pa.list_(pa.large_binary())),
        "n": pa.array([None if k % 2 else [] for k in range(n)], pa.list_(pa.null())),
        "q": pa.array([None if k % 4 == 0 else [[k], [], [k, k]] for k in range(n)],
                      pa.large_list(pa.list_(pa.int64()))),
        "fx0": pa.array([None if k % 2 else [] for k in range(n)], pa.list_(pa.binary(), 0)),
        "i32": pa.array(range(n), pa.int32()),  # converted in Python, beside the natively read ones
    })


def python_encoded(batch: pa.RecordBatch, record_type: str) -> bytes:
    """What the encoder writes when every column is converted in Python (the path for other types)."""
    cols = [encode_column(f, batch.column(i), column_spec(f, record_type), Narrowing())
            for i, f in enumerate(batch.schema)]
    code = RecordTypeCode.SEQUENCE_EXAMPLE if record_type == "SequenceExample" else RecordTypeCode.EXAMPLE
    return bytes(_native.encode(code, batch.num_rows, cols).data)


@pytest.mark.parametrize("cut", [(0, None), (3, None), (5, 11), (7, 0)])
def test_columns_read_in_place_encode_as_converted_ones_do(cut):
    t = table(24)
    part = t.slice(cut[0], cut[1]).combine_chunks()
    batch = part.to_batches()[0] if part.num_rows else pa.RecordBatch.from_pylist([], schema=t.schema)
    encoder = codec.Encoder(t.schema, "SequenceExample")
    enc = encoder.encode(batch)
    assert bytes(enc.data) == python_encoded(batch, "SequenceExample") and len(enc) == batch.num_rows
    if batch.num_rows:
        (chunk,) = iter_chunks(io.BytesIO(bytes(enc.data)), path="m")
        assert codec.decode(chunk, t.schema, "SequenceExample").to_pylist() == batch.to_pylist()
        first = ref.decode_sequence_example(bytes(chunk.record(0)))
        assert first[0].get("i") == (None if batch.column("i")[0].as_py() is None
                                     else ("int64_list", [batch.column("i")[0].as_py()]))


def test_a_null_inside_a_list_is_refused_in_column_order():
    nulls = pa.array([[1], [2, None]], pa.list_(pa.int64()))
    with pytest.raises(TFRecordError) as e:
        codec.encode(pa.table({"v": nulls}))
    assert e.value.column == "v" and e.value.reason == (
        "null list element at element 2; TFRecord lists cannot hold nulls (a null row is written as a missing feature)")
    inner = pa.array([[[1]], [None, [2]]], pa.list_(pa.list_(pa.int64())))
    with pytest.raises(TFRecordError, match=r"^column 'q': null inner list at element 1;"):
        codec.encode(pa.table({"q": inner}), "SequenceExample")
    # a column read natively (v) before one converted in Python (d): v's error comes first, as
    # the columns are in that order; the other way round, d's does
    inexact = pa.array([0.1, 0.5])
    with pytest.raises(TFRecordError, match="^column 'v': null list element"):
        codec.encode(pa.table({"v": nulls, "d": inexact}))
    with pytest.raises(TFRecordError, match="^column 'd': float64 value 0.1"):
        codec.encode(pa.table({"d": inexact, "v": nulls}))


@pytest.mark.parametrize("leaf", [pa.int64(), pa.int32()])  # read in place / converted in Python
def test_a_null_inside_a_valid_fixed_size_list_row_is_refused(leaf):
    fixed = pa.list_(leaf, 2)
    message = ("null list element at element {}; TFRecord lists cannot hold nulls (a null row is written as a "
               "missing feature)")
    for arr, element in [(pa.array([[1, None], [3, 4]], fixed), 1),
                         (pa.array([[1, 2], [3, 4], [5, None]], fixed).slice(1), 5)]:  # elements of the whole child
        with pytest.raises(TFRecordError) as e:
            ray_tfrecord.encode(pa.table({"v": arr}))
        assert e.value.column == "v" and e.value.reason == message.format(element)
    # a null row's slots are not written, so what they hold (a null too) does not matter
    arr = pa.FixedSizeListArray.from_arrays(pa.array([1, 2, None, 4], leaf), 2, mask=pa.array([False, True]))
    enc = ray_tfrecord.encode(pa.table({"v": arr}))
    (chunk,) = iter_chunks(io.BytesIO(bytes(enc.data)), path="m")
    assert codec.decode(chunk, pa.schema([("v", fixed)])).column("v").to_pylist() == [[1, 2], None]


def test_a_float64_column_of_nulls_only_is_encodable():
    batch = pa.record_batch({"d": pa.array([None, None], pa.float64())})
    enc = codec.encode(batch)
    (chunk,) = iter_chunks(io.BytesIO(bytes(enc.data)), path="m")
    assert ref.decode_example(bytes(chunk.record(0))) == {}


def test_encoder_threads_write_what_one_thread_does():
    from concurrent.futures import ThreadPoolExecutor

    t = table(300)
    batches = t.to_batches(max_chunksize=37)
    encoder = codec.Encoder(t.schema, "SequenceExample")
    alone = [bytes(encoder.encode(b).data) for b in batches]
    with ThreadPoolExecutor(4) as pool:
        assert [bytes(e.data) for e in pool.map(encoder.encode, batches)] == alone


@pytest.mark.parametrize("record_type", ["Example", "SequenceExample"])
def test_a_block_with_an_all_null_column_writes_the_records_one_block_does(record_type):
    # Arrow types a column that is all null within a block as `null`: its rows must still lack the
    # feature, as they do in a block where another row gives the column its type.
    import tensorflow as tf

    rows = [{"id": k, "s": None if k < 3 or k == 5 else b"v%d" % k,
             "l": None if k < 3 else [k] * (k % 3)} for k in range(8)]
    whole = pa.Table.from_pylist(rows)
    blocks = [pa.Table.from_pylist(rows[a:b]) for a, b in ((0, 3), (3, 5), (5, 6), (6, 8))]
    assert [str(b.schema.field("s").type) for b in blocks] == ["null", "binary", "null", "binary"]
    one = bytes(codec.encode(whole, record_type).data)
    assert b"".join(bytes(codec.encode(b, record_type).data) for b in blocks) == one

    (chunk,) = iter_chunks(io.BytesIO(one), path="m")
    records = [bytes(chunk.record(k)) for k in range(len(rows))]
    if record_type == "SequenceExample":
        features = [tf.train.SequenceExample.FromString(r).context.feature for r in records]
    else:
        features = [tf.train.Example.FromString(r).features.feature for r in records]
    assert [sorted(f.keys()) for f in features] == [
        ["id"] if r["l"] is None else ["id", "l"] if r["s"] is None else ["id", "l", "s"] for r in rows]
    if record_type == "Example":
        parsed = tf.io.parse_example(records, {"s": tf.io.VarLenFeature(tf.string),
                                               "l": tf.io.VarLenFeature(tf.int64)})
        assert tf.sparse.to_dense(parsed["s"], b"").numpy()[:, :1].ravel().tolist() == [
            r["s"] or b"" for r in rows]
        assert tf.sparse.to_dense(parsed["l"]).numpy().sum(axis=1).tolist() == [sum(r["l"] or []) for r in rows]


def test_check_encodable_still_refuses_a_null_typed_column():
    # A dataset's column needs a type; only a block's may be null-typed.
    with pytest.raises(ray_tfrecord.SchemaError, match="column 'x': type null has no TFRecord representation"):
        codec.check_encodable(pa.schema([("x", pa.null())]))
