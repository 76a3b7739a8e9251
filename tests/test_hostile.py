"""Hostile input at the framing and codec level: each case fails with an exact, located error (or
reads as protobuf would), and nothing allocates in proportion to a length an attacker wrote.

Already covered elsewhere, so not repeated here: truncation at every offset, single flipped bytes
and the 2^60 length with a known file size (test_framing.py); compression detected from content
and not from the name, half-truncated and byte-flipped GZIP/ZLIB (test_framing.py); malformed
top-level fields, keyless and valueless map entries in Examples (test_codec.py).
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import subprocess
import sys
import textwrap
import zlib

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.errors import CorruptRecordError, DecodeError, SchemaError
from ray_tfrecord._src.core.framing import CorruptionReport, frame_records, iter_chunks, masked_crc32c, open_stream
from ray_tfrecord._src.core.schema import infer_schema

from .wire import entry, example, ints, ld, varint


def floats(*values: float) -> bytes:
    return ld(2, ld(1, struct.pack(f"<{len(values)}f", *values)))


def sequence(**feature_lists: list[bytes]) -> bytes:
    """A SequenceExample with only feature_lists; each value is a list of Feature messages."""
    return ld(2, b"".join(ld(1, ld(1, k.encode()) + ld(2, b"".join(ld(1, f) for f in fs)))
                          for k, fs in feature_lists.items()))


def header(length: int) -> bytes:
    h = struct.pack("<Q", length)
    return h + struct.pack("<I", masked_crc32c(h))


GOOD = example(entry(b"a", ints(1)))
LIST_A = pa.schema([("a", pa.list_(pa.int64()))])


def write(tmp_path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def read_file(path: str, **kw) -> list:
    """Chunks of a file read as the datasource reads it (content-detected compression, known size)."""
    stream, found = open_stream(path, pafs.LocalFileSystem())
    size = None if found else pafs.LocalFileSystem().get_file_info(path).size
    try:
        return list(iter_chunks(stream, path=path, size=size, compressed=bool(found), **kw))
    finally:
        stream.close()


def decode_file(tmp_path, payloads: list[bytes], schema: pa.Schema, record_type="Example") -> pa.Table:
    path = write(tmp_path, "data.tfrecord", frame_records(payloads))
    return pa.Table.from_batches([codec.decode(c, schema, record_type) for c in read_file(path)], schema)


def second_record_error(tmp_path, bad: bytes, schema=LIST_A, record_type="Example") -> DecodeError:
    """Decode [GOOD, bad] from a file; return the error, which must name the file and bad's offset."""
    with pytest.raises(DecodeError) as e:
        decode_file(tmp_path, [GOOD, bad], schema, record_type)
    path = str(tmp_path / "data.tfrecord")
    assert e.value.path == path and e.value.offset == 16 + len(GOOD)
    assert str(e.value).startswith(f"{path}, offset {16 + len(GOOD)}")
    return e.value


# ------------------------------------------------------------------------------------------------
# Framing: lengths


def test_length_claiming_gigabytes_mid_file_names_that_record(tmp_path):
    first = frame_records([b"ok"])
    data = first + header(3 << 30) + b"\x00" * 100 + frame_records([b"after"])
    path = write(tmp_path, "big-claim.tfrecord", data)
    with pytest.raises(CorruptRecordError) as e:
        read_file(path)
    assert str(e.value) == (f"{path}, offset {len(first)}: truncated record: length field claims 3221225472 bytes "
                            f"(+4 CRC) but only {len(data) - len(first) - 12} bytes remain")
    assert e.value.offset == len(first) and e.value.path == path
    report = CorruptionReport()
    got = [bytes(c.record(i)) for c in read_file(path, on_corrupt="skip", report=report) for i in range(len(c))]
    assert got == [b"ok", b"after"]
    assert report.count == 1 and report.samples[0][:2] == (path, len(first))


def test_length_past_end_of_file_by_one_byte(tmp_path):
    data = frame_records([b"first", b"x" * 50])[:-1]
    path = write(tmp_path, "short.tfrecord", data)
    with pytest.raises(CorruptRecordError, match=rf"^{path}, offset 21: truncated record: length field claims 50 "
                                                 r"bytes \(\+4 CRC\) but only 53 bytes remain$"):
        read_file(path)


