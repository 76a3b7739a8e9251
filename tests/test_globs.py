"""Hadoop glob input paths: the pattern syntax, the listing walk (local, any pyarrow filesystem,
fsspec, S3), partitions below the base directory, the recorded schema, the CLI."""

import fnmatch
import os
import subprocess
import sys
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st
from ray.data.datasource import Partitioning

from ray_tfrecord import TFRecordError, read_tfrecords, write_tfrecords
from ray_tfrecord._src.core.index import index_path
from ray_tfrecord._src.core.schema import read_stored_schema
from ray_tfrecord._src.data.read.globs import is_glob, parse_glob
from ray_tfrecord._src.data.read.listing import list_files
from tests.filesystems import DelegatingHandler
from tests.test_s3 import BUCKET, s3  # noqa: F401 (the moto S3 fixture)

pytestmark = pytest.mark.timeout(300)


def _matches(pattern: str, path: str) -> bool:
    """Whether ``pattern`` matches exactly the relative ``path``, component by component."""
    names = path.split("/")
    for branch in parse_glob(pattern).branches:
        if len(branch) == len(names) and all(
            c == n if isinstance(c, str) else c.fullmatch(n) is not None for c, n in zip(branch, names)
        ):
            return True
    return False


# -- the syntax -------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern, path, expected",
    [
        ("part-*", "part-00001.tfrecord", True),
        ("*", "a/b", False),  # "*" does not cross "/"
        ("*/*", "a/b", True),
        ("**", "a/b", False),  # "**" is "*"
        ("a?c", "abc", True),
        ("a?c", "a/c", False),
        ("a?c", "ac", False),
        ("date=2024-0[1-3]", "date=2024-02", True),
        ("date=2024-0[1-3]", "date=2024-04", False),
        ("[^a]x", "bx", True),
        ("[^a]x", "ax", False),
        ("[!a]x", "ax", False),  # Hadoop's other spelling of negation
        ("[]a]", "]", True),  # "]" first in a set is a member
        ("[a\\]]", "]", True),
        ("{a,b}.tf", "b.tf", True),
        ("{a,b}.tf", "c.tf", False),
        ("{a,{b,c}d}", "cd", True),  # nested
        ("{a,{b,c}d}", "c", False),
        ("x{,y}", "x", True),  # an empty alternative
        ("{2024/01,2023/12}/*", "2023/12/f", True),  # "/" inside "{}", as Hadoop's GlobExpander allows
        ("{2024/01,2023/12}/*", "2024/12/f", False),
        ("a\\*", "a*", True),  # an escaped wildcard is literal
        ("a\\*", "ab", False),
        ("a\\{b,c\\}", "a{b,c}", True),
        ("*.tf", ".x.tf", False),  # hidden names: only a literal leading "." or "_" matches them
        ("*", "_SUCCESS", False),
        ("?SUCCESS", "_SUCCESS", False),
        ("[_a]x", "_x", False),
        ("_*", "_temporary", True),
        ("{_t,s}*", "_tmp", True),
        (".*.idx", ".a.idx", True),
        ("a*", "a_b", True),  # "." and "_" after the first character are ordinary
        ("a+b(c)|$^", "a+b(c)|$^", True),  # regex characters are literal
    ],
)
def test_hadoop_glob_syntax(pattern, path, expected):
    assert _matches(pattern, path) is expected


def test_base_directory_and_literal_prefix():
    assert parse_glob("/data/date=2024-0[1-3]/*").base == "/data"
    assert parse_glob("bucket/a/b/part-*").base == "bucket/a/b"
    assert parse_glob("bucket/{a,b}/x").base == "bucket"
    assert parse_glob("/*/x").base == "/"
    assert parse_glob("*.tfrecord").base == ""
    assert parse_glob("d/a\\[1\\].tf").base == "d"
    # An all-literal pattern (escapes only) is one literal path.
    assert parse_glob("d/a\\[1\\].tf").branches == (("d", "a[1].tf"),)
    assert [is_glob(p) for p in ("a/b.tf", "a*", "a?", "a[1]", "{a}", "a\\b", "a]b}")] == [
        False, True, True, True, True, True, False]


