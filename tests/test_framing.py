"""Framing: CRCs, chunked scanning, truncation and corruption, byte ranges, compression."""

from __future__ import annotations

import gzip
import io
import struct
import zlib

import google_crc32c
import numpy as np
import pyarrow.fs as pafs
import pytest
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from ray_tfrecord._src.core import _native
from ray_tfrecord._src.core._contract import Status
from ray_tfrecord._src.core.errors import CorruptRecordError
from ray_tfrecord._src.core.framing import (
    CorruptionReport,
    RecordWriter,
    detect_compression,
    frame_records,
    iter_chunks,
    masked_crc32c,
    open_stream,
)

RECORDS = st.lists(st.binary(max_size=300), max_size=30)
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def reference_masked_crc(data: bytes) -> int:
    c = google_crc32c.value(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_all(data: bytes, **kw) -> list[bytes]:
    kw.setdefault("path", "mem")
    out = []
    for chunk in iter_chunks(io.BytesIO(data), **kw):
        out.extend(bytes(chunk.record(i)) for i in range(len(chunk)))
    return out


def offsets_of(records: list[bytes]) -> list[int]:
    return list(np.cumsum([0] + [16 + len(r) for r in records])[:-1])


@SETTINGS
@given(st.binary(max_size=5000))
def test_masked_crc_matches_google_crc32c(data):
    assert masked_crc32c(data) == reference_masked_crc(data)


def test_framing_is_byte_identical_to_tensorflow(tmp_path):
    records = [b"", b"a", b"x" * 70000, bytes(range(256))]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)
    assert open(path, "rb").read() == frame_records(records)


@SETTINGS
@given(RECORDS, st.integers(1, 700))
def test_any_chunk_size_yields_every_record_once(records, chunk_bytes):
    data = frame_records(records)
    assert read_all(data, chunk_bytes=chunk_bytes) == records
    chunks = list(iter_chunks(io.BytesIO(data), path="m", chunk_bytes=chunk_bytes))
    assert [int(o) for c in chunks for o in c.offsets()] == offsets_of(records)


@SETTINGS
@given(RECORDS.filter(bool), st.data())
def test_truncation_anywhere_names_the_offset(records, data):
    full = frame_records(records)
    cut = data.draw(st.integers(0, len(full) - 1))
    starts = offsets_of(records) + [len(full)]
    if cut in starts:  # a cut on a boundary is a shorter, valid file
        assert read_all(full[:cut]) == records[: starts.index(cut)]
        return
    broken = max(s for s in starts if s < cut)
    with pytest.raises(CorruptRecordError, match=rf"mem, offset {broken}: truncated record") as e:
        read_all(full[:cut], chunk_bytes=data.draw(st.integers(1, 400)))
    assert e.value.path == "mem" and e.value.offset == broken


# An 8-byte payload followed by its data CRC passes the length-CRC test by construction: a resync
# must not take it for a record boundary until its data CRC is seen.
EIGHT_BYTE_PAYLOADS = [b""] * 5 + [b"\x00\x00", b"\x00\x00\x00", b"\x00" * 8, b""]


@SETTINGS
@given(st.lists(st.binary(min_size=0, max_size=200), min_size=1, max_size=20), st.data())
def test_one_flipped_byte_loses_exactly_that_record(records, data):
    full = bytearray(frame_records(records))
    at = data.draw(st.integers(0, len(full) - 1))
    full[at] ^= 1 << data.draw(st.integers(0, 7))
    starts = offsets_of(records)
    victim = max(i for i, s in enumerate(starts) if s <= at)
    with pytest.raises(CorruptRecordError, match=rf"offset {starts[victim]}: corrupted record"):
        read_all(bytes(full))
    report = CorruptionReport()
    got = read_all(bytes(full), on_corrupt="skip", report=report, chunk_bytes=data.draw(st.integers(16, 500)))
    assert got == records[:victim] + records[victim + 1:]
    assert report.count == 1 and report.samples[0][:2] == ("mem", starts[victim])