def test_length_fitting_but_crc_trailer_missing(tmp_path):
    data = header(10) + b"y" * 10
    path = write(tmp_path, "nocrc.tfrecord", data)
    with pytest.raises(CorruptRecordError, match=rf"^{path}, offset 0: truncated record: length field claims 10 bytes"):
        read_file(path)


def test_zero_length_records_are_records(tmp_path):
    path = write(tmp_path, "empty.tfrecord", frame_records([b"", GOOD, b""]))
    chunks = read_file(path)
    assert [int(o) for c in chunks for o in c.offsets()] == [0, 16, 32 + len(GOOD)]
    batch = codec.decode(chunks[0], pa.schema([("a", pa.list_(pa.int64())), ("s", pa.int64())]))
    assert batch.to_pylist() == [{"a": None, "s": None}, {"a": [1], "s": None}, {"a": None, "s": None}]
    assert codec.decode(chunks[0], codec.BYTE_ARRAY_SCHEMA, "ByteArray").column(0).to_pylist() == [b"", GOOD, b""]
    only_empty = read_file(write(tmp_path, "only-empty.tfrecord", frame_records([b""] * 3)))
    assert infer_schema(only_empty) == pa.schema([])


# ------------------------------------------------------------------------------------------------
# Protobuf: lengths and varints


@pytest.mark.parametrize("bad,column,what,at", [
    # an entry whose key claims 5 bytes but the entry holds 2
    (ld(1, ld(1, b"\x0a\x05ab")), None, "length-delimited field overruns its parent message", 4),
    # an entry whose value claims 9 bytes but 1 is left in the entry
    (ld(1, ld(1, ld(1, b"a") + b"\x12\x09\x1a")), None, "length-delimited field overruns its parent message", 7),
    # a Feature whose int64_list claims 5 bytes, its packed values 9
    (example(entry(b"a", b"\x1a\x05\x0a\x09\x01\x02\x03")), "a",
     "length-delimited field overruns its parent message", 11),
])
def test_nested_lengths_overrunning_their_parent(tmp_path, bad, column, what, at):
    err = second_record_error(tmp_path, bad)
    assert err.column == column
    assert str(err).endswith(f"malformed record: {what} (at byte {at} of the record)")
    if column:
        assert f", column '{column}': " in str(err)


@pytest.mark.parametrize("bad,what,at", [
    (example(entry(b"a", ld(3, ld(1, b"\xff" * 11)))), "packed int64 varint runs past its list", 13),
    (example(entry(b"a", ld(3, ld(1, b"\xff" * 9 + b"\x02")))), "packed int64 varint runs past its list", 13),
    (example(entry(b"a", ld(3, b"\x08" + b"\xff" * 3))), "varint runs past its message", 11),
    (ld(1, b"\x0a" + b"\xff" * 12), "length varint runs past its message", 2),
])
def test_varints_that_never_end(tmp_path, bad, what, at):
    err = second_record_error(tmp_path, bad)
    assert str(err).endswith(f"malformed record: {what} (at byte {at} of the record)")
    assert err.column == ("a" if b"a" in bad else None)


# ------------------------------------------------------------------------------------------------
# Protobuf: wire types, nesting, keys


@pytest.mark.parametrize("bad,column,what,at", [
    (example(entry(b"a", b"\x1b")), "a", "unsupported wire type (groups or invalid)", 9),  # start group
    (example(entry(b"a", b"\x1c")), "a", "unsupported wire type (groups or invalid)", 9),  # end group
    (b"\x0e", None, "unsupported wire type (groups or invalid)", 0),
    (b"\x0f", None, "unsupported wire type (groups or invalid)", 0),
    (b"\x02\x00", None, "invalid field number", 0),
    (example(b"\x0d\x00"), None, "fixed32 field runs past its message", 2),
])
def test_invalid_wire_types_are_located_errors(tmp_path, bad, column, what, at):
    err = second_record_error(tmp_path, bad)
    assert err.column == column
    assert str(err).endswith(f"malformed record: {what} (at byte {at} of the record)")


