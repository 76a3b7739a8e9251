"""The resumable feed's transforms: preprocessing in its Ray Data execution, one row out per row in,
per-row seeds that a resume reproduces, rows dropped by weight."""

import itertools

import numpy as np
import pyarrow as pa
import pytest

from ray_tfrecord._src.data.feed.splits import plan_splits
from ray_tfrecord._src.data.feed.order import SEED_COLUMN
from ray_tfrecord._src.data.feed.transforms import WEIGHT_COLUMN, TransformError
from ray_tfrecord._src.tf.resume import ResumableFeed
from tests.test_resume import ROWS, SCHEMA, _write_tf

pytestmark = pytest.mark.timeout(300)


def augment(batch: pa.Table) -> pa.Table:
    """Per-row randomness from the row's seed: the same noise for a row wherever and whenever it is fed."""
    noise = np.array([np.random.default_rng(s).random() for s in batch.column(SEED_COLUMN).to_numpy()], np.float32)
    return batch.append_column("noise", pa.array(noise))


class Scale:
    """A callable class: Ray keeps its instances on an actor pool."""

    def __init__(self, factor: float) -> None:
        self.factor = factor

    def __call__(self, batch: dict) -> dict:
        return {**batch, "scaled": batch["id"].astype(np.float32) * self.factor}


def _rows(feed: ResumableFeed, steps: int | None = None, column: str = "noise") -> list[tuple[int, float, float]]:
    out = []
    for x, ids, w in itertools.islice(feed.dataset(), steps):
        out += zip(ids.numpy().tolist(), x[column].numpy().tolist(), w.numpy().tolist(), strict=True)
    return out


def _feed(plan, world: int = 1, rank: int = 0, **kw) -> ResumableFeed:
    kw.setdefault("transform", augment)
    return ResumableFeed(plan, feature_columns=["x", "noise"], label_columns="id", batch_size=16, seed=5, rank=rank,
                         world_size=world, **kw)


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return plan_splits(_write_tf(tmp_path_factory.mktemp("tf") / "tf"), schema=SCHEMA, split_bytes=2048)


def test_a_resumed_epoch_augments_each_row_as_an_uninterrupted_one(ray_local, plan, tmp_path):
    whole = [r for r in _rows(_feed(plan)) if r[2]]
    assert sorted(i for i, _, _ in whole) == list(range(ROWS))
    noise = {i: n for i, n, _ in whole}
    assert len(set(noise.values())) > ROWS * 0.9  # each row its own draw
    # Two ranks, 3 steps, a checkpoint, then three ranks finish the epoch: each row once, same noise.
    before = [_feed(plan, 2, r) for r in range(2)]
    trained = [r for feed in before for r in _rows(feed, 3) if r[2]]
    before[0].save(str(tmp_path), 3)
    after = [_feed(plan, 3, r) for r in range(3)]
    for feed in after:
        feed.load(str(tmp_path))
        trained += [r for r in _rows(feed) if r[2]]
    assert sorted(i for i, _, _ in trained) == list(range(ROWS))
    assert {i: n for i, n, _ in trained} == noise
    # The next epoch draws again.
    feed = _feed(plan)
    _rows(feed)
    assert {i: n for i, n, w in _rows(feed) if w} != noise


@pytest.mark.slow
def test_keep_drops_rows_by_weight_and_a_class_runs_on_an_actor_pool(ray_local, plan):
    feed = ResumableFeed(plan, feature_columns=["x", "scaled"], label_columns="id", batch_size=16, seed=5, rank=0, world_size=1,
                         transform=Scale, keep=lambda b: b["id"] % 3 > 0,
                         transform_options={"batch_format": "numpy", "concurrency": 1, "num_cpus": 0.25,
                                            "fn_constructor_kwargs": {"factor": 2.0}})
    rows = _rows(feed, column="scaled")
    assert len(rows) == 304 and all(s == 2 * i for i, s, _ in rows)  # 300 rows and 4 of padding
    assert sorted(i for i, _, w in rows if w) == [i for i in range(ROWS) if i % 3]


def _fewer(batch: pa.Table) -> pa.Table:
    return batch.slice(1)


def _unweighted(batch: pa.Table) -> pa.Table:
    return batch.drop_columns([WEIGHT_COLUMN])


def _reversed(batch: pa.Table) -> pa.Table:
    return batch.take(pa.array(np.arange(batch.num_rows)[::-1]))


@pytest.mark.parametrize(("transform", "message"), [
    (_fewer, r"the transform tests\.test_resume_transforms\._fewer returned 299 rows for epoch 0, a batch of 300 "
             r"rows starting at the row of __seed__=\d+; .*drop rows with keep= \(weight 0\) instead"),
    (_unweighted, r"_unweighted dropped the column '__weight__' \(epoch 0, .*\); keep it as it came"),
    (_reversed, r"_reversed reordered or changed rows \(__seed__ differs, epoch 0, .*keep the rows in the order"),
], ids=["row_count", "weight", "order"])
def test_a_transform_that_breaks_the_rows_fails_before_the_first_batch(ray_local, plan, transform, message):
    with pytest.raises(TransformError, match=message):
        ResumableFeed(plan, feature_columns="x", label_columns="id", batch_size=16, rank=0, world_size=1,
                      transform=transform).dataset()


def test_a_checkpoint_of_another_transform_is_refused(ray_local, plan, tmp_path):
    feed = _feed(plan)
    feed.save(str(tmp_path), None)
    other = _feed(plan, transform=_reversed)
    with pytest.raises(ValueError, match=r"transform=tests\.test_resume_transforms\.augment.*this feed has .*"
                                         r"transform=tests\.test_resume_transforms\._reversed.*pass the same seed=, "
                                         r"shuffle_rows=, block_splits=, transform=, keep= and plan"):
        other.load(str(tmp_path))
