"""What other writers leave beside their TFRecord files, and what a directory read does with it.

A directory written by TensorFlow Datasets, Apache Beam, Spark or Hadoop, DALI's or the
``tfrecord`` package's index tool holds more than records:

- **Staging output** of an unfinished or failed job (``STAGING``): valid records that a retried
  run wrote again, so reading them duplicates rows. Skipped, with one warning naming them.
- **Sidecars** (``SIDECARS``): index and metadata files, recognised by their name *and* their
  content (a sidecar's name on anything else is read as data, so a damaged TFRecord file is
  never skipped quietly). Left out, with a log line.
- Any other file whose name says it is not TFRecord data (``.json``, ``.txt``, ``.csv`` ...) and
  whose first bytes agree stops the read before it starts, naming the file and the keyword or
  glob that leaves it out.

TFDS shards (``<name>-<split>.tfrecord-00000-of-00004`` beside the ``dataset_info.json`` TFDS
writes) also tell their split (``tfds_splits``).

>>> staging_tool("beam-temp-part-0c1f/4a2e")
('beam-temp-part-0c1f', 'Apache Beam')
>>> sidecar_kind("part-0.index"), sidecar_kind("dataset_info.json"), sidecar_kind("part-0")
('index', 'TFDS metadata', None)
>>> is_sidecar("index", b"0 1042\\n1042 998\\n")
True
"""

from __future__ import annotations

import json
import logging
import posixpath
import re
import warnings
from collections.abc import Collection
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pyarrow.fs as pafs

from ray_tfrecord._src.core.errors import NotTFRecordError, TFRecordError
from ray_tfrecord._src.core.framing import HEADER_BYTES, detect_compression, masked_crc32c
from ray_tfrecord._src.core.layout import STAGING_DIR

logger = logging.getLogger(__name__)


class Rule(NamedTuple):
    """A name other writers give, and which tool it is."""

    pattern: re.Pattern[str]  # matched against one path component's full name
    tool: str


#: Directories (and files) a job stages its output in before it commits; their records are another
#: attempt's, and a directory read skips them with a warning. README "Reading" mirrors this table.
STAGING = (
    Rule(re.compile(re.escape(STAGING_DIR)), "Hadoop/Spark FileOutputCommitter or write_tfrecords"),
    Rule(re.compile(r"\.spark-staging-.*"), "Spark dynamic partition overwrite"),
    Rule(re.compile(r"\.hive-staging.*"), "Hive"),
    Rule(re.compile(r"beam-temp-.*"), "Apache Beam"),
    Rule(re.compile(r"\.temp-beam.*"), "Apache Beam Java SDK"),
    # A build's directory, and a file being written (tensorflow_datasets/core/utils: file_utils,
    # py_utils; INCOMPLETE_PREFIX).
    Rule(re.compile(r"incomplete\.([A-Z0-9]{6}_.+|[0-9a-f]{32}\..+)"), "TensorFlow Datasets"),
)

#: Sidecars by name. Their content is checked too (``is_sidecar``).
SIDECARS = (
    # DALI's and the tfrecord package's tfrecord2idx: one "offset length" line per record.
    Rule(re.compile(r".+\.(index|idx)"), "index"),
    # TensorFlow Datasets' metadata: DATASET_INFO_FILENAME, FEATURES_FILENAME, METADATA_FILENAME,
    # LICENSE_FILENAME (tensorflow_datasets/core/constants.py), ClassLabel's "<feature>.labels.txt".
    Rule(re.compile(r"dataset_info\.json|features\.json|metadata\.json|LICENSE|.+\.labels\.txt"), "TFDS metadata"),
)

# Names no TFRecord writer gives its data files: such a file that is not TFRecord stops the read.
_NOT_DATA = re.compile(r".+\.(json|txt|csv|tsv|parquet|pq|orc|avro|md|yaml|yml|pbtxt|log|py|html|xml|npy|npz)"
                       r"|LICENSE|README", re.IGNORECASE)
