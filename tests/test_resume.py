"""The resumable feed: record-exact splits, a seeded order, and exactly once per epoch across restarts."""

import collections
import gzip
import itertools
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import ray_tfrecord
from ray_tfrecord.core.index import build_index, write_index
from ray_tfrecord.io import splits
from ray_tfrecord.io.order import Position, assign, epoch_pieces
from ray_tfrecord.io.splits import plan_splits
from ray_tfrecord.tf.resume import ResumableFeed

pytestmark = pytest.mark.timeout(300)

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32(), 2)), ("y", pa.float32())])
ROWS = 300


def _example(i: int) -> bytes:
    x = [((i * 7919) % 100) / 100.0, ((i * 104729) % 100) / 100.0]
    return tf.train.Example(features=tf.train.Features(feature={
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
        "y": tf.train.Feature(float_list=tf.train.FloatList(value=[2 * x[0] - x[1]])),
    })).SerializeToString()


def _write_tf(directory, rows: int = ROWS, files: int = 3, compress_last: bool = False) -> str:
    """Files written by TensorFlow's own writer (no index sidecars): ids 0..rows-1."""
    os.makedirs(directory, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for f, (a, b) in enumerate(itertools.pairwise(bounds)):
        gz = compress_last and f == files - 1
        options = tf.io.TFRecordOptions(compression_type="GZIP") if gz else None
        with tf.io.TFRecordWriter(os.path.join(directory, f"part-{f}.tfrecord"), options) as w:
            for i in range(a, b):
                w.write(_example(i))
    return str(directory)


def _epoch(feeds: list[ResumableFeed], dataset=None) -> list[list[tuple[int, float]]]:
    """One pass of each rank's feed: (id, weight) per row, in order."""
    out = []
    for feed in feeds:
        rows = []
        for _, y_ids, w in feed.dataset():
            rows += zip(y_ids.numpy().tolist(), w.numpy().tolist(), strict=True)
        out.append(rows)
    return out


def _feeds(plan, world: int, seed: int = 3, batch_size: int = 16, **kw) -> list[ResumableFeed]:
    return [ResumableFeed(plan, features="x", label="id", batch_size=batch_size, seed=seed, rank=r,
                          world_size=world, **kw) for r in range(world)]


# --- the order, as arithmetic ---------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=12), st.integers(1, 5), st.integers(1, 9),
       st.integers(0, 3), st.integers(1, 5), st.data())
def test_a_restart_at_any_step_with_any_group_feeds_each_row_once(split_rows, world, batch, seed, world_after, data):
    total = sum(split_rows)
    if total == 0:
        return
    first = assign(epoch_pieces(split_rows, seed, 0), world, batch)
    lengths = {sum(hi - lo for (_, lo, hi), _ in first.pieces(r, first.shares[0])) for r in range(world)}
    assert lengths == {first.steps * batch}  # equal batches on every rank, padding included
    steps = data.draw(st.integers(0, first.steps))
    rest = Position(0).after(first, steps, batch)
    trained = collections.Counter()
    for share in first.shares:  # the rows of the completed steps, padding aside
        left = steps * batch
        for s, lo, hi in share:
            take = min(left, hi - lo)
            trained.update((s, k) for k in range(lo, lo + take))
            left -= take
    if rest.epoch == 0:
        second = assign(list(rest.pieces), world_after, batch)
        for share in second.shares:
            trained.update((s, k) for s, lo, hi in share for k in range(lo, hi))
    else:
        assert steps * batch * world >= total
    assert trained == collections.Counter((s, k) for s, n in enumerate(split_rows) for k in range(n))
    assert Position.from_json(json.loads(json.dumps(rest.to_json()))) == rest


def test_positions_outside_the_epoch_are_refused():
    a = assign([(0, 0, 10)], 2, 2)
    with pytest.raises(ValueError, match="outside this epoch's 3 steps of 2 rows"):
        Position(0).after(a, 4, 2)


# --- splits ----------------------------------------------------------------------------------------

