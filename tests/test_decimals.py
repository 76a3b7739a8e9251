"""Decimals: a float_list read as decimal128/decimal256, and decimals written as float_list.

The reference is Python's ``decimal`` and ``fractions`` (exact arithmetic), independent of the
vectorised code; TensorFlow parses and writes the files on the other side.
"""

from __future__ import annotations

import decimal
import io
import math
import re
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core import _decimal, codec
from ray_tfrecord._src.core.errors import DecodeError, TFRecordError
from ray_tfrecord._src.core.framing import RecordWriter, frame_records, iter_chunks

from . import reference as ref

_EXACT = decimal.Context(prec=400, rounding=decimal.ROUND_HALF_EVEN)
_F32_OVERFLOW = Fraction(2**128 - 2**103)  # IEEE rounds a value at or beyond this to infinity

SLOW_WITH_TMP_PATH = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
FLOAT32 = st.one_of(st.floats(width=32), st.sampled_from([0.5, 1.5, 2.5, -2.5, 0.125, 0.375, -0.625, 1e-45]))


@st.composite
def decimal_types(draw):
    wide = draw(st.booleans())
    precision = draw(st.integers(1, 76 if wide else 38))
    scale = draw(st.one_of(st.integers(0, 12), st.integers(-4, min(precision + 4, 76 if wide else 38))))
    return (pa.decimal256 if wide else pa.decimal128)(precision, scale)


@st.composite
def decimals_of(draw, t: pa.DataType, max_size: int = 8):
    top = 10**t.precision - 1
    unscaled = st.one_of(st.integers(-top, top), st.integers(-999, 999), st.sampled_from([top, -top]))
    drawn = draw(st.lists(unscaled, min_size=1, max_size=max_size))
    return [Decimal(u).scaleb(-t.scale, context=_EXACT) for u in drawn]


def decimal_array(ds: list[Decimal], t: pa.DataType) -> pa.Array:
    """Built from the unscaled integers' bytes (pyarrow's own conversion refuses some valid types)."""
    unscaled = [int(d.scaleb(t.scale, context=_EXACT)) for d in ds]
    data = b"".join(u.to_bytes(t.byte_width, "little", signed=True) for u in unscaled)
    return pa.Array.from_buffers(t, len(ds), [None, pa.py_buffer(data)])


def unscaled_of(arr: pa.Array) -> list[int]:
    """The unscaled integers of a decimal array, from its bytes (pyarrow's own conversion refuses
    scales beyond the type's maximum precision)."""
    w = arr.type.byte_width
    data = arr.buffers()[1].to_pybytes()
    return [int.from_bytes(data[i * w:(i + 1) * w], "little", signed=True) for i in range(len(arr))]


def read_rule(x: float, t: pa.DataType) -> Decimal | None:
    """x's exact value rounded half to even at t's scale; None when it has no t form."""
    if not math.isfinite(x):
        return None
    q = _EXACT.quantize(Decimal(x), Decimal(1).scaleb(-t.scale))
    return q if len(q.as_tuple().digits) <= t.precision else None


def nearest_float32(d: Decimal) -> np.float32:
    """The float32 nearest d (ties to even), by exact comparison of the neighbours."""
    x = Fraction(d)
    if abs(x) >= _F32_OVERFLOW:
        return np.float32(math.copysign(math.inf, x))
    c = np.float32(float(x))
    candidates = [k for k in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf)))
                  if np.isfinite(k)]
    return min(candidates, key=lambda k: (abs(Fraction(float(k)) - x), int(k.view(np.uint32)) & 1))


def written(d: Decimal, t: pa.DataType) -> tuple[np.float32, bool]:
    """What the writer must produce for d: the nearest float32, or its neighbour toward zero when
    the nearest would not read back within t's precision; and whether it is inexact."""
    f = nearest_float32(d)
    back = read_rule(float(f), t)
    if back is None:
        f = np.nextafter(f, np.float32(0))
    return f, back != d


def same_bits(a, b) -> bool:
    return np.float32(a).view(np.uint32) == np.float32(b).view(np.uint32) or (a == 0 and b == 0)


def chunk_of(batch: pa.RecordBatch, record_type="Example", **kw):
    (chunk,) = iter_chunks(io.BytesIO(bytes(codec.encode(batch, record_type, **kw).data)), path="d.tfrecord")
    return chunk


# ------------------------------------------------------------------------------------------------
# the rules, against exact arithmetic