def test_unknown_group_fields_are_refused_as_tensorflow_refuses_them(tmp_path):
    # Protobuf's own parser would skip an unknown group; TensorFlow's parse_example refuses the
    # record, and so do we: groups are a malformed record, located at the group's start tag.
    import tensorflow as tf

    group = varint(5 << 3 | 3) + varint(1 << 3 | 0) + varint(7) + varint(5 << 3 | 4)  # field 5 { 1: 7 }
    assert group == b"\x2b\x08\x07\x2c"
    bad = GOOD + group
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.parse_example(tf.constant([bad]), {"a": tf.io.VarLenFeature(tf.int64)})
    tf.io.parse_example(tf.constant([GOOD]), {"a": tf.io.VarLenFeature(tf.int64)})  # the rest is well-formed
    err = second_record_error(tmp_path, bad)
    assert err.column is None
    assert str(err).endswith(f"malformed record: unsupported wire type (groups or invalid) (at byte {len(GOOD)} "
                             "of the record)")


def test_known_fields_with_the_wrong_wire_type_are_skipped_as_unknown(tmp_path):
    # As protobuf's parsers do: a known field number with an unexpected wire type is an unknown field.
    payloads = [
        b"\x08\x01",                                           # Example.features as a varint
        example(entry(b"a", b"\x1d\x00\x00\x00\x00")),          # Feature.int64_list as fixed32: no kind
        example(ld(1, b"\x08\x05" + ld(2, ints(4)))),           # entry key as a varint: the empty name
        example(entry(b"a", ints(7)), b"\x09" + b"\x00" * 8),   # Features.feature as fixed64
    ]
    table = decode_file(tmp_path, payloads, pa.schema([("a", pa.list_(pa.int64())), ("", pa.list_(pa.int64()))]))
    assert table.to_pylist() == [{"a": None, "": None}, {"a": [], "": None}, {"a": None, "": [4]},
                                 {"a": [7], "": None}]


def test_deep_nesting_is_skipped_without_recursion(tmp_path):
    deep = b"x"
    for _ in range(5000):
        deep = ld(15, deep)
    payloads = [ld(1, deep) + GOOD, example(entry(b"a", deep)), example(entry(b"a", ints(2) + deep))]
    assert decode_file(tmp_path, payloads, LIST_A).column("a").to_pylist() == [[1], [], [2]]


def test_feature_list_entries_without_keys(tmp_path):
    keyless = ld(2, ld(1, ld(2, ld(1, ints(5)) + ld(1, ints()))))
    path = write(tmp_path, "seq.tfrecord", frame_records([keyless, sequence(s=[ints(1)])]))
    assert infer_schema(read_file(path), "SequenceExample") == pa.schema(
        [("", pa.list_(pa.list_(pa.int64()))), ("s", pa.list_(pa.list_(pa.int64())))])
    table = decode_file(tmp_path, [keyless, sequence(s=[ints(1)])], pa.schema([("", pa.list_(pa.list_(pa.int64())))]),
                        "SequenceExample")
    assert table.column("").to_pylist() == [[[5], []], None]


def test_feature_list_of_mixed_kinds(tmp_path):
    first = sequence(s=[ints(1)])
    mixed = sequence(s=[ints(1), floats(0.5)])
    schema = pa.schema([("s", pa.list_(pa.list_(pa.int64())))])
    path = write(tmp_path, "data.tfrecord", frame_records([first, mixed]))
    with pytest.raises(DecodeError) as e:
        decode_file(tmp_path, [first, mixed], schema, "SequenceExample")
    assert str(e.value) == (f"{path}, offset {16 + len(first)}, column 's': feature is float_list but the schema says "
                            "int64_list (list<item: list<item: int64>>)")
    with pytest.raises(SchemaError) as e:
        infer_schema(read_file(path), "SequenceExample")
    assert str(e.value) == (f"{path}, offset {16 + len(first)}, column 's': feature is float_list here but int64_list "
                            "in the record at offset 0; kinds never merge")


# ------------------------------------------------------------------------------------------------
# Compression


def test_gzip_header_only_is_truncated(tmp_path):
    path = write(tmp_path, "head.tfrecord", gzip.compress(frame_records([b"abc"]))[:10])
    with pytest.raises(CorruptRecordError) as e:
        read_file(path)
    assert str(e.value) == f"{path}: truncated GZIP stream (compressed byte 10)"


@pytest.mark.parametrize("compression", ["gzip", "zlib"])
def test_checksum_trailer_corrupted(tmp_path, compression):
    raw = frame_records([b"r%d" % i for i in range(100)])
    comp = bytearray(gzip.compress(raw) if compression == "gzip" else zlib.compress(raw))
    comp[-5 if compression == "gzip" else -1] ^= 0xFF  # gzip: CRC-32 (then ISIZE); zlib: Adler-32
    path = write(tmp_path, "trailer.tfrecord", bytes(comp))
    with pytest.raises(CorruptRecordError) as e:
        read_file(path)
    assert str(e.value) == (f"{path}: corrupted {compression.upper()} stream: Error -3 while decompressing data: "
                            f"incorrect data check (compressed byte {len(comp)})")


