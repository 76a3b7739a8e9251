"""The framework-free resumable feed (``ray_tfrecord.ResumableFeed``): NumPy and Arrow batches of what
TensorFlow parses, positions as plain data, exactly once across a restart at another group size, and
checkpoints that the ``tf.data`` adapter reads back. Its Ray Train run with a lost worker:
tests/test_feed_numpy_train.py."""

import collections
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
import tensorflow as tf

import ray_tfrecord
from ray_tfrecord import WEIGHT_COLUMN, ResumableFeed, plan_splits
from ray_tfrecord.tf import ResumableFeed as TFResumableFeed

pytestmark = pytest.mark.timeout(300)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = 240
SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.list_(pa.float32(), 2)), ("v", pa.list_(pa.int64())),
                    ("s", pa.binary()), ("odd", pa.int64())])


def _example(i: int) -> bytes:
    feature = {
        "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[i])),
        "x": tf.train.Feature(float_list=tf.train.FloatList(value=[i / 2, -i])),
        "v": tf.train.Feature(int64_list=tf.train.Int64List(value=list(range(i % 4)))),  # 0 to 3 values
        "s": tf.train.Feature(bytes_list=tf.train.BytesList(value=[f"row {i}".encode()])),
    }
    if i % 2:  # missing from the even rows: nulls
        feature["odd"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[i]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    """Three files by TensorFlow's own writer, no index sidecars, cut into splits of 2 KiB."""
    directory = tmp_path_factory.mktemp("numpy_feed")
    for f, (a, b) in enumerate([(0, 80), (80, 160), (160, ROWS)]):
        with tf.io.TFRecordWriter(str(directory / f"part-{f}.tfrecord")) as w:
            for i in range(a, b):
                w.write(_example(i))
    return plan_splits(str(directory), schema=SCHEMA, split_bytes=2048)


def _feeds(plan, world: int, **kw) -> list[ResumableFeed]:
    kw.setdefault("columns", ["id", "x"])  # not odd, whose nulls need defaults=
    return [ResumableFeed(plan, batch_size=16, seed=3, rank=r, world_size=world, **kw) for r in range(world)]


def _trained(batch) -> list[int]:
    return batch["id"][batch[WEIGHT_COLUMN] > 0].tolist()


def test_numpy_batches_hold_what_tensorflow_parses(ray_local, plan, tmp_path):
    """Scalars 1-D, a fixed-size list 2-D, a variable-length list an object array of 1-D arrays, bytes
    objects; against tf.io.parse_single_example of the same records. The tf.data adapter over the same
    plan and seed feeds the same rows in the same order."""
    spec = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([2], tf.float32),
            "v": tf.io.VarLenFeature(tf.int64), "s": tf.io.FixedLenFeature([], tf.string)}
    parsed = {}
    for f in range(3):
        for record in tf.data.TFRecordDataset(os.path.join(os.path.dirname(plan.splits[0].path), f"part-{f}.tfrecord")):
            example = tf.io.parse_single_example(record, spec)
            parsed[int(example["id"])] = (example["x"].numpy(), tf.sparse.to_dense(example["v"]).numpy(),
                                          example["s"].numpy())
    (feed,) = _feeds(plan, 1, columns=["id", "x", "v", "s"])
    order, seen = [], {}
    for batch in feed:
        assert sorted(batch) == ["__weight__", "id", "s", "v", "x"]
        assert batch["id"].shape == (16,) and batch["id"].dtype == np.int64
        assert batch["x"].shape == (16, 2) and batch["x"].dtype == np.float32
        assert batch["v"].dtype == object and batch["s"].dtype == object
        for i, x, v, s, w in zip(batch["id"], batch["x"], batch["v"], batch["s"], batch[WEIGHT_COLUMN], strict=True):
            order.append((int(i), float(w)))
            if w:
                assert v.dtype == np.int64 and v.ndim == 1
                seen[int(i)] = (x, v, s)
    assert sorted(seen) == sorted(parsed) == list(range(ROWS))
    for i, (x, v, s) in parsed.items():
        np.testing.assert_array_equal(seen[i][0], x)
        np.testing.assert_array_equal(seen[i][1], v)
        assert seen[i][2] == s
    adapter = TFResumableFeed(plan, feature_columns=["x", "v"], label_columns="id", batch_size=16,
                                            seed=3, rank=0, world_size=1)
    assert [(int(i), float(w)) for _, ids, ws in adapter.dataset() for i, w in zip(ids.numpy(), ws.numpy(),
                                                                                   strict=True)] == order


