"""Datasets on object stores, against real local servers started here: S3 (moto) and GCS (fake-gcs-server).

Writes go to their final keys and commit by one manifest write (ray_tfrecord._src.data.write.commit); these tests
hold every save mode, partitions, GZIP, split reads from the manifest's indexes, ``plan_splits``, the
requests a file costs, ``gs://`` without ``filesystem=``, and writes killed (SIGKILL of the whole driver)
in their tasks and between the commit and its deletes: our readers see the old data or the new, never a
mix, and ``ray-tfrecord clean`` leaves nothing the manifest does not list.
"""

from __future__ import annotations

import itertools
import posixpath
import sys
import time

import numpy as np
import pyarrow.fs as pafs
import pytest
import ray
import ray.cloudpickle

from bench.proxy import LatencyProxy
from ray_tfrecord import read_tfrecords, write_tfrecords
from ray_tfrecord._src.cli import main as cli
from ray_tfrecord._src.core import sizes
from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.core.index import is_index_path
from ray_tfrecord._src.core.layout import LOG_PREFIX
from ray_tfrecord._src.core.manifest import read_manifest
from ray_tfrecord._src.data import compat
from ray_tfrecord._src.data.feed.splits import plan_splits
from ray_tfrecord._src.data.filesystems import EMULATOR_ENV
from ray_tfrecord._src.data.read.datasource import TFRecordDatasource
from ray_tfrecord._src.data.write.dataset_files import orphans, unlisted_files
from tests.filesystems import fake_gcs, gcs_filesystem, moto_s3, s3_filesystem
from tests.test_checkpoint_jobs import run_driver

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # local S3 and GCS servers: the full tier
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
BUCKET = "tfr"
_SERVERS = {"s3": (moto_s3, s3_filesystem, "s3://"), "gcs": (fake_gcs, gcs_filesystem, "gs://")}


class Store:
    def __init__(self, kind: str, endpoint: str):
        self.kind, self.endpoint = kind, endpoint
        self.fs = _SERVERS[kind][1](endpoint)
        self.scheme = _SERVERS[kind][2]

    def path(self, name: str) -> str:
        return f"{BUCKET}/{name}"

    def keys(self, name: str) -> list[str]:
        return sorted(i.path[len(self.path(name)) + 1:] for i in self.fs.get_file_info(
            pafs.FileSelector(self.path(name), recursive=True, allow_not_found=True)) if i.is_file)

    def ids(self, name: str) -> list[int]:
        return sorted(r["id"] for r in read_tfrecords(self.scheme + self.path(name), filesystem=self.fs).take_all())


@pytest.fixture(scope="module", params=sorted(_SERVERS))
def store(request):
    with _SERVERS[request.param][0](BUCKET) as endpoint:
        yield Store(request.param, endpoint)


def _rows(ids) -> ray.data.Dataset:
    return ray.data.from_items([{"id": i, "part": i % 3, "word": f"w{i}"} for i in ids])


def _committed_only(store: Store, name: str, *, replaced: frozenset[str] = frozenset()) -> None:
    """The dataset holds what its latest version lists, the files an overwrite ``replaced`` (kept for reads planned
    before it) and its bookkeeping, nothing else: no sidecar, no staging, no legacy manifest."""
    manifest = read_manifest(store.fs, store.path(name))
    assert manifest is not None
    listed = sorted(e.rel_path for e in manifest.entries)
    keys = [k for k in store.keys(name) if not k.startswith(LOG_PREFIX)]
    assert keys == sorted([*listed, *replaced, "_SUCCESS", "_tfrecord_schema.arrow",
                           "_tfrecord_schema.pbtxt"]), (keys, listed)