@pytest.mark.parametrize("compression,junk,what", [
    ("zlib", b"junk", "data after the end of the ZLIB stream"),
    ("gzip", b"junk", "corrupted GZIP stream: Error -3 while decompressing data: incorrect header check"),
])
def test_garbage_after_the_compressed_stream(tmp_path, compression, junk, what):
    raw = frame_records([b"one", b"two"])
    comp = (gzip.compress(raw) if compression == "gzip" else zlib.compress(raw)) + junk
    path = write(tmp_path, "tail.tfrecord", comp)
    with pytest.raises(CorruptRecordError) as e:
        read_file(path)
    assert str(e.value) == f"{path}: {what} (compressed byte {len(comp)})"


def test_compressed_stream_holding_a_truncated_record(tmp_path):
    raw = frame_records([b"one", b"two" * 10])[:-3]
    path = write(tmp_path, "inner.tfrecord", gzip.compress(raw))
    with pytest.raises(CorruptRecordError) as e:
        read_file(path)
    assert str(e.value) == (f"{path}, offset 19: truncated record: length field claims 30 bytes (+4 CRC) but only 31 "
                            "bytes remain in the decompressed stream")


# ------------------------------------------------------------------------------------------------
# Memory stays bounded: the peak RSS of a fresh interpreter around the read. The peak is the kernel's
# VmHWM, reset just before the read; ru_maxrss would not do, since a child started by vfork + exec
# inherits its parent's peak (here: pytest's) as a floor.


PEAK_RSS = textwrap.dedent("""
    import json, sys
    import pyarrow.fs as pafs
    from ray_tfrecord._src.core.errors import CorruptRecordError
    from ray_tfrecord._src.core.framing import iter_chunks, open_stream

    def status_kib(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))

    path, known_size = sys.argv[1], sys.argv[2] == "1"
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the peak to the current RSS
    before = status_kib("VmRSS")
    stream, found = open_stream(path, pafs.LocalFileSystem())
    size = pafs.LocalFileSystem().get_file_info(path).size if known_size else None
    try:
        list(iter_chunks(stream, path=path, size=size, compressed=bool(found)))
        error = None
    except CorruptRecordError as e:
        error = str(e)
    print(json.dumps({"error": error, "grew_mib": (status_kib("VmHWM") - before) / 1024}))
""")


def peak_rss_growth(path: str, known_size: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", PEAK_RSS, path, "1" if known_size else "0"], check=True,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


needs_proc = pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")


@needs_proc
@pytest.mark.parametrize("known_size,tail_mib", [(True, 64), (False, 1)])
def test_length_of_two_to_the_sixty_allocates_nothing_large(tmp_path, known_size, tail_mib):
    path = write(tmp_path, "huge-claim.tfrecord", header(1 << 60) + b"\x00" * (tail_mib << 20))
    got = peak_rss_growth(path, known_size)
    assert got["error"].startswith(f"{path}, offset 0: truncated record: length field claims 1152921504606846976 bytes")
    assert got["grew_mib"] < 24, got


@needs_proc
def test_gzip_stream_claiming_two_to_the_sixty_stays_bounded(tmp_path):
    # The stream's size is unknown, so max_record_bytes (protobuf's 2 GiB limit) rejects the claim unread.
    path = write(tmp_path, "huge-claim.gz", gzip.compress(header(1 << 60) + b"\x00" * (256 << 20), 1))
    got = peak_rss_growth(path, known_size=False)
    assert got["error"] == (f"{path}, offset 0: record length field claims 1152921504606846976 bytes, more than "
                            "max_record_bytes=2147483647 in the decompressed stream")
    assert got["grew_mib"] < 64, got


def test_list_claiming_two_to_the_sixty_bytes_inside_a_record_allocates_nothing(tmp_path):
    bad = example(entry(b"a", ld(3, b"\x0a" + varint(1 << 60))))
    err = second_record_error(tmp_path, bad)
    assert str(err).endswith("malformed record: length-delimited field overruns its parent message "
                             "(at byte 11 of the record)")
    assert err.column == "a"