@pytest.mark.parametrize(
    "pattern, message",
    [
        ("d/a[b", "d/a[b: no such path, and not a valid glob: the '[' at character 4 is not closed; "
                  "close it with ']', or write '\\[' for a literal '['"),
        ("d/[a/b]", "the '[' at character 3 is not closed before the next '/'"),
        ("d/{a,b", "d/{a,b: no such path, and not a valid glob: the '{' at character 3 is not closed; "
                   "close it with '}', or write '\\{' for a literal '{'"),
        ("d/a\\", "it ends with '\\'; write '\\\\' for a literal backslash"),
        ("d/[z-a]", "the range 'z-a' is empty; write it low to high, 'a-z'"),
    ],
)
def test_malformed_glob_names_the_pattern_and_the_fix(pattern, message):
    with pytest.raises(TFRecordError) as error:
        parse_glob(pattern)
    assert message in str(error.value)
    assert error.value.path == pattern


_NAME = st.text(alphabet="ab.-", min_size=0, max_size=6)
_PIECE = st.sampled_from(["a", "b", ".", "-", "*", "?", "[ab]", "[!a]", "[a-b]"])


@settings(max_examples=300, deadline=None)
@given(st.lists(_PIECE, max_size=6).map("".join), _NAME)
def test_a_component_matches_as_fnmatch_does_within_one_name(pattern, name):
    """Within one component and away from hidden names, Hadoop's wildcards and sets are
    fnmatch's (``[!a]`` included)."""
    if name.startswith("."):
        name = "a" + name
    assert _matches(pattern, name) == fnmatch.fnmatchcase(name, pattern)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(_PIECE, max_size=3).map("".join), min_size=1, max_size=3),
       st.lists(_PIECE, max_size=3).map("".join), _NAME)
def test_alternatives_match_as_the_patterns_they_expand_to(alternatives, rest, name):
    name = "a" + name
    pattern = "{" + ",".join(alternatives) + "}" + rest
    assert _matches(pattern, name) == any(_matches(a + rest, name) for a in alternatives)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="/", blacklist_categories=("Cs",)), min_size=1))
def test_escaping_every_character_gives_the_name_back(name):
    pattern = "".join("\\" + c for c in name)
    assert parse_glob(pattern).branches == ((name,),)


# -- listing ----------------------------------------------------------------------


def _touch(root, *relative):
    for r in relative:
        path = os.path.join(root, r)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(b"x" * len(r))


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "data"
    _touch(root, "date=2024-01/part-0.tf", "date=2024-01/part-1.tf", "date=2024-02/part-0.tf",
           "date=2024-03/nested/part-0.tf", "date=2024-04/part-0.tf", "other/part-0.tf",
           "_SUCCESS", "_temporary/0/part-9.tf", "date=2024-01/.part-0.tf.crc", "_tmp/part-0.tf")
    return str(root)


def _paths(listing, root):
    return [os.path.relpath(f.path, root) for f in listing.files]


def test_glob_lists_matching_files_with_partitions_below_the_base(tree):
    listing = list_files(f"{tree}/date=2024-0[1-3]/*")
    assert _paths(listing, tree) == ["date=2024-01/part-0.tf", "date=2024-01/part-1.tf", "date=2024-02/part-0.tf",
                                     "date=2024-03/nested/part-0.tf"]  # a matched directory is read recursively
    assert [dict(f.partitions) for f in listing.files] == [
        {"date": "2024-01"}, {"date": "2024-01"}, {"date": "2024-02"}, {"date": "2024-03"}]
    assert listing.partition_schema == pa.schema([("date", pa.string())])
    assert listing.roots == [tree]
    assert [f.size for f in listing.files] == [len("date=2024-01/part-0.tf")] * 2 + [
        len("date=2024-02/part-0.tf"), len("date=2024-03/nested/part-0.tf")]