def test_a_restart_at_another_group_size_trains_each_row_once_from_a_state_dict(ray_local, plan):
    """2 ranks take 3 steps, then 3 ranks resume from rank 0's state_dict (through JSON), and the next
    epoch follows; then 3 ranks stop after 2 steps and 1 rank resumes. Every row of each epoch once."""
    for before, after, steps in ((2, 3, 3), (3, 1, 2)):
        trained = collections.Counter()
        first = _feeds(plan, before)
        for feed in first:
            for step, batch in enumerate(feed, 1):
                trained.update(_trained(batch))
                if step == steps:
                    break
        states = [feed.state_dict() for feed in first]
        assert all(s == states[0] for s in states)  # no gathering: every rank knows where the group is
        assert states[0] == first[0].state_dict(steps)
        state = json.loads(json.dumps(states[0]))
        resumed = _feeds(plan, after)
        assert {feed.load_state_dict(state) for feed in resumed} == {0}
        assert len({feed.steps() for feed in resumed}) == 1
        for feed in resumed:
            batches = list(feed)
            assert len(batches) == feed.steps() and {len(b["id"]) for b in batches} == {16}
            trained.update(i for b in batches for i in _trained(b))
        assert trained == collections.Counter(range(ROWS)), (before, after)
        # Every batch of the pass handed out: the state is the next epoch's start.
        assert [feed.state_dict()["position"] for feed in resumed] == [{"epoch": 1, "pieces": None}] * after
        next_epoch = collections.Counter(i for feed in resumed for b in feed for i in _trained(b))
        assert next_epoch == collections.Counter(range(ROWS))


def test_arrow_batches_and_a_checkpoint_either_feed_reads(ray_local, plan, tmp_path):
    """``batch_format="pyarrow"``: tables of ``batch_size`` rows; ``save`` writes the ``feed.json`` of
    ``ray_tfrecord.tf.ResumableFeed``, which continues from it with the same rows, and back."""
    (feed,) = _feeds(plan, 1, columns="id", batch_format="pyarrow")
    batches = iter(feed)
    head = [next(batches) for _ in range(4)]
    assert {(b.num_rows, tuple(b.column_names)) for b in head} == {(16, ("id", WEIGHT_COLUMN))}
    feed.save(str(tmp_path))
    rest = [i for b in batches for i in b["id"].to_pylist()]
    assert json.loads((tmp_path / "feed.json").read_text()) == feed.state_dict(4)
    adapter = TFResumableFeed(plan, feature_columns="x", label_columns="id", batch_size=16, seed=3,
                                            rank=0, world_size=1)
    assert adapter.load(str(tmp_path)) == 0
    assert [i for _, ids, _ in adapter.dataset() for i in ids.numpy().tolist()] == rest
    adapter.save(str(tmp_path), None)  # the end of epoch 0
    (again,) = _feeds(plan, 1)
    assert again.load(str(tmp_path)) == 1