@settings(max_examples=300, deadline=None)
@given(t=decimal_types(), values=st.lists(FLOAT32, min_size=1, max_size=8))
@example(t=pa.decimal128(10, 2), values=[0.125, 0.375, 12345.678, math.nan, -math.inf])
@example(t=pa.decimal128(3, 0), values=[999.0, 999.5, 998.5, -999.5])
@example(t=pa.decimal128(38, 38), values=[0.9999999, 1.0, 1e-45])
@example(t=pa.decimal128(38, 100), values=[1e-45, 1e-30, 0.0])
@example(t=pa.decimal128(5, -30), values=[3e34, -1e35, 1e30])
def test_read_rule_is_the_exact_value_rounded_half_to_even(t, values):
    arr, bad = _decimal.from_float32(pa.array(values, pa.float32()), t)
    want = [read_rule(float(np.float32(v)), t) for v in values]
    assert list(bad) == [w is None for w in want]
    assert [None if b else g for g, b in zip(unscaled_of(arr), bad)] == [
        None if w is None else int(w.scaleb(t.scale, context=_EXACT)) for w in want]


@settings(max_examples=300, deadline=None)
@given(case=decimal_types().flatmap(lambda t: st.tuples(st.just(t), decimals_of(t))))
@example(case=(pa.decimal128(31, 30), [Decimal("1.000000059604644775390625000001")]))  # f64 lands on the f32 midpoint
@example(case=(pa.decimal128(25, 24), [Decimal("1.000000059604644775390625")]))  # exactly the midpoint: even
@example(case=(pa.decimal128(10, 0), [Decimal("9999999999"), Decimal("-9999999999")]))
@example(case=(pa.decimal128(9, 3), [Decimal("12345.678"), Decimal("123456.78"), Decimal("0.001")]))
@example(case=(pa.decimal256(76, 0), [Decimal(10**75), Decimal(-(10**38))]))
@example(case=(pa.decimal128(5, -300), [Decimal("99999E300"), Decimal("-3E300")]))  # beyond float64 too
def test_write_rule_is_the_nearest_float32_and_exact_means_it_reads_back(case):
    t, ds = case
    values, inexact = _decimal.to_float32(decimal_array(ds, t))
    for d, got, flagged in zip(ds, values, inexact):
        want, want_inexact = written(d, t)
        assert same_bits(got, want), (d, got, want)
        assert flagged == want_inexact, d


def test_six_significant_digits_always_round_trip():
    rng = np.random.default_rng(0)
    for scale in (-3, 0, 2, 6, 20, 38):
        t = pa.decimal128(6, scale)
        unscaled = np.concatenate([rng.integers(-999_999, 1_000_000, 20_000), [999_999, -999_999, 1, 0]])
        arr = pa.array([Decimal(int(u)).scaleb(-scale) for u in unscaled], t)
        values, inexact = _decimal.to_float32(arr)
        assert not inexact.any()
        assert _decimal.from_float32(pa.array(values), t)[0].equals(arr)


def test_nulls_are_neither_converted_nor_checked():
    arr = pa.array([Decimal("0.1"), None, Decimal("12345678.9")], pa.decimal128(9, 1))
    values, inexact = _decimal.to_float32(arr)
    assert list(inexact) == [False, False, True] and values[0] == np.float32(0.1)


# ------------------------------------------------------------------------------------------------
# through the codec


def test_scalars_lists_and_fixed_size_lists_round_trip_with_nulls():
    batch = pa.record_batch({
        "price": pa.array([Decimal("19.99"), None, Decimal("-0.05")], pa.decimal128(7, 2)),
        "parts": pa.array([[Decimal("1.5")], None, [Decimal("0.1"), Decimal("-3.7")]], pa.list_(pa.decimal256(40, 1))),
        "pair": pa.array([[1, 2], [3, 4], None], pa.list_(pa.decimal128(5, 0), 2)),
        "wide": pa.array([[Decimal("2.5")], [], None], pa.large_list(pa.decimal128(3, 1))),
    })
    chunk = chunk_of(batch)
    assert codec.decode(chunk, batch.schema).equals(batch)
    assert "price" not in ref.decode_example(bytes(chunk.record(1)))  # a null cell is a missing feature
    assert ref.decode_example(bytes(chunk.record(0)))["price"] == ("float_list", [float(np.float32(19.99))])


def test_sequence_example_feature_lists_of_decimals():
    t = pa.list_(pa.list_(pa.decimal128(4, 2)))
    batch = pa.record_batch({"s": pa.array([[[Decimal("1.25")], []], None, [[Decimal("-0.50"), Decimal("9.99")]]], t)})
    assert codec.decode(chunk_of(batch, "SequenceExample"), batch.schema, "SequenceExample").equals(batch)