def test_partition_values_above_the_base_are_not_columns(tmp_path):
    # "run=3" is above the base: the dataset root is "run=3/data", not a partition of it.
    root = tmp_path / "run=3" / "data"
    _touch(root, "year=2021/a.tf", "year=2022/a.tf")
    listing = list_files(f"{root}/year=*/*.tf")
    assert [dict(f.partitions) for f in listing.files] == [{"year": 2021}, {"year": 2022}]
    # A base ending in key=value directories keeps them: they are the dataset's partitions.
    listing = list_files(f"{root}/year=2021/*.tf")
    assert listing.roots == [str(root)]
    assert [dict(f.partitions) for f in listing.files] == [{"year": 2021}]


def test_a_base_dir_the_caller_sets_wins(tree):
    listing = list_files(f"{tree}/date=*/part-0.tf",
                         partitioning=Partitioning("dir", field_names=["day"], base_dir=tree))
    assert [dict(f.partitions) for f in listing.files] == [{"day": "date=2024-01"}, {"day": "date=2024-02"},
                                                         {"day": "date=2024-04"}]


def test_hidden_names_match_only_a_literal_leading_dot_or_underscore(tree):
    assert _paths(list_files(f"{tree}/*"), tree) == [
        "date=2024-01/part-0.tf", "date=2024-01/part-1.tf", "date=2024-02/part-0.tf",
        "date=2024-03/nested/part-0.tf", "date=2024-04/part-0.tf", "other/part-0.tf"]
    assert _paths(list_files(f"{tree}/_tm*/*"), tree) == ["_tmp/part-0.tf"]
    assert _paths(list_files(f"{tree}/_temporary/*/*"), tree) == ["_temporary/0/part-9.tf"]
    assert _paths(list_files(f"{tree}/date=2024-01/.*.crc"), tree) == ["date=2024-01/.part-0.tf.crc"]


def test_an_existing_path_is_literal_and_an_escaped_one_too(tmp_path):
    _touch(tmp_path, "a[1].tf", "a1.tf", "a2.tf", "b{x}.tf")
    assert [f.path for f in list_files(str(tmp_path / "a[1].tf")).files] == [str(tmp_path / "a[1].tf")]
    assert [f.path for f in list_files(str(tmp_path / "b{x}.tf")).files] == [str(tmp_path / "b{x}.tf")]
    assert [f.path for f in list_files(str(tmp_path) + "/a\\[1\\].tf").files] == [str(tmp_path / "a[1].tf")]
    assert [os.path.basename(f.path) for f in list_files(str(tmp_path / "a[12].tf")).files] == ["a1.tf", "a2.tf"]


def test_overlapping_paths_read_each_file_once(tree):
    listing = list_files([f"{tree}/date=2024-0[12]/*", f"{tree}/date=2024-01", f"{tree}/date=*/part-0.tf",
                          f"{tree}/date=2024-01/part-0.tf", f"{tree}/{{date=2024-01,date=2024-01}}/*"])
    paths = _paths(listing, tree)
    assert len(paths) == len(set(paths))
    assert sorted(paths) == ["date=2024-01/part-0.tf", "date=2024-01/part-1.tf", "date=2024-02/part-0.tf",
                             "date=2024-04/part-0.tf"]
    assert listing.roots == [tree, f"{tree}/date=2024-01", f"{tree}/date=2024-01/part-0.tf"]


def test_no_match_names_the_pattern_and_what_was_listed(tree, tmp_path):
    with pytest.raises(TFRecordError) as error:
        list_files(f"{tree}/date=*/part-*.tfrecrod")
    assert str(error.value) == (f"{tree}/date=*/part-*.tfrecrod: no file matches this glob (listed {tree}/); "
                                "check the pattern, or pass ignore_missing_paths=True to skip it")
    with pytest.raises(TFRecordError, match=f"no file matches this glob \\({tmp_path}/nowhere/ does not exist\\)"):
        list_files(f"{tmp_path}/nowhere/*")
    ok = list_files([f"{tree}/date=*/part-*.tfrecrod", f"{tree}/other/*"], ignore_missing_paths=True)
    assert _paths(ok, tree) == ["other/part-0.tf"]
    with pytest.raises(FileNotFoundError):  # a literal path stays what it was
        list_files(f"{tree}/missing.tf")


