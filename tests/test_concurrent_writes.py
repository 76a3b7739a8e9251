"""Many writers, one dataset (issue 50): processes that run the commit protocol at the same instant (a barrier
releases them together), on local disk, S3 (moto) and GCS (fake-gcs-server), repeated. Every append's files
are in the dataset exactly once; an overwrite racing an append ends as one order of the two would; two
partition backfills of different days both land; a reader polling the dataset while overwrites commit
never sees an error or a mix; a read planned before an overwrite whose files then expired is told which
commit replaced them, and its ``count()`` still answers from the manifest; a ``mode="error"`` write that loses
to another gets a ``ConflictError`` naming it; driver processes sharing one Ray append through
``write_tfrecords`` at once, on every store.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import posixpath
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from ray_tfrecord import ConflictError, TFRecordError
from ray_tfrecord._src.core.manifest import explain_missing, read_manifest
from ray_tfrecord._src.core.schema import read_stored_schema, stored_schema
from ray_tfrecord._src.data.write.commit import Commit, StagedFile
from tests.filesystems import fake_gcs, gcs_filesystem, moto_s3, s3_filesystem

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
BUCKET = "race"
_SPAWN = multiprocessing.get_context("spawn")  # a fresh interpreter each: no pyarrow state forked
_SERVERS = {"s3": (moto_s3, s3_filesystem), "gcs": (fake_gcs, gcs_filesystem)}
_REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module", params=["local", "s3", "gcs"])
def store(request, tmp_path_factory):
    if request.param == "local":
        yield ("local", str(tmp_path_factory.mktemp("race")))
        return
    start, _ = _SERVERS[request.param]
    with start(BUCKET) as endpoint:
        yield (request.param, endpoint)


def _fs(store) -> pafs.FileSystem:
    kind, where = store
    return pafs.LocalFileSystem() if kind == "local" else _SERVERS[kind][1](where)


def _root(store, name: str) -> str:
    kind, where = store
    return os.path.join(where, name) if kind == "local" else f"{BUCKET}/{name}"


def _write(store, name: str, mode: str, files: list[str], barrier=None, columns: dict[str, str] | None = None,
           **options) -> dict:
    """One writer: a commit of ``files`` (relative paths, one record each), released by ``barrier`` to commit;
    ``columns``: the record schema its writers wrote (column name to pyarrow type name)."""
    fs = _fs(store)
    root = _root(store, name)
    commit = Commit(fs, root, mode, **options)
    if commit.apply_mode():
        return {"skipped": True}
    commit.start()
    staged = []
    for rel in files:
        rel = rel.format(id=commit.write_id)
        path = posixpath.join(commit.write_dir, rel)
        if not commit.object_store:
            fs.create_dir(posixpath.dirname(path), recursive=True)
        with fs.open_output_stream(path, compression=None) as out:
            out.write(b"x")
        staged.append(StagedFile(rel, rows=1, size=1, has_index=False, in_place=commit.direct))
    if barrier is not None:
        barrier.wait(timeout=60)
    schemas = [] if columns is None else [stored_schema([pa.field(c, pa.type_for_alias(t)) for c, t in columns.items()],
                                                        "Example")]
    try:
        result = commit.finish(staged, schemas)
    except ConflictError as e:
        return {"conflict": str(e), "other": None if e.other is None else e.other.version,
                "files": [f.rel_path for f in staged], "lost": True}
    return {"files": [f.rel_path for f in staged], "version": result.version, "retries": result.retries}


def _race(store, name: str, writers: list[tuple[str, list[str], dict]]) -> list[dict]:
    """Run the writers in processes of their own, all committing at once; their results, in order."""
    with _SPAWN.Manager() as manager, _SPAWN.Pool(len(writers)) as pool:
        barrier = manager.Barrier(len(writers))
        pending = [pool.apply_async(_write, (store, name, mode, files, barrier), options)
                   for mode, files, options in writers]
        return [p.get(timeout=120) for p in pending]


def _listed(store, name: str) -> list[str]:
    version = read_manifest(_fs(store), _root(store, name))
    assert version is not None
    return sorted(e.rel_path for e in version.entries)


@pytest.mark.parametrize("writers", [2, 4])
def test_concurrent_appends_keep_every_file_exactly_once(store, writers):
    for run in range(3):
        name = f"appends-{writers}-{run}"
        _write(store, name, "error", ["base/part-{id}-0.tfrecord"])
        results = _race(store, name, [("append", [f"w{w}/part-{{id}}-{k}.tfrecord" for k in range(3)], {})
                                      for w in range(writers)])
        expected = sorted([*_listed_base(store, name), *(f for r in results for f in r["files"])])
        assert _listed(store, name) == expected
        assert len(expected) == 1 + 3 * writers
        # Each commit took its own version: the base's two (first and its files), then one per writer.
        assert sorted(r["version"] for r in results) == list(range(3, 3 + writers))


def _listed_base(store, name: str) -> list[str]:
    return [p for p in _listed(store, name) if p.startswith("base/")]


def test_append_racing_overwrite_ends_in_a_serial_order(store):
    outcomes = set()
    for run in range(4):
        name = f"mixed-{run}"
        _write(store, name, "error", ["part-{id}-base.tfrecord"])
        appended, replaced = _race(store, name, [("append", ["a/part-{id}-0.tfrecord"], {}),
                                                 ("overwrite", ["o/part-{id}-0.tfrecord"], {})])
        listed = _listed(store, name)
        if appended["version"] > replaced["version"]:  # the overwrite, then the append
            assert listed == sorted(replaced["files"] + appended["files"])
        else:  # the append, then the overwrite, which replaced it with the rest
            assert listed == replaced["files"]
        outcomes.add(appended["version"] > replaced["version"])
        fs = _fs(store)
        for rel in listed:  # readable: every listed file is there
            assert fs.get_file_info(posixpath.join(_root(store, name), rel)).type == pafs.FileType.File
    assert outcomes  # at least one order was seen; both are serial


def test_backfills_of_different_partitions_both_land_and_of_one_partition_are_serial(store):
    name = "backfill"
    _write(store, name, "error", [f"day={d}/part-{{id}}-0.tfrecord" for d in (1, 2, 3)])
    before = _listed(store, name)
    results = _race(store, name, [("overwrite", ["day=1/part-{id}-0.tfrecord"], {"partitions_only": True}),
                                  ("overwrite", ["day=2/part-{id}-0.tfrecord"], {"partitions_only": True})])
    listed = _listed(store, name)
    kept = [p for p in before if p.startswith("day=3/")]
    assert listed == sorted([*results[0]["files"], *results[1]["files"], *kept])
    same = _race(store, name, [("overwrite", ["day=1/part-{id}-0.tfrecord"], {"partitions_only": True}),
                               ("overwrite", ["day=1/part-{id}-1.tfrecord"], {"partitions_only": True})])
    last = max(same, key=lambda r: r["version"])
    assert _listed(store, name) == sorted([*last["files"], *(p for p in listed if not p.startswith("day=1/"))])


def _schema_file(store, name: str) -> pa.Schema | None:
    """The schema in the file beside the log (what tf.data, TFX and older readers see)."""
    return read_stored_schema(_fs(store), _root(store, name), version=None)


def test_concurrent_appends_of_new_columns_keep_every_column(store):
    """Hourly producers each adding a feature at once: every column is in the dataset's schema, and the file
    beside the log ends as the latest version's, whichever writer wrote it last (a schema file written by each
    writer before its commit kept only the last one's columns, and the others' read as missing)."""
    for run in range(3):
        name = f"columns-{run}"
        _write(store, name, "error", ["base/part-{id}-0.tfrecord"], columns={"id": "int64"})
        results = _race(store, name, [("append", [f"w{w}/part-{{id}}-0.tfrecord"], {"columns": {"id": "int64",
                                                                                              f"c{w}": "float"}})
                                      for w in range(3)])
        assert not any(r.get("lost") for r in results), results
        latest = read_manifest(_fs(store), _root(store, name))
        assert latest.states_schema and latest.schema.names[0] == "id"  # new columns follow, in commit order
        assert sorted(latest.schema.names) == ["c0", "c1", "c2", "id"]
        assert latest.schema.field("id").type == pa.int64() and latest.schema.field("c1").type == pa.float32()
        assert _schema_file(store, name) == latest.schema


def test_appends_racing_with_contradicting_types_end_as_a_serial_order_would(store):
    """Two appends adding one column as two types: the first commit's type stands and the second append gets a
    ConflictError naming the column, with nothing of it visible, as a second append started after the first
    would have been refused."""
    for run in range(3):
        name = f"types-{run}"
        _write(store, name, "error", ["base/part-{id}-0.tfrecord"], columns={"id": "int64"})
        results = _race(store, name, [("append", ["i/part-{id}-0.tfrecord"], {"columns": {"x": "int64"}}),
                                      ("append", ["s/part-{id}-0.tfrecord"], {"columns": {"x": "binary"}})])
        won = [r for r in results if not r.get("lost")]
        lost = [r for r in results if r.get("lost")]
        assert len(won) == 1 and len(lost) == 1, results
        assert "column 'x': the dataset stores it as" in lost[0]["conflict"]
        assert f"version {won[0]['version']} (mode='append', committed" in lost[0]["conflict"]
        assert "nothing of this append is visible" in lost[0]["conflict"]
        assert _listed(store, name) == sorted([*_listed_base(store, name), *won[0]["files"]])
        winner_type = pa.int64() if won[0]["files"][0].startswith("i/") else pa.binary()
        assert read_manifest(_fs(store), _root(store, name)).schema.field("x").type == winner_type
        assert _schema_file(store, name).field("x").type == winner_type
        fs = _fs(store)
        for rel in lost[0]["files"]:
            assert fs.get_file_info(posixpath.join(_root(store, name), rel)).type == pafs.FileType.NotFound


def test_a_second_error_mode_write_gets_a_conflict_naming_the_first(store):
    name = "created"
    results = _race(store, name, [("error", ["part-{id}-0.tfrecord"], {}), ("error", ["part-{id}-1.tfrecord"], {})])
    won = [r for r in results if "conflict" not in r]
    lost = [r for r in results if "conflict" in r]
    assert len(won) == 1 and len(lost) == 1, results
    assert _listed(store, name) == won[0]["files"]  # nothing of the loser is listed
    assert f"another write created this dataset while this 'error' write ran: version {won[0]['version']} " \
           "(mode='error', committed" in lost[0]["conflict"]
    assert "Write again with mode='append' or mode='overwrite'" in lost[0]["conflict"]
    assert lost[0]["other"] == won[0]["version"]
    fs = _fs(store)
    for rel in lost[0]["files"]:  # the loser removed what it wrote
        assert fs.get_file_info(posixpath.join(_root(store, name), rel)).type == pafs.FileType.NotFound


def _poll(store, name: str, stop, counts) -> str | None:
    """A reader: plan against the latest version and open every file it lists, until ``stop``."""
    fs = _fs(store)
    root = _root(store, name)
    while not stop.is_set():
        version = read_manifest(fs, root)
        try:
            for e in version.entries:
                with explain_missing(fs, posixpath.join(root, e.rel_path)):
                    fs.open_input_stream(posixpath.join(root, e.rel_path)).read()
        except TFRecordError as error:
            return str(error)
        counts.append(len(version.entries))
    return None


def _until(condition, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the readers made no progress"
        time.sleep(0.01)


def test_readers_polling_during_overwrites_see_one_version(store):
    name = "polled"
    _write(store, name, "error", [f"part-{{id}}-{k}.tfrecord" for k in range(4)])
    with _SPAWN.Manager() as manager, _SPAWN.Pool(2) as pool:
        stop, counts = manager.Event(), manager.list()
        readers = [pool.apply_async(_poll, (store, name, stop, counts)) for _ in range(2)]
        _until(lambda: len(counts) >= 2)  # the readers are polling
        for n in range(6):  # overwrites of 4 or 2 files, kept for the reads planned before
            _write(store, name, "overwrite", [f"part-{{id}}-{k}.tfrecord" for k in range(4 if n % 2 else 2)],
                   keep_replaced=3600)
            _until(lambda polled=len(counts): len(counts) > polled)  # a poll at least between two commits
        stop.set()
        assert [r.get(timeout=60) for r in readers] == [None, None]
        seen = list(counts)
    assert seen and set(seen) <= {2, 4}, set(seen)  # never a mix of two versions


def test_a_read_of_files_an_overwrite_replaced_and_expired_names_that_commit(store):
    name = "expired"
    fs = _fs(store)
    root = _root(store, name)
    _write(store, name, "error", ["part-{id}-old.tfrecord"])
    planned = read_manifest(fs, root)
    _write(store, name, "overwrite", ["part-{id}-new.tfrecord"])  # the default: replaced files go at the commit
    old = posixpath.join(root, planned.entries[0].rel_path)
    with pytest.raises(TFRecordError) as caught:
        with explain_missing(fs, old):
            fs.open_input_stream(old).read()
    message = str(caught.value)
    assert message.startswith(f"{old}: this read was planned against an earlier version of the dataset; version 3 "
                              "(mode='overwrite' of every partition, committed "), message
    assert "replaced this file, and it was deleted at that commit (that write's keep_replaced_files=0); read the " \
           "dataset again, or give the writer keep_replaced_files=<seconds a read takes> where reads run while the " \
           "dataset is overwritten: replaced files then stay that long for reads already planned" in message


# -- driver processes sharing one Ray ---------------------------------------------------------------

_SCHEMES = {"local": "", "s3": "s3://", "gcs": "gs://"}


def append_driver(address: str, store, name: str, ids: list[int], ready: str, go: str, column: str) -> None:
    """A Ray job of its own on the shared cluster at ``address``: prepares its rows (``id`` and a ``column`` of
    its own, twice the id), says ``ready``, waits for ``go`` and appends them with ``write_tfrecords``."""
    import ray

    from ray_tfrecord import write_tfrecords

    ray.init(address=address, log_to_driver=False)
    ds = ray.data.from_items([{"id": i, column: 2 * i} for i in ids], override_num_blocks=2).materialize()
    open(ready, "w").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(go):  # the test creates it once every driver is ready
        assert time.monotonic() < deadline, "never released"
        time.sleep(0.005)
    result = write_tfrecords(ds, _SCHEMES[store[0]] + _root(store, name), filesystem=_fs(store), mode="append")
    print("RESULT " + json.dumps({"rows": result.num_rows, "version": result.version, "retries": result.retries}))
    ray.shutdown()


def test_driver_processes_on_one_ray_append_at_once_and_keep_every_id_once(ray_local, store, tmp_path):
    """Three driver processes, each a job on the test's Ray, append through ``write_tfrecords`` at once, each
    with a column of its own: every id once, and every driver's column on its rows (null on the others')."""
    import ray

    from ray_tfrecord import read_tfrecords

    name, drivers = "drivers", 3
    address = ray.get_runtime_context().gcs_address
    go = tmp_path / "go"
    shares = [list(range(1000 * d, 1000 * d + 200)) for d in range(drivers)]
    code = ("import json, sys; from tests.test_concurrent_writes import append_driver; "
            "append_driver(*json.loads(sys.argv[1]))")
    procs = [subprocess.Popen([sys.executable, "-c", code, json.dumps([address, store, name, ids,
                                                                         str(tmp_path / f"ready-{d}"), str(go),
                                                                         f"f{d}"])],
                              cwd=_REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for d, ids in enumerate(shares)]
    try:
        _until(lambda: all((tmp_path / f"ready-{d}").exists() or procs[d].poll() is not None
                           for d in range(drivers)), timeout=180)
        go.touch()
        outputs = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0] * drivers, [o[-3000:] for o in outputs]
    results = [json.loads(o.split("RESULT ", 1)[1].splitlines()[0]) for o in outputs]
    assert [r["rows"] for r in results] == [200] * drivers
    assert len({r["version"] for r in results}) == drivers  # each its own version of the log
    rows = read_tfrecords(_SCHEMES[store[0]] + _root(store, name), filesystem=_fs(store)).take_all()
    assert sorted(r["id"] for r in rows) == sorted(i for ids in shares for i in ids)  # every id, exactly once
    owner = {i: d for d, ids in enumerate(shares) for i in ids}
    assert all(r[f"f{d}"] == (2 * r["id"] if owner[r["id"]] == d else None) for r in rows for d in range(drivers))


def test_a_read_planned_before_an_overwrite_counts_its_version_without_a_file_and_its_rows_name_the_commit(
        ray_local, store):
    """With the default ``keep_replaced_files=0`` the files a read planned are gone by the time it runs:
    ``count()`` still answers, the planned version's, from the manifest's row counts (Ray adds up the read
    tasks' ``num_rows``; opening a file would raise); reading the rows raises the error naming the commit."""
    import ray

    from ray_tfrecord import read_tfrecords, write_tfrecords

    fs, uri = _fs(store), _SCHEMES[store[0]] + _root(store, "counted")
    write_tfrecords(ray.data.range(30, override_num_blocks=3), uri, filesystem=fs)
    old = read_manifest(fs, _root(store, "counted"))
    planned = read_tfrecords(uri, filesystem=fs)
    write_tfrecords(ray.data.range(20), uri, filesystem=fs, mode="overwrite")
    assert all(fs.get_file_info(posixpath.join(_root(store, "counted"), e.rel_path)).type == pafs.FileType.NotFound
               for e in old.entries)
    assert planned.count() == 30
    with pytest.raises(TFRecordError, match=r"this read was planned against an earlier version of the dataset; "
                                            r"version \d+ \(mode='overwrite' of every partition, committed "):
        planned.take_all()
    assert read_tfrecords(uri, filesystem=fs).count() == 20