_INDEX_LINE = re.compile(rb"\d+ \d+")
# How much of a file is read to tell what it is: a TFRecord header is 12 bytes; TFDS metadata is a
# few KiB; an index's lines repeat one form, so the first ones tell.
_HEAD_BYTES = 64
_SIDECAR_HEAD_BYTES = {"index": 4096, "TFDS metadata": 1 << 20}
_READ_THREADS = 16
# TFDS shard names: "{dataset}-{split}.{file format}-{shard:05d}-of-{num_shards:05d}".
_TFDS_SHARD = re.compile(r"[^-/]+-(?P<split>\w+)\.\w+-\d{5}-of-\d{5}")
_TFDS_INFO = "dataset_info.json"
_VERSION = re.compile(r"\d+\.\d+\.\d+")  # a TFDS dataset's version directory


def staging_tool(relative_path: str) -> tuple[str, str] | None:
    """``(the staging directory or file, the tool whose name it is)`` for a path below the directory
    read, or None when no component of it is staging output."""
    parts = relative_path.split("/")
    for k, part in enumerate(parts):
        for rule in STAGING:
            if rule.pattern.fullmatch(part):
                return "/".join(parts[:k + 1]), rule.tool
    return None


def warn_staging(skipped: dict[str, str], committed_roots: Collection[str] = ()) -> None:
    """One warning for the staging output a read left out: ``skipped`` maps each staging path to
    its tool. A ``_temporary/`` directly under one of ``committed_roots`` (dataset roots with a manifest:
    object stores) holds no records to read, only an unfinished write's bookkeeping, so its warning says
    how to clean it instead."""
    ours = {p: t for p, t in skipped.items()
            if posixpath.basename(p) == STAGING_DIR and posixpath.dirname(p) in committed_roots}
    others = {p: t for p, t in skipped.items() if p not in ours}
    if others:
        warnings.warn(
            f"skipped the staging output of unfinished or failed jobs: {_shown(others)}; it holds another "
            "attempt's records, which would duplicate rows. Remove it, or read it by its own path if it "
            "is the data you want.", UserWarning, stacklevel=5)  # the caller of read_tfrecords
    if ours:
        warnings.warn(
            f"skipped the staging directory of a write_tfrecords that has not finished: {', '.join(list(ours)[:3])}"
            f"{' ...' if len(ours) > 3 else ''}; the dataset's manifest lists every committed file, so no row is "
            "missing. Once no write to the dataset runs, `ray-tfrecord clean` on its path removes what a killed "
            "write left (it keeps a checkpointed job's, which its rerun continues).", UserWarning, stacklevel=5)


def _shown(skipped: dict[str, str]) -> str:
    shown = ", ".join(f"{path} ({tool})" for path, tool in list(skipped.items())[:3])
    return shown + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")


def sidecar_kind(name: str) -> str | None:
    """The kind of sidecar a file of this name would be (``"index"``, ``"TFDS metadata"``), if any."""
    return next((rule.tool for rule in SIDECARS if rule.pattern.fullmatch(name)), None)


def is_sidecar(kind: str, head: bytes, *, complete: bool = True) -> bool:
    """Whether ``head`` is what a sidecar of ``kind`` holds: the whole file, or (``complete=False``)
    its first bytes."""
    if looks_like_tfrecord(head):
        return False
    lines = head.split(b"\n")
    if kind == "index":
        # A cut last line tells nothing; the others must all be "offset length".
        whole = [line for line in (lines if complete else lines[:-1]) if line]
        return bool(whole) and all(_INDEX_LINE.fullmatch(line.rstrip(b"\r")) for line in whole)
    try:
        text = (head if complete else b"\n".join(lines[:-1])).decode("utf-8")
    except UnicodeDecodeError:
        return False
    if not complete or not text.lstrip().startswith(("{", "[")):
        return True  # text: LICENSE, label names, or JSON too long to parse here
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def looks_like_tfrecord(head: bytes) -> bool:
    """Whether a file starting with ``head`` can be TFRecord: empty, compressed, or a first record
    header whose length CRC holds."""
    if not head or detect_compression(head) is not None:
        return True
    return (len(head) >= HEADER_BYTES
            and masked_crc32c(head[:8]) == int.from_bytes(head[8:HEADER_BYTES], "little"))