def test_a_glob_ending_with_a_question_mark(tree):
    # Ray parses paths as URLs, where a final "?" is an empty query and is dropped.
    assert _paths(list_files(f"{tree}/date=2024-0?"), tree)[-1] == "date=2024-04/part-0.tf"
    assert _paths(list_files([f"{tree}/other/part-?.tf", f"{tree}/date=2024-0[4]/part-?.t?"]), tree) == [
        "other/part-0.tf", "date=2024-04/part-0.tf"]


def test_relative_glob(tree, monkeypatch):
    monkeypatch.chdir(tree)
    assert [f.path for f in list_files("date=2024-0[12]/part-0.tf").files] == [
        "date=2024-01/part-0.tf", "date=2024-02/part-0.tf"]
    assert [f.path for f in list_files("*/part-1*").files] == ["date=2024-01/part-1.tf"]


class _Recording(DelegatingHandler):
    """Any filesystem, through pyarrow's Python handler, recording the directories listed."""

    def __init__(self, fs):
        super().__init__(fs)
        self.listed = []

    def get_file_info_selector(self, selector):
        self.listed.append((selector.base_dir, selector.recursive))
        return super().get_file_info_selector(selector)


def test_the_walk_lists_only_directories_that_can_match(tree):
    handler = _Recording(pafs.LocalFileSystem())
    listing = list_files(f"{tree}/date=2024-0[1-3]/part-*", filesystem=pafs.PyFileSystem(handler))
    assert _paths(listing, tree) == ["date=2024-01/part-0.tf", "date=2024-01/part-1.tf", "date=2024-02/part-0.tf"]
    # The base, then one level in each directory matched so far; never other/, date=2024-04/, _temporary/.
    assert sorted(handler.listed) == [(tree, False)] + [(f"{tree}/date=2024-0{i}", False) for i in (1, 2, 3)]
    # A literal component after a wildcard is not listed: it is looked up.
    handler.listed.clear()
    listing = list_files(f"{tree}/date=*/nested/part-0.tf", filesystem=pafs.PyFileSystem(handler))
    assert _paths(listing, tree) == ["date=2024-03/nested/part-0.tf"]
    # Then the file's dataset root (the directory above its partitions), which no listing showed, once: the
    # log's versions are there.
    assert handler.listed == [(tree, False), (f"{tree}/date=2024-03/nested", False)]
    # A glob below a literal component that names a file matches nothing there.
    with pytest.raises(TFRecordError, match="no file matches this glob"):
        list_files(f"{tree}/date=*/part-0.tf/*")


def test_subtree_and_fsspec_filesystems(tree):
    subtree = pafs.SubTreeFileSystem(tree, pafs.LocalFileSystem())
    listing = list_files("date=2024-0[12]/*", filesystem=subtree)
    assert [f.path for f in listing.files] == ["date=2024-01/part-0.tf", "date=2024-01/part-1.tf",
                                               "date=2024-02/part-0.tf"]
    assert [dict(f.partitions) for f in listing.files] == [{"date": "2024-01"}] * 2 + [{"date": "2024-02"}]

    fsspec = pytest.importorskip("fsspec")
    memory = fsspec.filesystem("memory")
    for name in ("date=1/a.tf", "date=2/a.tf", "date=2/_b.tf", "other/a.tf"):
        memory.pipe(f"/globs/{name}", b"x")
    listing = list_files("/globs/date=*/*.tf", filesystem=memory)
    assert [f.path for f in listing.files] == ["/globs/date=1/a.tf", "/globs/date=2/a.tf"]
    assert [dict(f.partitions) for f in listing.files] == [{"date": 1}, {"date": 2}]