@pytest.mark.parametrize("chunk_bytes", [16, 17, 40, 1 << 20])
def test_skip_mode_around_eight_byte_payloads_loses_only_the_flipped_record(chunk_bytes):
    full = frame_records(EIGHT_BYTE_PAYLOADS)
    starts = offsets_of(EIGHT_BYTE_PAYLOADS)
    for at in range(len(full)):
        broken = bytearray(full)
        broken[at] ^= 1
        victim = max(i for i, s in enumerate(starts) if s <= at)
        report = CorruptionReport()
        got = read_all(bytes(broken), on_corrupt="skip", report=report, chunk_bytes=chunk_bytes, size=len(full))
        assert got == EIGHT_BYTE_PAYLOADS[:victim] + EIGHT_BYTE_PAYLOADS[victim + 1:], at
        assert report.count == 1, (at, report.samples)


@SETTINGS
@given(RECORDS, st.lists(st.integers(0, 10_000), max_size=5), st.integers(8, 300))
@example(EIGHT_BYTE_PAYLOADS, [113], 16)
@example([b"\x00" * 7 + b"\x01", b""], [5], 16)
def test_byte_ranges_with_resync_read_every_record_exactly_once(records, cuts, chunk_bytes):
    data = frame_records(records)
    bounds = sorted({0, len(data), *[c % (len(data) + 1) for c in cuts]})
    got = []
    for lo, hi in zip(bounds, bounds[1:]):
        stream = io.BytesIO(data)
        stream.seek(lo)
        for chunk in iter_chunks(stream, path="m", start=lo, end=hi, resync=lo > 0, chunk_bytes=chunk_bytes,
                                 size=len(data)):
            got.extend((int(o), bytes(chunk.record(i))) for i, o in enumerate(chunk.offsets()))
    assert got == list(zip(offsets_of(records), records))


def test_length_claiming_far_more_than_the_file_reads_nothing_more():
    header = struct.pack("<Q", 1 << 60)
    data = header + struct.pack("<I", masked_crc32c(header)) + b"x" * 100

    class Counting(io.BytesIO):
        asked = 0

        def read(self, n=-1):
            Counting.asked += n if n > 0 else 0
            return super().read(n)

        def readinto(self, view):
            Counting.asked += len(view)
            return super().readinto(view)

    with pytest.raises(CorruptRecordError, match=r"offset 0: truncated record: length field claims 1152921504606846976"):
        list(iter_chunks(Counting(data), path="m", size=len(data), chunk_bytes=64))
    assert 0 < Counting.asked < 1 << 20


@pytest.mark.parametrize("readable", ["readinto", "read only"])
def test_length_claim_on_a_stream_of_unknown_size_allocates_only_what_arrives(readable):
    # A compressed stream's size is unknown, so a claimed length cannot be refused up front: the
    # buffer must still grow with the bytes that arrive, not to the 1 GiB the header claims.
    import tracemalloc

    header = struct.pack("<Q", 1 << 30)
    data = header + struct.pack("<I", masked_crc32c(header)) + b"x" * 100_000

    class ReadOnly:
        def __init__(self, raw: bytes) -> None:
            self._raw = io.BytesIO(raw)

        def read(self, n=-1):
            return self._raw.read(n)

    stream = io.BytesIO(data) if readable == "readinto" else ReadOnly(data)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match=r"offset 0: truncated record: length field claims 1073741824"):
            list(iter_chunks(stream, path="m", chunk_bytes=64))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("past", [0, 1, 16, 1000])
@pytest.mark.parametrize("resync", [False, True])
def test_start_at_or_past_the_end_yields_nothing(tmp_path, past, resync):
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        for r in (b"", b"a", b"bc"):
            w.write(r)
    size = len(open(path, "rb").read())
    with open(path, "rb") as f:
        f.seek(size + past)
        assert list(iter_chunks(f, path=path, start=size + past, size=size, resync=resync)) == []


