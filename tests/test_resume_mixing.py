"""The resumable feed's batches mix a dataset sorted by files, and its partition columns are fed."""

import os
import statistics

import numpy as np
import pyarrow as pa
import pytest
import ray

import ray_tfrecord
from ray_tfrecord._src.data.feed.order import mix_blocks, row_seeds
from ray_tfrecord._src.data.feed.splits import plan_splits
from ray_tfrecord._src.tf.resume import ResumableFeed

pytestmark = pytest.mark.timeout(300)

ROWS, LABELS, BATCH = 10_000, 10, 256


@pytest.fixture(scope="module")
def by_label(ray_local, tmp_path_factory):
    """``write_tfrecords(partition_cols=["label"])``: one directory per label, so file order is label order."""
    ids = np.arange(ROWS)
    table = pa.table({"id": ids, "label": ids % LABELS,
                      "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(ids, 8).astype(np.float32)), 8)})
    path = str(tmp_path_factory.mktemp("mix") / "by_label")
    ray_tfrecord.write_tfrecords(ray.data.from_arrow(table), path, partition_cols=["label"])
    for name in os.listdir(path):  # the writer's index is too coarse to cut 75 KB files: scan them
        if name.startswith("_index."):
            os.remove(os.path.join(path, name))
    return plan_splits(path, split_bytes=16 << 10)


def _labels_per_batch(plan, mix: int) -> list[int]:
    feeds = [ResumableFeed(plan, feature_columns="id", label_columns="label", batch_size=BATCH, seed=1, block_splits=mix, rank=r,
                           world_size=2) for r in range(2)]
    counts = []
    for feed in feeds:
        for ids, labels, w in feed.dataset():
            labels = labels.numpy()[w.numpy() > 0]
            assert (labels == ids.numpy()[w.numpy() > 0] % LABELS).all()  # each row's own partition value
            counts.append(len(set(labels.tolist())))
    return counts


def test_batches_of_a_dataset_partitioned_by_label_hold_nearly_every_label(by_label):
    assert len(by_label.splits) >= 3 * LABELS and by_label.partition_schema.names == ["label"]
    mixed = _labels_per_batch(by_label, mix=16)
    assert statistics.median(mixed) >= 9, mixed
    alone = _labels_per_batch(by_label, mix=1)  # a split's rows only: a label or two a batch
    assert statistics.median(alone) <= 2, alone


def test_partition_columns_and_paths_are_fed(by_label):
    (feed,) = [ResumableFeed(by_label, feature_columns=["id", "path"], label_columns="label", batch_size=BATCH, include_paths=True,
                             rank=0, world_size=1)]
    seen = 0
    for x, labels, w in feed.dataset():
        for path, label in zip(x["path"].numpy().tolist(), labels.numpy().tolist(), strict=True):
            assert f"/label={label}/" in path.decode()
        seen += int(w.numpy().sum())
    assert seen == ROWS
    with pytest.raises(ValueError, match=r"columns \['path'\] are not in the dataset"):
        ResumableFeed(by_label, feature_columns=["id", "path"], label_columns="label", batch_size=BATCH, rank=0, world_size=1)


@pytest.mark.parametrize(("splits", "mix"), [(1, 16), (10, 16), (37, 4), (40, 1)])
def test_blocks_take_every_split_once_at_a_stride(splits, mix):
    blocks = mix_blocks(splits, mix)
    assert sorted(s for b in blocks for s in b) == list(range(splits))
    assert max(len(b) for b in blocks) <= mix and len(blocks) == -(-splits // mix)
    assert all(b == tuple(range(b[0], splits, len(blocks))) for b in blocks)  # spread over the file order


def test_row_seeds_depend_on_the_row_alone():
    split, row = np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1])
    seeds = row_seeds(3, 0, split, row)
    assert seeds.dtype == np.uint64 and len(set(seeds.tolist())) == 4
    assert (row_seeds(3, 0, split[::-1], row[::-1]) == seeds[::-1]).all()  # per row, not per position
    assert not (row_seeds(3, 1, split, row) == seeds).any() and not (row_seeds(4, 0, split, row) == seeds).any()