def test_every_mode_partitions_gzip_and_plan_splits(ray_local, store):
    uri = store.scheme + store.path("modes")
    result = write_tfrecords(_rows(range(60)), uri, filesystem=store.fs, partition_cols=["part"],
                             max_rows_per_file=7)
    assert store.ids("modes") == list(range(60)) and result.num_rows == 60
    # A read task opens files ahead of the one it decodes; a limit stops it part way, with those opened.
    assert len(read_tfrecords(uri, filesystem=store.fs).limit(5).take_all()) == 5
    assert not any(is_index_path(k) or "_temporary" in k for k in store.keys("modes"))
    manifest = read_manifest(store.fs, store.path("modes"))
    assert sorted(posixpath.join(store.path("modes"), e.rel_path) for e in manifest.entries) == sorted(result.files)
    assert all(e.index for e in manifest.entries) and sum(e.rows for e in manifest.entries) == 60
    _committed_only(store, "modes")

    with pytest.raises(ValueError, match="already exists"):
        write_tfrecords(_rows(range(3)), uri, filesystem=store.fs)
    assert write_tfrecords(_rows(range(3)), uri, filesystem=store.fs, mode="ignore").skipped
    write_tfrecords(_rows(range(60, 80)), uri, filesystem=store.fs, partition_cols=["part"], mode="append")
    assert store.ids("modes") == list(range(80))
    assert {r["part"] for r in read_tfrecords(uri, filesystem=store.fs).take_all()} == {0, 1, 2}
    plan = plan_splits(uri, filesystem=store.fs)
    assert sum(s.rows for s in plan.splits) == 80

    before = frozenset(e.rel_path for e in read_manifest(store.fs, store.path("modes")).entries)
    write_tfrecords(_rows(range(80, 90)), uri, filesystem=store.fs, mode="overwrite", compression="gzip")
    assert store.ids("modes") == list(range(80, 90))
    _committed_only(store, "modes")  # the replaced files went at the commit (keep_replaced_files=0, the default)
    assert sorted(read_manifest(store.fs, store.path("modes")).commit.removed) == sorted(before)
    assert all(k.endswith(".tfrecord.gz") for k in store.keys("modes") if k.startswith("part-"))
    replaced = frozenset(e.rel_path for e in read_manifest(store.fs, store.path("modes")).entries)
    write_tfrecords(_rows(range(90, 95)), uri, filesystem=store.fs, mode="overwrite", keep_replaced_files=3600)
    assert store.ids("modes") == list(range(90, 95))
    _committed_only(store, "modes", replaced=replaced)  # kept for reads planned before, read by no one new


def test_split_reads_use_the_manifest_index(ray_local, store, monkeypatch):
    rng = np.random.default_rng(4)
    payloads = [rng.bytes(int(rng.integers(1, 2000))) for _ in range(800)]
    ds = ray.data.from_items([{"record": p} for p in payloads], override_num_blocks=1)
    write_tfrecords(ds, store.scheme + store.path("big"), filesystem=store.fs, record_type="ByteArray")
    assert len([k for k in store.keys("big") if k.startswith("part-")]) == 1
    monkeypatch.setattr(sizes, "MIN_SPLIT_BYTES", 64 << 10)
    source = TFRecordDatasource(store.scheme + store.path("big"), filesystem=store.fs, record_type="ByteArray")
    tasks = source.get_read_tasks(6)
    assert len(tasks) >= 4
    assert all(t.metadata.num_rows is not None for t in tasks)  # exact boundaries: the manifest's index
    assert [r["record"] for t in tasks for b in t() for r in b.to_pylist()] == payloads

    [data] = [k for k in store.keys("big") if k.startswith("part-")]
    store.fs.delete_file(posixpath.join(store.path("big"), data))
    with pytest.raises(TFRecordError, match=r"latest version lists this file \(1 of 1 listed files are gone\): the "
                       "file is gone, and no commit still in the dataset's log removed it"):
        read_tfrecords(store.scheme + store.path("big"), filesystem=store.fs)
    [version] = [k for k in store.keys("big") if k.startswith(LOG_PREFIX)][-1:]
    with store.fs.open_output_stream(posixpath.join(store.path("big"), version)) as f:
        f.write(b'{"version": 9}')
    with pytest.raises(TFRecordError, match=r"list of committed files is unreadable \(format 9, this package reads "
                       r"\(1, 2\)\); upgrade ray_tfrecord if a newer one wrote it, else restore this object"):
        read_tfrecords(store.scheme + store.path("big"), filesystem=store.fs)