def test_read_refuses_values_the_precision_cannot_hold_naming_the_precision_that_does():
    payloads = [ref.encode_example({"x": ("float_list", [v])}) for v in (1.5, 123.25, 99999.5)]
    chunk = next(iter_chunks(io.BytesIO(frame_records(payloads)), path="p.tfrecord"))
    with pytest.raises(DecodeError) as e:
        codec.decode(chunk, pa.schema([("x", pa.decimal128(4, 2))]))
    assert (e.value.path, e.value.offset, e.value.column) == ("p.tfrecord", chunk.offset(1), "x")
    assert str(e.value) == (f"p.tfrecord, offset {chunk.offset(1)}, column 'x': float_list value 123.25 has 5 digits "
                            "at scale 2 (rounded half to even), more than decimal128(4, 2) holds; ask for "
                            "decimal128(5, 2) in the schema")
    # half to even at scale 0: 1.5 -> 2, 123.25 -> 123, 99999.5 -> 100000 (six digits: refused at 5)
    with pytest.raises(DecodeError, match=r"offset \d+, column 'x': float_list value 99999.5 has 6 digits"):
        codec.decode(chunk, pa.schema([("x", pa.decimal128(5, 0))]))
    assert codec.decode(chunk, pa.schema([("x", pa.decimal128(6, 0))])).column("x").to_pylist() == [
        Decimal(2), Decimal(123), Decimal(100000)]


def test_read_names_the_row_inside_lists_and_refuses_nan():
    payloads = [ref.encode_example({"l": ("float_list", [1.0, 2.0])}), ref.encode_example({}),
                ref.encode_example({"l": ("float_list", [])}),
                ref.encode_example({"l": ("float_list", [0.5, math.nan])})]
    chunk = next(iter_chunks(io.BytesIO(frame_records(payloads)), path="n.tfrecord"))
    with pytest.raises(DecodeError) as e:
        codec.decode(chunk, pa.schema([("l", pa.list_(pa.decimal128(9, 3)))]))
    assert str(e.value) == (f"n.tfrecord, offset {chunk.offset(3)}, column 'l': float_list value nan has no decimal "
                            "form; read the column as float32")
    too_wide = [ref.encode_example({"v": ("float_list", [3e38])})]
    chunk = next(iter_chunks(io.BytesIO(frame_records(too_wide)), path="w"))
    with pytest.raises(DecodeError, match=r"has 39 digits at scale 0 .*; ask for decimal256\(39, 0\) in the schema"):
        codec.decode(chunk, pa.schema([("v", pa.decimal128(38, 0))]))


def test_write_refuses_an_inexact_decimal_naming_column_row_and_both_fixes():
    t = pa.decimal128(9, 3)
    batch = pa.record_batch({"ok": pa.array([1, 2, 3]),
                             "l": pa.array([[Decimal("1.5")], [], [Decimal("12345.678"), Decimal("123456.788")]],
                                           pa.list_(t))})
    with pytest.raises(TFRecordError) as e:
        codec.encode(batch)
    back = read_rule(float(nearest_float32(Decimal("123456.788"))), t)
    assert e.value.column == "l" and str(e.value) == (
        f"column 'l': decimal value 123456.788 (row 2) has no exact float32 form, TFRecord's only float type (it "
        f"would read back as {back}); pass allow_decimal_narrowing=True to round it, or "
        "cast the column to float32")
    seq = pa.record_batch({"s": pa.array([[[Decimal("1.5")]], [[], [Decimal("0.25"), Decimal("123456.788")]]],
                                         pa.list_(pa.list_(t)))})
    with pytest.raises(TFRecordError, match=r"column 's': decimal value 123456.788 \(row 1\)"):
        codec.encode(seq, "SequenceExample")
    narrowed = codec.decode(chunk_of(batch, allow_decimal_narrowing=True), batch.schema)
    assert narrowed.column("l").to_pylist() == [[Decimal("1.500")], [], [Decimal("12345.678"), back]]


def test_narrowing_keeps_what_is_written_readable_under_the_column_type():
    big = [Decimal("9999999999"), Decimal("-9999999999"), None]
    batch = pa.record_batch({"x": pa.array(big, pa.decimal128(10, 0))})
    with pytest.raises(TFRecordError, match=r"decimal value 9999999999 \(row 0\)"):
        codec.encode(batch)
    got = codec.decode(chunk_of(batch, allow_decimal_narrowing=True), batch.schema).column("x").to_pylist()
    assert got == [Decimal(9999998976), Decimal(-9999998976), None]  # 1e10f, the nearest, needs 11 digits


def test_decimals_pass_the_type_check():
    codec.check_encodable(pa.schema([("a", pa.decimal128(38, 10)), ("b", pa.list_(pa.decimal256(76, 0)))]))