_TREE_NAME = st.sampled_from(["a", "b", "ab", "_a", ".b", "a=1", "a=2"])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_TREE_NAME, min_size=1, max_size=3), min_size=1, max_size=8),
       st.lists(st.sampled_from(["a", "b", "*", "?", "a*", "[ab]", "{a,_a}", "{a/b,b}", "_a", "a=[12]"]),
                min_size=1, max_size=3))
def test_the_walk_finds_what_matching_every_listed_file_finds(files, components):
    """Walking directory by directory finds exactly the files a brute-force match of every file
    finds: those whose leading components the pattern matches, with nothing hidden below."""
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "t")
        for parts in files:
            try:
                _touch(root, os.path.join(*parts, "f"))
            except OSError:  # a name already a file; the tree keeps the first
                pass
        everything = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)
        pattern = "/".join(components)

        def expected(path):
            names = path.split("/")
            return any(_matches(pattern, "/".join(names[:k])) and not any(n[0] in "._" for n in names[k:])
                       for k in range(1, len(names) + 1))

        want = [p for p in everything if expected(p)]
        listing = list_files(f"{root}/{pattern}", ignore_missing_paths=True) if want else None
        assert (listing and _paths(listing, root)) == (want or None)


# -- reading ----------------------------------------------------------------------


def _tf_example(i: int) -> bytes:
    ex = tf.train.Example()
    ex.features.feature["id"].int64_list.value.append(i)
    ex.features.feature["text"].bytes_list.value.append(b"row%d" % i)
    ex.features.feature["emb"].float_list.value.extend([i / 2, -i / 4])
    return ex.SerializeToString()


@pytest.fixture
def tf_written(tmp_path):
    """Files tf.io.TFRecordWriter wrote in a Hive layout, 10 records each."""
    root = tmp_path / "tf"
    for n, part in enumerate(["day=1/part-0", "day=1/part-1", "day=2/part-0", "day=3/part-0", "day=3/notes.txt"]):
        (root / part).parent.mkdir(parents=True, exist_ok=True)
        if part.endswith(".txt"):
            (root / part).write_text("not a record")
            continue
        with tf.io.TFRecordWriter(str(root / part)) as w:
            for i in range(n * 10, n * 10 + 10):
                w.write(_tf_example(i))
    return root


def test_glob_read_of_tensorflow_files_is_what_parse_example_sees(ray_local, tf_written):
    pattern = f"{tf_written}/day=[12]/part-*"
    rows = sorted(read_tfrecords(pattern).take_all(), key=lambda r: r["id"])
    files = sorted(tf.io.gfile.glob(pattern))  # TensorFlow's glob, same syntax for this pattern
    assert len(files) == 3
    parsed = tf.io.parse_example(
        list(tf.data.TFRecordDataset(files).batch(100).as_numpy_iterator())[0],
        {"id": tf.io.FixedLenFeature([], tf.int64), "text": tf.io.FixedLenFeature([], tf.string),
         "emb": tf.io.FixedLenFeature([2], tf.float32)},
    )
    order = np.argsort(parsed["id"].numpy())
    assert [r["id"] for r in rows] == parsed["id"].numpy()[order].tolist()
    assert [r["text"] for r in rows] == parsed["text"].numpy()[order].tolist()
    assert np.array_equal(np.stack([r["emb"] for r in rows]), parsed["emb"].numpy()[order])
    assert [r["day"] for r in rows] == [1] * 20 + [2] * 10  # typed from the directories below the base