def test_at_most_six_requests_per_file(ray_local, store):
    files = 32
    with LatencyProxy(store.endpoint) as proxy:
        fs = _SERVERS[store.kind][1](proxy.endpoint)
        proxy.reset()
        result = write_tfrecords(_rows(range(files * 10)), store.scheme + store.path("requests"), filesystem=fs,
                                 max_rows_per_file=10, min_rows_per_file=10)
        counts = proxy.counts()
    assert result.num_files == files
    print(f"{store.kind}: {counts} for {files} files")
    assert sum(counts.values()) / files <= 6, counts


def test_paths_need_no_filesystem(ray_local, store, monkeypatch):
    if store.kind == "s3":
        # s3:// resolved without filesystem= since 0.1. Here a Ray worker started before the AWS_* variables
        # were set uploads with aws-chunked encoding, which moto stores undecoded (S3 itself decodes it).
        pytest.skip("s3:// paths were already resolved this way; see the comment")
    _store_env(store, monkeypatch)
    uri = store.scheme + store.path("plain")
    write_tfrecords(_rows(range(20)), uri, max_rows_per_file=5)
    assert sorted(r["id"] for r in read_tfrecords(uri).take_all()) == list(range(20))
    assert cli(["clean", uri]) == 0


def test_resumable_feed_over_gs_reads_every_row_once(ray_local, store, tmp_path, monkeypatch):
    """plan_splits and ResumableFeed on a gs:// path (no filesystem=): two ranks stopped after 3 steps, the
    position saved, three ranks resume it; the epoch trains every row once."""
    if store.kind != "gcs":
        pytest.skip("the feed over gs:// (s3:// plans and reads through the same code)")
    from ray_tfrecord.tf import ResumableFeed

    _store_env(store, monkeypatch)
    uri = store.scheme + store.path("feed")
    write_tfrecords(_rows(range(200)), uri, partition_cols=["part"], max_rows_per_file=30)
    plan = plan_splits(uri, split_bytes=512)
    assert len(plan.splits) > 7 and plan.rows == 200

    def feeds(world: int) -> list[ResumableFeed]:
        return [ResumableFeed(plan, feature_columns="part", label_columns="id", batch_size=8, seed=1, rank=r,
                              world_size=world) for r in range(world)]

    trained: list[int] = []
    before = feeds(2)
    for feed in before:
        for _, ids, w in itertools.islice(feed.dataset(), 3):
            trained += ids.numpy()[w.numpy() > 0].tolist()
    before[0].save(str(tmp_path), 3)
    for feed in feeds(3):
        assert feed.load(str(tmp_path)) == 0
        for _, ids, w in feed.dataset():
            trained += ids.numpy()[w.numpy() > 0].tolist()
    assert sorted(trained) == list(range(200))


def test_a_feed_and_random_access_planned_before_an_overwrite_name_the_commit(ray_local, store):
    """A training feed and a Grain source planned before an overwrite, reading after it (the replaced files are
    deleted at its commit): each error names the file and the commit, on GCS too, whose own error names no
    file (``google::cloud::Status(NOT_FOUND ...)``)."""
    import ray_tfrecord

    uri = store.scheme + store.path("replaced")
    write_tfrecords(_rows(range(20)), uri, filesystem=store.fs, max_rows_per_file=10)
    plan = ray_tfrecord.plan_splits(uri, filesystem=store.fs)
    source = ray_tfrecord.TFRecordSource(plan, columns=["id"])
    feed = ray_tfrecord.ResumableFeed(plan, batch_size=4, seed=1)
    write_tfrecords(_rows(range(5)), uri, filesystem=store.fs, mode="overwrite")
    named = (r"part-[^,]*\.tfrecord: this read was planned against an earlier version of the dataset; version \d+ "
             r"\(mode='overwrite' of every partition, committed .* replaced this file")
    with pytest.raises(TFRecordError, match=named):
        source[0]
    with pytest.raises(TFRecordError, match=named):
        next(iter(feed))


