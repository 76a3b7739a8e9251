"""The resumable feed: record-exact splits, a seeded order, and exactly once per epoch across restarts."""

import collections
import gzip
import itertools
import json
import os
import shutil
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

import ray_tfrecord
from ray_tfrecord import TFRecordError
from ray_tfrecord._src.core.index import build_index, write_index
from ray_tfrecord._src.data.feed import indexing
from ray_tfrecord._src.data.feed.order import Position, assign, epoch_pieces, mix_blocks
from ray_tfrecord._src.data.feed.splits import plan_splits, read_pieces
from ray_tfrecord._src.data.feed.passes import rebatched
from ray_tfrecord._src.data.feed.order import SEED_COLUMN
from ray_tfrecord._src.tf.resume import ResumableFeed

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
    return [ResumableFeed(plan, feature_columns="x", label_columns="id", batch_size=batch_size, seed=seed, rank=r,
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
    monkeypatch.setattr(indexing, "_scan_group", None)  # a scan would fail
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
    (feed,) = _feeds(plan, 1, shuffle_rows=False, batch_size=32)
    seen = {}
    for x, ids, w in feed.dataset():
        for i, row, weight in zip(ids.numpy(), x.numpy().tolist(), w.numpy(), strict=True):
            if weight:
                seen[int(i)] = row
    assert seen == parsed


def test_a_damaged_record_is_named_by_file_and_offset(ray_local, tmp_path):
    """A CRC mismatch found in a read task reaches the loop as the reader's own error: file, offset."""
    directory = _write_tf(tmp_path / "tf", files=1)
    plan = plan_splits(directory, schema=SCHEMA)
    path = os.path.join(directory, "part-0.tfrecord")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    with open(path, "wb") as f:
        f.write(data)
    (feed,) = _feeds(plan, 1)
    with pytest.raises(Exception, match=r"CorruptRecordError: \S+part-0.tfrecord, offset \d+: corrupted record: "
                                        r"data CRC mismatch"):
        _epoch([feed])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=8), st.integers(1, 16))
def test_read_tables_are_cut_into_fetches_of_exactly_the_fetch_rows(sizes, rows):
    """The plain read tasks' tables (any sizes, empty ones too) become fetches of ``rows`` rows but
    the last, every row once and in order, as Ray's iter_batches cut them."""
    starts = np.cumsum([0, *sizes])
    tables = [pa.table({"i": np.arange(a, a + n)}) for a, n in zip(starts, sizes, strict=False)]
    fetches = list(rebatched(tables, rows))
    assert all(t.num_rows == rows for t in fetches[:-1])
    assert not fetches or 0 < fetches[-1].num_rows <= rows
    got = [i for t in fetches for i in t.column("i").to_pylist()]
    assert got == list(range(sum(sizes)))