def test_glob_over_our_dataset_restores_the_recorded_schema(ray_local, tmp_path):
    rows = [{"day": d, "word": f"w{i}", "small": np.int32(i), "vec": [float(i), 1.0]}
            for d in (1, 2, 3) for i in range(d * 10, d * 10 + 5)]
    source = ray.data.from_items(rows)
    root = str(tmp_path / "ours")
    result = write_tfrecords(source, root, partition_cols=["day"])
    whole = read_tfrecords(root)
    globbed = read_tfrecords(f"{root}/day=[12]/*.tfrecord")
    # The recorded schema (string, int32) comes back through the glob as through the directory.
    assert globbed.schema().base_schema == whole.schema().base_schema
    assert whole.schema().base_schema.field("word").type == pa.string()
    assert whole.schema().base_schema.field("small").type == pa.int32()
    expected = sorted((r for r in whole.take_all() if r["day"] in (1, 2)), key=lambda r: r["word"])
    got = sorted(globbed.take_all(), key=lambda r: r["word"])
    assert len(got) == 10
    assert [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()} for r in got] == [
        {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()} for r in expected]
    # The writer's sidecars at the dataset root were seen by the walk: the reads can split.
    listing = list_files(f"{root}/day=[12]/*.tfrecord")
    assert all(f.has_index for f in listing.files)
    assert all(index_path(f.path) in {os.path.join(root, n) for n in os.listdir(root)} for f in listing.files)
    # And TensorFlow parses every file the glob matched.
    for f in listing.files:
        assert sum(1 for _ in tf.data.TFRecordDataset(f.path)) == 5


def test_a_relative_glob_finds_the_recorded_schema_in_the_current_directory(ray_local, tmp_path, monkeypatch):
    root = tmp_path / "rel"
    write_tfrecords(ray.data.from_items([{"day": d, "word": "w"} for d in (1, 2)]), str(root), partition_cols=["day"])
    monkeypatch.chdir(root)
    listing = list_files("day=*/*")
    assert listing.roots == ["."]
    assert [dict(f.partitions) for f in listing.files] == [{"day": 1}, {"day": 2}]
    assert read_stored_schema(listing.filesystem, listing.roots[0]).field("word").type == pa.string()


@pytest.mark.slow
def test_cli_takes_a_quoted_glob(tf_written, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAY_ADDRESS": "local"}
    command = f"{sys.executable} -m ray_tfrecord._src.cli --num-cpus 1 inspect '{tf_written}/day=[13]/part-*' --rows 1"
    run = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "files: 3 " in run.stdout
    assert "day: int64 (2 values: 1, 3)" in run.stdout
    assert "records: 30" in run.stdout
    bad = subprocess.run(f"{sys.executable} -m ray_tfrecord._src.cli verify '{tf_written}/day=*/part-*.tfrecrod'",
                         shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert bad.returncode == 2
    assert bad.stderr.strip() == (f"ray-tfrecord verify: {tf_written}/day=*/part-*.tfrecrod: no file matches this "
                                  f"glob (listed {tf_written}/); check the pattern")


@pytest.mark.slow
def test_glob_on_s3_lists_only_its_prefix(ray_local, s3):  # noqa: F811
    ds = ray.data.from_items([{"day": d, "word": f"w{d}{i}"} for d in (1, 2, 3) for i in range(4)])
    write_tfrecords(ds, f"s3://{BUCKET}/globbed", filesystem=s3, partition_cols=["day"])
    with s3.open_output_stream(f"{BUCKET}/elsewhere/part-0.tfrecord") as out:
        out.write(b"")
    back = read_tfrecords(f"s3://{BUCKET}/globbed/day={{1,3}}/part-*", filesystem=s3)
    assert sorted(r["word"] for r in back.take_all()) == [f"w{d}{i}" for d in (1, 3) for i in range(4)]
    assert back.schema().base_schema.field("word").type == pa.string()  # the recorded schema
    handler = _Recording(s3)
    # No "s3://": Ray would not take a Python filesystem for that scheme.
    listing = list_files(f"{BUCKET}/globbed/day=*/part-*", filesystem=pafs.PyFileSystem(handler))
    assert {dict(f.partitions)["day"] for f in listing.files} == {1, 2, 3}
    assert all(f.has_index for f in listing.files)
    assert sorted(handler.listed) == [(f"{BUCKET}/globbed", False)] + [
        (f"{BUCKET}/globbed/day={d}", False) for d in (1, 2, 3)]
    with pytest.raises(TFRecordError, match=f"no file matches this glob \\(listed {BUCKET}/globbed/\\)"):
        list_files(f"s3://{BUCKET}/globbed/day=*/part-*.tfrecrod", filesystem=s3)