def test_clean_of_a_missing_path_says_so_and_a_stale_staging_directory_warns_how_to_clean(ray_local, store,
                                                                                        monkeypatch, capsys):
    _store_env(store, monkeypatch)
    uri = store.scheme + store.path("never-written")
    assert cli(["clean", uri]) == 2
    assert capsys.readouterr().err.strip() == (
        f"ray-tfrecord clean: {uri} does not exist, so there is nothing to clean; check the path")

    # A checkpointed job killed on an object store leaves its task records in _temporary/: no rows to read.
    write_tfrecords(_rows(range(10)), store.scheme + store.path("staged"), filesystem=store.fs)
    with store.fs.open_output_stream(store.path("staged/_temporary/checkpoint-k/part-00000-ab-0.files")) as f:
        f.write(b"{}")
    with pytest.warns(UserWarning, match=r"skipped the staging directory of a write_tfrecords that has not "
                                         r"finished: tfr/staged/_temporary; the dataset's manifest lists every "
                                         r"committed file, so no row is missing. Once no write to the dataset "
                                         r"runs, `ray-tfrecord clean` on its path removes"):
        assert sorted(r["id"] for r in read_tfrecords(store.scheme + store.path("staged"),
                                                        filesystem=store.fs).take_all()) == list(range(10))


# -- killed writes -------------------------------------------------------------------------