def test_a_file_changed_since_planning_is_named(ray_local, tmp_path):
    directory = _write_tf(tmp_path / "tf", files=1)
    plan = plan_splits(directory, schema=SCHEMA)
    with tf.io.TFRecordWriter(os.path.join(directory, "part-0.tfrecord")) as w:
        for i in range(10):
            w.write(_example(i))
    (feed,) = _feeds(plan, 1)
    # tf.data hands a generator's error on inside its own InvalidArgumentError, message kept.
    with pytest.raises(Exception, match=rf"{TFRecordError.__name__}: \S+part-0.tfrecord, offset 0: 10 records from "
                       r"here where the plan counted 300; the file changed since plan_splits ran: plan again"):
        _epoch([feed])


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_piece_of_part_of_a_block_reads_its_rows_of_the_whole(tmp_path, shuffle):
    # Part of a block (a share's edge, a resumed epoch) decodes only its records: the same rows,
    # in the same order, with the same seeds as the whole block's read gives them.
    plan = plan_splits(_write_tf(tmp_path / "tf"), schema=SCHEMA, split_bytes=2048)
    blocks = tuple(mix_blocks(len(plan.splits), 4 if shuffle else 1))
    rows = sum(plan.splits[i].rows for i in blocks[1])

    def read(lo, hi):
        (table,) = read_pieces(plan, [((1, lo, hi), 1.0)], blocks=blocks, seed=5, epoch=2, shuffle=shuffle,
                               columns=("id", "x"), weight_column="w", with_seed_column=True)
        return table

    whole = read(0, rows)
    assert sorted(whole.column("id").to_pylist()) == sorted(set(whole.column("id").to_pylist()))
    for lo, hi in ((0, 1), (3, rows - 2), (rows - 1, rows), (rows // 2, rows)):
        assert read(lo, hi).equals(whole.slice(lo, hi - lo))


# --- the feed, without Ray Train ---------------------------------------------------------------------

def test_padding_repeats_the_ranks_first_rows_with_weight_0(ray_local, tmp_path):
    # 300 rows over 30 ranks: 10 a rank, one step of 32, so the padding cycles the share twice and a bit.
    plan = plan_splits(_write_tf(tmp_path / "tf"), schema=SCHEMA, split_bytes=2048)
    for rank in (0, 29):
        feed = ResumableFeed(plan, feature_columns="x", label_columns="id", batch_size=32, seed=3, rank=rank,
                             world_size=30)
        (rows,) = _epoch([feed])
        share = [i for i, w in rows[:10]]
        assert [w for _, w in rows] == [1.0] * 10 + [0.0] * 22
        assert [i for i, _ in rows[10:]] == (share * 3)[:22]
        assert len(set(share)) == 10


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
    with pytest.raises(ValueError, match="saved by a feed of seed=3.*this feed has seed=99.*pass the same seed="):
        wrong.load(str(tmp_path))


def test_the_epoch_read_ahead_is_the_next_pass_unless_a_load_moves_the_position(ray_local, tmp_path):
    plan = plan_splits(_write_tf(tmp_path / "tf"), schema=SCHEMA, split_bytes=2048)
    fresh = _feeds(plan, 1)[0]
    epochs = [_epoch([fresh])[0] for _ in range(2)]
    feed = _feeds(plan, 1)[0]
    head = []
    for _, ids, w in itertools.islice(feed.dataset(), 4):  # the next epoch's reads start with the first fetch
        head += zip(ids.numpy().tolist(), w.numpy().tolist(), strict=True)
    feed.save(str(tmp_path), 4)
    assert _epoch([feed])[0] == epochs[1]
    assert feed.load(str(tmp_path)) == 0  # epoch 2 was read ahead: dropped
    trained = [row for row in head + _epoch([feed])[0] if row[1]]  # the padding of a resumed epoch differs
    assert trained == [row for row in epochs[0] if row[1]]


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


# --- Ray Train: a worker dies mid-epoch, the group restarts ------------------------------------------
# Each rank keeps the ids of its completed steps (weight 1 only) and writes them to its file when a
# checkpoint is reported: rows trained after the last checkpoint are lost with the worker's model,
# so they must be fed again, and only they. Rank 1 exits once at a step of epoch 1 that no checkpoint
# ends (a marker file stops the restarted rank from exiting again). It first waits out Ray Train's
# poll of the workers (every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s): a report counts once the
# controller has taken it, and a failure before that resumes from the checkpoint before, weights
# and position together, so the rows since that one are rightly fed again but were logged here.

EPOCHS, BATCH, EVERY = 2, 16, 4


def augment(batch: pa.Table) -> pa.Table:
    """Per-row randomness from the feed's row seeds: a resumed epoch must draw what an uninterrupted one does."""
    draws = [np.random.default_rng(s).random() for s in batch.column(SEED_COLUMN).to_numpy()]
    return batch.append_column("noise", pa.array(draws, pa.float32()))


def _resumable(config) -> ResumableFeed:
    return ResumableFeed(config["plan"], feature_columns=["id", "x", "noise"], label_columns="y", batch_size=BATCH, seed=11,
                         transform=augment)


def _ids_log(config, rank: int):
    def flush(pending: list, epoch: int | None = None) -> None:
        """Rows (id, noise) of ``epoch``, or (epoch, id, noise) without one."""
        rows = pending if epoch is None else [(epoch, *row) for row in pending]
        with open(os.path.join(config["log"], f"rank{rank}.txt"), "a") as f:
            f.writelines(f"{e} {i} {n!r}\n" for e, i, n in rows)
        pending.clear()

    return flush


def _die_once(config, rank: int, epoch: int, step: int) -> None:
    """Rank 1 exits at ``die_at`` of epoch ``die_epoch`` (1 by default), once; with ``node_dies``, it names
    its node in the marker and waits there for the test to remove the node."""
    marker = os.path.join(config["log"], "died")
    if (epoch, step, rank) != (config.get("die_epoch", 1), config["die_at"], 1) or os.path.exists(marker):
        return
    with open(marker, "w") as f:
        f.write(ray.get_runtime_context().get_node_id())
    time.sleep(600 if config.get("node_dies") else 8)
    os._exit(1)


class _IdModel(tf.keras.Model):
    """One Dense layer on ``x``; its train step also hands ``note`` the (id, noise) it trains on (weight > 0)."""

    def __init__(self, note) -> None:
        super().__init__()
        self.dense = tf.keras.layers.Dense(1)
        self.note = note  # a function: Keras would track a list attribute, and refuse to save it

    def call(self, inputs):
        return self.dense(inputs["x"])

    def train_step(self, data):
        x, _, w = data
        tf.py_function(lambda ids, noise, weights: self.note(list(zip(
            ids.numpy()[weights.numpy() > 0].tolist(), noise.numpy()[weights.numpy() > 0].tolist(), strict=True))),
            [x["id"], x["noise"], w], [])
        return super().train_step(data)


def _keras_loop(config):
    """One ``fit`` for the whole run, restarts included; a row's epoch is the feed's at its step."""
    import ray.train

    from ray_tfrecord._src.tf.checkpoint import ReportCheckpoint, restore

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = ray.train.get_context().get_world_rank()
    feed = _resumable(config)
    pending: list = []
    with strategy.scope():
        model = _IdModel(pending.extend)
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    flush, tagged = _ids_log(config, rank), []

    class Log(tf.keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            _die_once(config, rank, self.keras_epoch, batch + 1)

        def on_epoch_begin(self, epoch, logs=None):
            self.keras_epoch = epoch

        def on_train_batch_end(self, batch, logs=None):  # after ReportCheckpoint's report
            # The feed's epoch where this step began (known once the pass has started).
            epoch = feed.position(batch, steps_per_batch=strategy.num_replicas_in_sync).epoch
            tagged.extend((epoch, *row) for row in pending)
            pending.clear()
            if (batch + 1) % EVERY == 0:
                flush(tagged)

        def on_epoch_end(self, epoch, logs=None):
            flush(tagged)

    restore(model, feed)
    model.fit(feed.dataset(), epochs=EPOCHS, verbose=0,
              callbacks=[ReportCheckpoint(keras_file=False, every_n_steps=EVERY, feed=feed), Log()])


def _train(loop, config, tmp_path, workers: int, max_failures: int):
    from ray_tfrecord._src.tf.train import tensorflow_trainer

    return tensorflow_trainer(loop, datasets={}, num_workers=workers, cpus_per_worker=0.5, train_loop_config=config,
                              storage_path=str(tmp_path / "runs"), name="resume", max_failures=max_failures).fit()


def _logged(log_dir) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(epoch, rank): the (id, noise) of each trained row, in order."""
    rows = collections.defaultdict(list)
    for name in os.listdir(log_dir):
        if name.startswith("rank"):
            for line in open(os.path.join(log_dir, name)):
                epoch, i, noise = line.split()
                rows[int(epoch), int(name[4:-4])].append((int(i), float(noise)))
    return rows


def _trained_once_per_epoch(log_dir) -> None:
    per_epoch = collections.defaultdict(collections.Counter)
    for (epoch, _), rows in _logged(log_dir).items():
        per_epoch[epoch].update(i for i, _ in rows)
    assert os.path.exists(os.path.join(log_dir, "died"))
    assert sorted(per_epoch) == list(range(EPOCHS))
    for epoch, counts in per_epoch.items():
        assert counts == collections.Counter(range(ROWS)), (epoch, {i: n for i, n in counts.items() if n != 1})


def _uninterrupted(plan, world: int) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """What each rank trains on, in order, in a run that nothing interrupts."""
    feeds = [ResumableFeed(plan, feature_columns=["id", "x", "noise"], label_columns="y", batch_size=BATCH, seed=11,
                           transform=augment, rank=r, world_size=world) for r in range(world)]
    rows = collections.defaultdict(list)
    for epoch in range(EPOCHS):
        for rank, feed in enumerate(feeds):
            for x, _, w in feed.dataset():
                kept = w.numpy() > 0
                rows[epoch, rank] += zip(x["id"].numpy()[kept].tolist(), x["noise"].numpy()[kept].tolist(),
                                         strict=True)
    return rows


@pytest.mark.slow
@pytest.mark.timeout(900)
# A custom loop's resume, a node's loss and a group of another size mid-epoch: test_elastic.py (its group
# loses a node mid-epoch, then grows back).
@pytest.mark.parametrize(("loop", "die_epoch", "die_at"), [(_keras_loop, 0, 11)], ids=["one_keras_fit"])
def test_a_killed_worker_resumes_mid_epoch_and_trains_each_row_once(ray_local, tmp_path, loop, die_epoch, die_at):
    """The rows after the restart, and their augmentation, are those of an uninterrupted run; one ``fit``
    resumes inside epoch 0, so its Keras epochs then cross the feed's."""
    plan = plan_splits(_write_tf(tmp_path / "tf"), schema=SCHEMA, split_bytes=2048)
    (tmp_path / "log").mkdir()
    config = {"plan": plan, "log": str(tmp_path / "log"), "die_at": die_at, "die_epoch": die_epoch}
    _train(loop, config, tmp_path, workers=2, max_failures=1)
    _trained_once_per_epoch(tmp_path / "log")
    assert _logged(tmp_path / "log") == _uninterrupted(plan, 2)