def test_splits_are_record_exact_with_an_index_a_scan_or_a_compressed_file(ray_local, tmp_path, monkeypatch):
    unindexed = _write_tf(tmp_path / "tf", compress_last=True)
    plan = plan_splits(unindexed, schema=SCHEMA, split_bytes=2048)
    gz = [s for s in plan.splits if s.end is None]
    assert len(gz) == 1 and gz[0].path.endswith("part-2.tfrecord") and gz[0].rows == ROWS - 200
    assert len(plan.splits) > 6 and plan.rows == ROWS
    # Current sidecars give the same boundaries without a scan (written finer than the writer's
    # 256 KiB spacing, which would leave files this small whole).
    indexed = tmp_path / "indexed"
    indexed.mkdir()
    fs = pafs.LocalFileSystem()
    for name in ("part-0.tfrecord", "part-1.tfrecord"):
        shutil.copy(os.path.join(unindexed, name), indexed / name)
        write_index(fs, str(indexed / name), build_index(fs, str(indexed / name), spacing_bytes=256))
    monkeypatch.setattr(splits, "build_index", None)  # a scan would fail
    by_index = plan_splits(str(indexed), schema=SCHEMA, split_bytes=2048)
    assert [(s.start, s.end, s.rows) for s in by_index.splits] == [
        (s.start, s.end, s.rows) for s in plan.splits if s.end is not None]
    whole = str(tmp_path / "written")
    ray_tfrecord.write_tfrecords(ray_tfrecord.read_tfrecords(unindexed, schema=SCHEMA), whole)
    assert plan_splits(whole).rows == ROWS  # the schema the writer recorded
    # What the feed reads is what TensorFlow parses, row for row.
    parsed = {}
    for path in sorted(os.listdir(unindexed)):
        kind = "GZIP" if path.endswith("2.tfrecord") else ""
        for record in tf.data.TFRecordDataset(os.path.join(unindexed, path), compression_type=kind):
            example = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64),
                                                          "x": tf.io.FixedLenFeature([2], tf.float32)})
            parsed[int(example["id"])] = example["x"].numpy().tolist()
    (feed,) = _feeds(plan, 1, shuffle=False, batch_size=32)
    seen = {}
    for x, ids, w in feed.dataset():
        for i, row, weight in zip(ids.numpy(), x.numpy().tolist(), w.numpy(), strict=True):
            if weight:
                seen[int(i)] = row
    assert seen == parsed


def test_a_file_changed_since_planning_is_named(ray_local, tmp_path):
    directory = _write_tf(tmp_path / "tf", files=1)
    plan = plan_splits(directory, schema=SCHEMA)
    with tf.io.TFRecordWriter(os.path.join(directory, "part-0.tfrecord")) as w:
        for i in range(10):
            w.write(_example(i))
    (feed,) = _feeds(plan, 1)
    with pytest.raises(Exception, match="the file changed since plan_splits ran: plan again"):
        _epoch([feed])


# --- the feed, without Ray Train ---------------------------------------------------------------------

def test_the_same_seed_feeds_each_rank_the_same_rows_in_the_same_order(ray_local, tmp_path):
    plan = plan_splits(_write_tf(tmp_path / "tf"), schema=SCHEMA, split_bytes=2048)
    first, again, other = _epoch(_feeds(plan, 2, seed=3)), _epoch(_feeds(plan, 2, seed=3)), _epoch(_feeds(plan, 2, 4))
    assert first == again
    assert [ids for ids in first] != [ids for ids in other]
    for rows in (first, other):
        trained = sorted(i for rank in rows for i, w in rank if w)
        assert trained == list(range(ROWS))
        assert len(rows[0]) == len(rows[1]) == 160  # 150 rows a rank, 10 of padding, 10 steps of 16
    # A seed's later epochs differ from its first.
    feeds = _feeds(plan, 2, seed=3)
    _epoch(feeds)
    assert _epoch(feeds) != first


def test_a_saved_position_resumes_with_another_worker_count(ray_local, tmp_path):
    plan = plan_splits(_write_tf(tmp_path / "tf"), schema=SCHEMA, split_bytes=2048)
    before = _feeds(plan, 2)
    trained = []
    for feed in before:  # 4 completed steps on each rank, then the group fails
        for _, ids, w in itertools.islice(feed.dataset(), 4):
            trained += [i for i, wt in zip(ids.numpy(), w.numpy(), strict=True) if wt]
    before[0].save(str(tmp_path), 4)
    after = _feeds(plan, 3)
    assert {feed.load(str(tmp_path)) for feed in after} == {0}
    trained += [i for rank in _epoch(after) for i, w in rank if w]
    assert sorted(trained) == list(range(ROWS))
    assert {feed.position(None) for feed in after} == {Position(1)}
    wrong = _feeds(plan, 1, seed=99)[0]
    with pytest.raises(ValueError, match="saved by a feed of seed=3.*pass the same seed= and plan"):
        wrong.load(str(tmp_path))


def test_gzip_needs_no_index(ray_local, tmp_path):
    path = tmp_path / "one.tfrecord.gz"
    with tf.io.TFRecordWriter(str(path), tf.io.TFRecordOptions(compression_type="GZIP")) as w:
        for i in range(40):
            w.write(_example(i))
    assert gzip.open(path).read(1)  # really GZIP
    plan = plan_splits(str(path), schema=SCHEMA)
    assert [(s.start, s.end, s.rows) for s in plan.splits] == [(0, None, 40)]
    (rows,) = _epoch(_feeds(plan, 1, batch_size=7))
    assert sorted(i for i, w in rows if w) == list(range(40)) and len(rows) == 42