def test_a_state_of_another_feed_and_bad_arguments_are_refused(ray_local, plan):
    (feed,) = _feeds(plan, 1)
    state = feed.state_dict()
    other = ResumableFeed(plan, batch_size=16, seed=4, block_splits=2, rank=0, world_size=1)
    with pytest.raises(ValueError) as refused:
        other.load_state_dict(state)
    assert str(refused.value) == (
        f"the state was saved by a feed of seed=3, shuffle_rows=True, block_splits=16, transform=None, keep=None "
        f"over {len(plan.splits)} splits of {ROWS} rows; this feed has seed=4, shuffle_rows=True, block_splits=2, "
        f"transform=None, keep=None over {len(plan.splits)} splits of {ROWS} rows: pass the same seed=, "
        "shuffle_rows=, block_splits=, transform=, keep= and plan, or start a new run name")
    with pytest.raises(ValueError, match=r"^columns=\['y'\] are not columns of the plan, which has \['id', 'x', 'v', "
                                         r"'s', 'odd'\]; pass some of those, or a transform= that adds them$"):
        ResumableFeed(plan, batch_size=16, columns=["id", "y"], rank=0, world_size=1)
    with pytest.raises(ValueError, match=r"^batch_format='pandas'; pass batch_format='numpy' or 'pyarrow'$"):
        ResumableFeed(plan, batch_size=16, rank=0, world_size=1, batch_format="pandas")
    # Records without the feature are nulls, which NumPy has no place for: named, with the fix.
    (nulls,) = _feeds(plan, 1, columns=["odd"])
    with pytest.raises(ValueError, match=r"^column 'odd' has \d+ null rows in this batch \(records without the "
                                         r"feature\); pass defaults=\{'odd': value\} to fill them$"):
        next(iter(nulls))
    (filled,) = _feeds(plan, 1, columns=["id", "odd"], defaults={"odd": -1})
    for batch in filled:
        np.testing.assert_array_equal(batch["odd"], np.where(batch["id"] % 2 == 1, batch["id"], -1))


def test_a_transform_runs_in_the_feed_and_a_resume_repeats_its_rows(ray_local, plan):
    """The transform sees each row's seed; a resumed epoch yields the rows and draws an uninterrupted
    one does, at another group size."""
    def noisy(batch: pa.Table) -> pa.Table:
        draws = [np.random.default_rng(s).random() for s in batch.column(ray_tfrecord.SEED_COLUMN).to_numpy()]
        return batch.append_column("noise", pa.array(draws, pa.float64()))

    def rows(feeds, stop=None):
        out = {}
        for feed in feeds:
            for step, batch in enumerate(feed, 1):
                out.update(zip(_trained(batch), batch["noise"][batch[WEIGHT_COLUMN] > 0].tolist(), strict=True))
                if step == stop:
                    break
        return out

    whole = rows(_feeds(plan, 1, columns=["id", "noise"], transform=noisy))
    first = _feeds(plan, 2, columns=["id", "noise"], transform=noisy)
    head = rows(first, stop=2)
    second = _feeds(plan, 1, columns=["id", "noise"], transform=noisy)
    second[0].load_state_dict(first[0].state_dict())
    tail = rows(second)
    assert not head.keys() & tail.keys() and {**head, **tail} == whole and len(whole) == ROWS


def test_a_plan_unpickles_and_the_feed_loads_without_tensorflow(plan, tmp_path):
    """A worker without TensorFlow (a stand-in that refuses to import) unpickles the plan (it reports
    ``ray_tfrecord.SplitPlan``) and builds the feed."""
    (tmp_path / "tensorflow.py").write_text("raise ImportError('TensorFlow was imported')\n")
    (tmp_path / "plan.pkl").write_bytes(pickle.dumps(plan))
    code = f"""
import pickle, sys
import ray_tfrecord
plan = pickle.load(open({str(tmp_path / "plan.pkl")!r}, "rb"))
feed = ray_tfrecord.ResumableFeed(plan, batch_size=16, rank=0, world_size=2)
assert type(plan) is ray_tfrecord.SplitPlan
assert repr(ray_tfrecord.ResumableFeed) == "<class 'ray_tfrecord.ResumableFeed'>"
print(feed.steps(), "tensorflow" in sys.modules)
"""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), ROOT]), "RAY_ADDRESS": "local"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == [str(-(-ROWS // 2 // 16)), "False"]