def killed_writer(kind: str, endpoint: str, name: str, point: str, marker: str) -> None:
    """A driver overwriting ``name`` with ids 1000..1299, stopped at ``point`` for the test to kill it:
    ``tasks`` (slow write tasks, files landing one by one) or ``commit`` (the manifest written, the
    deletes not begun)."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    fs = _SERVERS[kind][1](endpoint)
    if point == "commit":
        from ray_tfrecord._src.data.write.commit import log

        real = log.create_if_absent

        def write_then_halt(fs, path, data):
            created = real(fs, path, data)
            if b'"mode":"overwrite"' in data:  # the overwrite's version, not start's first one
                open(marker, "w").close()
                time.sleep(600)
            return created

        log.create_if_absent = write_then_halt

    def slow(batch):
        time.sleep(0.3)
        return batch

    ds = _rows(range(1000, 1300)).repartition(30).map_batches(slow, batch_size=None)
    write_tfrecords(ds, _SERVERS[kind][2] + f"{BUCKET}/{name}", filesystem=fs, mode="overwrite",
                    max_rows_per_file=10)


# Where each store's writer is killed: both points and both stores in two driver runs, not four. The commit
# protocol is one code path for every store; the stores differ in their filesystems' calls, which both
# points make (a task's uploads, the manifest's write and the deletes after it).
KILL_POINT = {"s3": "tasks", "gcs": "commit"}


def test_killed_overwrite_shows_old_or_new_and_clean_removes_the_rest(ray_local, store, tmp_path, monkeypatch):
    point = KILL_POINT[store.kind]
    name = f"killed-{point}"
    uri = store.scheme + store.path(name)
    write_tfrecords(_rows(range(100)), uri, filesystem=store.fs, max_rows_per_file=25)
    marker = tmp_path / "marker"

    def landed() -> bool:
        if point == "commit":
            return marker.exists()
        return any(k.startswith("part-") for k in unlisted(store, name))

    run_driver("tests.test_objectstore", "killed_writer", [store.kind, store.endpoint, name, point, str(marker)],
               kill_when=landed, what=point)
    expected = list(range(100)) if point == "tasks" else list(range(1000, 1300))
    assert store.ids(name) == expected
    left = orphans(store.fs, store.path(name))
    assert left, "the kill left nothing behind: the test did not kill the write where it meant to"

    if store.kind == "gcs":
        monkeypatch.setenv(EMULATOR_ENV, f"http://{store.endpoint}")
        # --keep-replaced 0: the old files the killed overwrite replaced go too (no read planned before runs)
        assert cli(["clean", "--dry-run", "--keep-replaced", "0", uri]) == 0
        assert orphans(store.fs, store.path(name)) == left
        assert cli(["clean", "--keep-replaced", "0", uri]) == 0
    else:
        from ray_tfrecord._src.data.write.dataset_files import remove

        remove(store.fs, left)
    assert orphans(store.fs, store.path(name)) == []
    assert store.ids(name) == expected
    write_tfrecords(_rows(range(500, 520)), uri, filesystem=store.fs, mode="overwrite", keep_replaced_files=0)
    assert store.ids(name) == list(range(500, 520))
    _committed_only(store, name)


def unlisted(store: Store, name: str) -> list[str]:
    manifest = read_manifest(store.fs, store.path(name))
    if manifest is None:
        return []
    return [posixpath.basename(p) for p in unlisted_files(store.fs, store.path(name), manifest)]



# -- a checkpointed job --------------------------------------------------------------------


def _store_env(store: Store, monkeypatch) -> None:
    """What a user's environment gives a driver started without ``filesystem=``: the store's endpoint."""
    if store.kind == "gcs":
        monkeypatch.setenv(EMULATOR_ENV, f"http://{store.endpoint}")
    else:
        for key, value in (("AWS_ENDPOINT_URL", f"http://{store.endpoint}"), ("AWS_ACCESS_KEY_ID", "testing"),
                           ("AWS_SECRET_ACCESS_KEY", "testing"), ("AWS_DEFAULT_REGION", "us-east-1")):
            monkeypatch.setenv(key, value)


@pytest.mark.skipif(not compat.CHECKPOINTS, reason=f"Ray {ray.__version__} has no job checkpointing")
def test_checkpointed_job_killed_and_rerun_writes_every_id_once(ray_local, store, tmp_path, monkeypatch):
    """Ray's job checkpointing, ``overwrite`` of an older dataset: killed with a task's files at their final
    keys and its ids still pending. Our readers still see the old dataset; the rerun (Ray's recovery deletes
    the pending task's files and its record) writes those rows again, and the commit lists every run's files."""
    from tests.test_checkpoint_jobs import job, write_source

    _store_env(store, monkeypatch)
    name = "job"
    uri = store.scheme + store.path(name)
    ids = write_source(tmp_path / "src")
    write_tfrecords(_rows(range(-20, 0)), uri, filesystem=store.fs)
    marker = tmp_path / "halted"
    args = [str(tmp_path / "src"), uri, str(tmp_path / "checkpoint")]
    options = {"mode": "overwrite", "max_rows_per_file": 300, "min_rows_per_file": 200, "num_cpus": 2,
               "keep_replaced_files": 0}
    run_driver("tests.test_checkpoint_jobs", job.__name__, [*args, {**options, "fault": "published",
                                                                    "marker": str(marker)}],
               kill_when=marker.exists, what="published")
    assert store.ids(name) == list(range(-20, 0))  # the manifest hides the killed run's files
    rerun = run_driver("tests.test_checkpoint_jobs", job.__name__, [*args, options])
    assert rerun is not None and 0 < rerun["rows"] < len(ids)  # the first run's committed tasks are not redone
    assert store.ids(name) == ids
    assert orphans(store.fs, store.path(name)) == []
    _committed_only(store, name)


def test_a_dataset_copied_from_an_object_store_to_local_disk_takes_appends(ray_local, store, tmp_path):
    """A dataset copied from a bucket to local disk brings its log; a local append commits the next version."""
    write_tfrecords(_rows(range(10)), store.scheme + store.path("copied"), filesystem=store.fs)
    (tmp_path / "copy").mkdir()
    pafs.copy_files(store.path("copied"), str(tmp_path / "copy"), source_filesystem=store.fs,
                    destination_filesystem=pafs.LocalFileSystem())
    assert any(p.name.startswith(LOG_PREFIX) for p in (tmp_path / "copy").iterdir())
    write_tfrecords(_rows(range(10, 15)), str(tmp_path / "copy"), mode="append")
    assert sorted(r["id"] for r in read_tfrecords(str(tmp_path / "copy")).take_all()) == list(range(15))
