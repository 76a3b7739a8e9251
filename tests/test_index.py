"""Index sidecars: format, staleness, and the split invariant (every record in
exactly one range, ranges starting on record boundaries)."""

import fnmatch
import io

import numpy as np
import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_tfrecord import CorruptRecordError
from ray_tfrecord._src.core.framing import RecordWriter, frame_records, iter_chunks
from ray_tfrecord._src.core.index import (
    IndexBuilder,
    IndexFormatError,
    RecordIndex,
    build_index,
    index_candidates,
    index_path,
    is_index_path,
    load_index,
    read_fingerprint,
    write_index,
)


def _file(tmp_path, sizes, name="f.tfrecord"):
    data = frame_records([bytes([i % 251]) * s for i, s in enumerate(sizes)])
    path = tmp_path / name
    path.write_bytes(data)
    return str(path), data


def _offsets(data):
    return np.concatenate([c.offsets() for c in iter_chunks(io.BytesIO(data), path="m")] or [[]])


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=0, max_size=80),
    spacing=st.integers(1, 20000),
    target=st.integers(1, 50000),
)
def test_split_covers_every_record_once(sizes, spacing, target):
    data = frame_records([b"x" * s for s in sizes])
    offsets = _offsets(data)
    builder = IndexBuilder(spacing)
    # Feed in uneven pieces, as a writer does batch by batch.
    for piece in np.array_split(offsets, 3):
        builder.add_records(piece)
    builder.observe_bytes(data)
    index = RecordIndex.from_bytes(builder.finish(len(data)).to_bytes(), path="m")
    assert index.num_records == len(sizes)
    assert index.matches(len(data), data[:4096], data[-4096:])

    ranges = index.split(target)
    assert ranges[0][0] == 0 and ranges[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    boundaries = set(offsets.tolist())
    for start, end, n in ranges:
        assert start in boundaries or (start == 0 and not sizes)
        assert n == sum(1 for o in offsets if start <= o < end)
    # Checkpoints are at least `spacing` apart, so the index stays small.
    assert all(np.diff(index.offsets) >= spacing)


def test_format_errors_are_detected():
    index = IndexBuilder(10).finish(0, b"", b"")
    blob = index.to_bytes()
    assert RecordIndex.from_bytes(blob, path="p").num_records == 0
    with pytest.raises(IndexFormatError, match="magic"):
        RecordIndex.from_bytes(b"XX" + blob[2:], path="p")
    with pytest.raises(IndexFormatError, match="version"):
        RecordIndex.from_bytes(blob[:6] + b"\x09\x00" + blob[8:], path="p")
    with pytest.raises(IndexFormatError, match="checksum"):
        RecordIndex.from_bytes(blob[:-1] + bytes([blob[-1] ^ 1]), path="p")
    with pytest.raises(IndexFormatError, match="truncated|expected"):
        RecordIndex.from_bytes(blob[:-3], path="p")


def test_writer_index_equals_scanned_index_and_detects_changes(tmp_path):
    fs = pafs.LocalFileSystem()
    path = str(tmp_path / "w.tfrecord")
    payloads = [bytes([i]) * (i * 37 % 900) for i in range(200)]
    builder = IndexBuilder(2048)
    with RecordWriter(fs.open_output_stream(path)) as w:
        for k in range(0, 200, 50):  # batches, as the datasink writes them
            framed = frame_records(payloads[k : k + 50])
            rel = _offsets(framed)
            builder.add_records(rel + w.bytes_written)
            builder.observe_bytes(framed)
            w.write(framed)
        size = w.bytes_written
    written = builder.finish(size)
    scanned = build_index(fs, path, spacing_bytes=2048)
    assert scanned.to_bytes() == written.to_bytes()
    assert written.num_records == 200 and len(written.offsets) > 10
    write_index(fs, path, written)
    assert is_index_path(index_path(path)) and index_path(path).endswith("/_index.w%2Etfrecord")
    assert load_index(fs, path, size, *read_fingerprint(fs, path, size)) is not None

    # Same size, different content at the end: stale.
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF
    open(path, "wb").write(bytes(data))
    assert load_index(fs, path, size, *read_fingerprint(fs, path, size)) is None
    # Appended to: stale.
    open(path, "ab").write(frame_records([b"more"]))
    new_size = size + 20
    assert load_index(fs, path, new_size, *read_fingerprint(fs, path, new_size)) is None


def test_build_index_refuses_damaged_and_skips_compressed(tmp_path):
    fs = pafs.LocalFileSystem()
    path, data = _file(tmp_path, [100] * 10)
    damaged = bytearray(data)
    damaged[116 * 4 + 20] ^= 1
    open(path, "wb").write(bytes(damaged))
    with pytest.raises(CorruptRecordError, match=f"offset {116 * 4}"):
        build_index(fs, path)
    gz = str(tmp_path / "g.gz")
    with RecordWriter(fs.open_output_stream(gz, compression=None), "gzip") as w:
        w.write(data)
    assert build_index(fs, gz) is None


@pytest.mark.parametrize("relative", ["part-0.tfrecord", "part-0.tfrecord.gz", "a=1/b=x%2Fy/part-1.tfrecord",
                                      "k=__HIVE_DEFAULT_PARTITION__/p.tfrecord"])
def test_sidecar_sits_at_the_dataset_root_where_tensorflow_globs_miss_it(relative):
    data = "s3b/ds/" + relative
    sidecar = index_path(data)
    directory, name = sidecar.rsplit("/", 1)
    assert directory == "s3b/ds" and name.startswith("_index.") and is_index_path(sidecar)
    for pattern in ("*.tfrecord*", "part-*"):
        assert not fnmatch.fnmatch(name, pattern)
    # Distinct files never share a sidecar, and readers look where writers wrote.
    assert index_path(data + "x") != sidecar
    assert index_candidates(data)[0] == sidecar and index_candidates(data)[-1].endswith("/." + data.rsplit("/", 1)[1] + ".idx")
    if "/" in relative:  # a sidecar written for a partition directory read on its own is found too
        assert index_path(data, "s3b/ds/" + relative.split("/")[0]) in index_candidates(data)