def test_scan_reports_every_defect_kind():
    good = frame_records([b"abc"])
    (short,) = _native.scan(good[:5], final=True).errors
    assert (short.status, short.offset, short.length, short.available) == (Status.TRUNCATED_HEADER, 0, 0, 5)
    bad_len = bytearray(good)
    bad_len[9] ^= 1
    first = _native.scan(bytes(bad_len)).errors[0]
    assert (first.status, first.offset) == (Status.BAD_LENGTH_CRC, 0)
    bad_data = bytearray(good)
    bad_data[13] ^= 1
    first = _native.scan(bytes(bad_data)).errors[0]
    assert (first.status, first.offset) == (Status.BAD_DATA_CRC, 0)
    assert _native.scan(bytes(bad_data), verify=False).consumed == len(good)


@pytest.mark.parametrize("compression,name", [("gzip", "a.tfrecord"), ("zlib", "b.tfrecord.gz"), (None, "c.gz")])
def test_compression_is_detected_from_content_not_name(tmp_path, compression, name):
    records = [b"r%d" % i * (i + 1) for i in range(200)]
    path = str(tmp_path / name)
    with RecordWriter(open(path, "wb"), compression) as w:
        w.write(frame_records(records))
    stream, found = open_stream(path, pafs.LocalFileSystem())
    assert found == compression
    assert [bytes(c.record(i)) for c in iter_chunks(stream, path=path, chunk_bytes=100) for i in range(len(c))] == records
    ds = tf.data.TFRecordDataset(path, compression_type=(compression or "").upper())
    assert [t.numpy() for t in ds] == records


def test_plain_file_whose_length_bytes_look_like_zlib_stays_plain():
    record = b"x" * 0x9C78  # length bytes 78 9c: a valid ZLIB header
    data = frame_records([record])
    assert data[:2] == b"\x78\x9c" and detect_compression(data[:16]) is None


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_truncated_and_corrupted_compressed_streams(tmp_path, compression):
    raw = frame_records([bytes([i]) * 5000 for i in range(50)])
    comp = gzip.compress(raw) if compression == "gzip" else zlib.compress(raw)
    fs = pafs.LocalFileSystem()
    cut = tmp_path / "cut"
    cut.write_bytes(comp[: len(comp) // 2])
    with pytest.raises(CorruptRecordError, match=rf"{cut}.*truncated {compression.upper()} stream"):
        list(iter_chunks(open_stream(str(cut), fs)[0], path=str(cut)))
    flipped = bytearray(comp)
    flipped[len(comp) // 2] ^= 0xFF
    bad = tmp_path / "bad"
    bad.write_bytes(bytes(flipped))
    with pytest.raises(CorruptRecordError, match=rf"{bad}"):
        list(iter_chunks(open_stream(str(bad), fs)[0], path=str(bad)))


def test_explicit_compression_override_on_plain_file_fails_clearly(tmp_path):
    path = tmp_path / "plain.tfrecord"
    path.write_bytes(frame_records([b"abc"]))
    with pytest.raises(CorruptRecordError, match="corrupted GZIP stream"):
        list(iter_chunks(open_stream(str(path), pafs.LocalFileSystem(), "gzip")[0], path=str(path)))


def test_decompression_never_inflates_more_than_asked(tmp_path):
    bomb = tmp_path / "bomb"
    bomb.write_bytes(gzip.compress(b"\x00" * (64 << 20)))
    stream, _ = open_stream(str(bomb), pafs.LocalFileSystem())
    assert len(stream.read(1000)) == 1000


def test_concatenated_gzip_members_read_as_one_stream(tmp_path):
    a, b = frame_records([b"one"]), frame_records([b"two", b"three"])
    path = tmp_path / "multi.gz"
    path.write_bytes(gzip.compress(a) + gzip.compress(b))
    stream, found = open_stream(str(path), pafs.LocalFileSystem())
    assert found == "gzip"
    assert [bytes(c.record(i)) for c in iter_chunks(stream, path=str(path)) for i in range(len(c))] == [
        b"one", b"two", b"three"]