def screen(paths: list[str], fs: pafs.FileSystem, kept: list[str]) -> set[str]:
    """The sidecars among ``paths`` (files found by listing a directory), to leave out; logs them.

    Raises ``NotTFRecordError`` for a file whose name and content say it is not TFRecord
    data and that no rule recognises; the message suggests how to leave it out, from ``kept``
    (the other files' paths)."""
    suspects = [p for p in paths if sidecar_kind(_name(p)) or _NOT_DATA.fullmatch(_name(p))]
    if not suspects:
        return set()
    with ThreadPoolExecutor(min(len(suspects), _READ_THREADS)) as pool:
        heads = list(pool.map(lambda p: _head(fs, p), suspects))
    sidecars: dict[str, list[str]] = {}
    for path, (head, complete) in zip(suspects, heads):
        kind = sidecar_kind(_name(path))
        if kind is not None and is_sidecar(kind, head, complete=complete):
            sidecars.setdefault(kind, []).append(path)
        elif not looks_like_tfrecord(head):
            named = set(suspects)
            raise NotTFRecordError(f"not TFRecord data, nor a sidecar this reader recognises; leave it out of the "
                                   f"read with {_leave_out([p for p in kept if p not in named])}", path=path)
    for kind, found in sidecars.items():
        logger.info("left out %d %s file(s), not records: %s%s", len(found), kind, ", ".join(found[:3]),
                    " ..." if len(found) > 3 else "")
    return {p for found in sidecars.values() for p in found}


def tfds_splits(paths: list[str], fs: pafs.FileSystem, roots: list[str]) -> dict[str, str]:
    """The split of each TFDS shard among ``paths``: a file named as TFDS names shards, in a
    directory holding TFDS's ``dataset_info.json``.

    Raises ``TFRecordError`` when one of ``roots`` (the paths read) holds several versions
    of one TFDS dataset (``<dataset>/1.0.0/``, ``<dataset>/1.0.1/``): each holds every row again."""
    shards = {p: m.group("split") for p in paths if (m := _TFDS_SHARD.fullmatch(_name(p)))}
    directories = sorted({posixpath.dirname(p) for p in shards})
    infos = fs.get_file_info([posixpath.join(d, _TFDS_INFO) for d in directories]) if directories else []
    tfds = [d for d, info in zip(directories, infos) if info.is_file]
    versions: dict[tuple[str, str], list[str]] = {}
    for d in tfds:
        parent, name = posixpath.split(d)
        root = next((r for r in roots if d.startswith(r.rstrip("/") + "/")), None)
        if root is not None and _VERSION.fullmatch(name):
            versions.setdefault((root, parent), []).append(name)
    for (root, parent), found in versions.items():
        if len(found) > 1:
            found.sort(key=lambda v: tuple(map(int, v.split("."))))
            raise TFRecordError(f"holds {len(found)} versions of the TFDS dataset {parent} ({', '.join(found)}), "
                                f"each with every row; read one, such as '{parent}/{found[-1]}'", path=root)
    return {p: split for p, split in shards.items() if posixpath.dirname(p) in set(tfds)}


def _head(fs: pafs.FileSystem, path: str) -> tuple[bytes, bool]:
    """A file's first bytes, and whether they are all of it."""
    kind = sidecar_kind(_name(path))
    most = _SIDECAR_HEAD_BYTES[kind] if kind else _HEAD_BYTES
    with fs.open_input_stream(path, compression=None) as f:
        head = f.read(most + 1)
    return head[:most], len(head) <= most


def _leave_out(data: list[str]) -> str:
    """How a caller reads only ``data``: a shared extension, else a glob."""
    extensions = {posixpath.splitext(_name(p))[1] for p in data}
    if len(extensions) == 1 and re.fullmatch(r"\.\w+", ext := extensions.pop()):
        return f"file_extensions=[{ext[1:]!r}]"
    directories = {posixpath.dirname(p) for p in data}
    if len(directories) == 1 and data and all(".tfrecord" in _name(p) for p in data):
        return f"the glob '{directories.pop()}/*.tfrecord*' as the path"
    return "a glob that matches only the data files as the path"


def _name(path: str) -> str:
    return path.rsplit("/", 1)[-1]