# ------------------------------------------------------------------------------------------------
# TensorFlow on the other side


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW_WITH_TMP_PATH)
@given(values=st.lists(st.floats(width=32, allow_nan=False, min_value=-2.0**66, max_value=2.0**66), min_size=1,
                       max_size=20), scale=st.integers(0, 18))
def test_tf_written_floats_read_as_decimals_equal_their_quantized_tf_values(tmp_path, values, scale):
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for v in values:
            w.write(tf.train.Example(features=tf.train.Features(feature={
                "x": tf.train.Feature(float_list=tf.train.FloatList(value=[v]))})).SerializeToString())
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    tf_floats = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([], tf.float32)})["x"].numpy()
    t = pa.decimal128(38, scale)
    with open(path, "rb") as f:
        got = pa.Table.from_batches([codec.decode(c, pa.schema([("x", t)])) for c in iter_chunks(f, path=path)])
    want = [Decimal(float(v)).quantize(Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_EVEN, context=_EXACT)
            for v in tf_floats]
    assert got.column("x").to_pylist() == want


@settings(max_examples=20, deadline=None, suppress_health_check=SLOW_WITH_TMP_PATH)
@given(st.data())
def test_our_decimals_parse_in_tf_as_their_nearest_float32(tmp_path, data):
    t = data.draw(st.sampled_from([pa.decimal128(6, 2), pa.decimal128(20, 6), pa.decimal128(38, 30),
                                   pa.decimal256(50, 10)]))
    ds = data.draw(decimals_of(t, max_size=20))
    batch = pa.record_batch({"x": pa.array(ds, t), "l": pa.array([[d, d.copy_negate()] for d in ds], pa.list_(t))})
    path = str(tmp_path / "ours.tfrecord")
    with RecordWriter(open(path, "wb"), None) as w:
        w.write(codec.encode(batch, allow_decimal_narrowing=True).data)
    serialized = [r.numpy() for r in tf.data.TFRecordDataset(path)]
    parsed = tf.io.parse_example(serialized, {"x": tf.io.FixedLenFeature([], tf.float32),
                                              "l": tf.io.FixedLenFeature([2], tf.float32)})
    for d, x, (a, b) in zip(ds, parsed["x"].numpy(), parsed["l"].numpy()):
        want, want_negated = written(d, t)[0], written(d.copy_negate(), t)[0]
        assert same_bits(x, want) and same_bits(a, want) and same_bits(b, want_negated)
    exact = [d for d in ds if not written(d, t)[1]]
    if exact:  # the exact ones are written without being asked and read back as themselves
        again = pa.record_batch({"x": pa.array(exact, t)})
        assert codec.decode(chunk_of(again), again.schema).equals(again)


# ------------------------------------------------------------------------------------------------
# Ray Data and the command line


def test_write_and_read_back_through_ray_with_the_recorded_schema(ray_local, tmp_path):
    import ray

    from ray_tfrecord import read_tfrecords, write_tfrecords

    t = pa.decimal128(12, 2)
    table = pa.table({"id": [1, 2, 3], "price": pa.array([Decimal("19.99"), None, Decimal("1234567.89")], t)})
    with pytest.raises(TFRecordError, match=r"column 'price': decimal value 1234567.89 \(row 2\)"):
        write_tfrecords(ray.data.from_arrow(table), str(tmp_path / "refused"), mode="overwrite")
    assert not (tmp_path / "refused" / "_SUCCESS").exists()
    ok = table.slice(0, 2)
    write_tfrecords(ray.data.from_arrow(ok), str(tmp_path / "d"), mode="overwrite")
    back = read_tfrecords(str(tmp_path / "d"))
    assert back.schema().base_schema.field("price").type == t
    assert sorted(back.take_all(), key=lambda r: r["id"]) == [{"id": 1, "price": Decimal("19.99")},
                                                              {"id": 2, "price": None}]
    write_tfrecords(ray.data.from_arrow(table), str(tmp_path / "n"), mode="overwrite", allow_decimal_narrowing=True)
    rows = sorted(read_tfrecords(str(tmp_path / "n")).take_all(), key=lambda r: r["id"])
    assert rows[2]["price"] == read_rule(float(np.float32(1234567.89)), t) == Decimal("1234567.88")


def test_cli_convert_names_the_flag(ray_local, tmp_path, capsys):
    from ray_tfrecord._src.cli import main

    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"amount": pa.array([Decimal("0.10"), Decimal("1234567.89")], pa.decimal128(9, 2))}), src)
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    # The row counts within the write task's block: Ray 2.50 gives each row a block of its own.
    assert re.search(r"column 'amount': decimal value 1234567\.89 \(row [01]\)", err), err
    assert "pass --allow-decimal-narrowing to round" in err
    assert main(["convert", str(src), str(tmp_path / "out"), "--allow-decimal-narrowing"]) == 0
