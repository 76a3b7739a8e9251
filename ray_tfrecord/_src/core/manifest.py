"""The manifest of a dataset on an object store: which files are committed, with their indexes.

On S3 and GCS a write's files go straight to their final keys, and the commit is one write of
``<root>/_tfrecord_manifest.json`` (``MANIFEST_FILE``), which
lists every committed data file: its path relative to the root, its size and rows, and its record
index (``RecordIndex`` bytes, base64), which replaces the
per-file ``_index.*`` sidecar there. A reader that finds a manifest reads only the files it lists,
so a write in flight or killed shows nothing. ``ray_tfrecord._src.data.write.commit`` says when it is
written.

>>> m = Manifest([Entry("a=1/part-0.tfrecord", 10, 2, b"ix")])
>>> Manifest.from_bytes(m.to_bytes(), path="m").entries[0].index
b'ix'
"""

from __future__ import annotations

import base64
import json
import posixpath
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from .errors import TFRecordError
from .layout import MANIFEST_FILE

_VERSION = 1
# pyarrow's type names of the filesystems without directories or renames.
_OBJECT_STORES = ("s3", "gcs")


def is_object_store(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` (not a wrapper: pass what it wraps) is S3 or GCS, where datasets commit by manifest."""
    return fs.type_name in _OBJECT_STORES


@dataclass(frozen=True)
class Entry:
    """One committed data file."""

    rel_path: str  # below the dataset root
    size: int
    rows: int | None  # None: not known (a file that was there before the first manifest)
    index: bytes | None = None  # its RecordIndex, for an uncompressed file this package wrote


@dataclass(frozen=True)
class Manifest:
    entries: list[Entry] = field(default_factory=list)

    def to_bytes(self) -> bytes:
        files = [{"path": e.rel_path, "size": e.size, "rows": e.rows,
                  "index": None if e.index is None else base64.b64encode(e.index).decode()} for e in self.entries]
        return json.dumps({"version": _VERSION, "files": files}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, path: str) -> Manifest:
        try:
            doc = json.loads(data)
            if doc.get("version") != _VERSION:
                raise ValueError(f"version {doc.get('version')!r}, this package reads {_VERSION}")
            return cls([Entry(f["path"], int(f["size"]), f["rows"],
                              None if f["index"] is None else base64.b64decode(f["index"])) for f in doc["files"]])
        except (ValueError, KeyError, TypeError) as e:
            raise TFRecordError(f"the dataset's manifest is unreadable ({e}); upgrade ray_tfrecord if a newer one "
                                "wrote it, else delete it (readers then read every file there)", path=path) from None

    def paths(self, root: str) -> set[str]:
        return {posixpath.join(root, e.rel_path) for e in self.entries}


def read_manifest(fs: pafs.FileSystem, root: str, *, name: str = MANIFEST_FILE) -> Manifest | None:
    """The manifest at dataset ``root`` (``name``: a checkpointed task's record of its files, in the
    same form); ``None`` if there is none."""
    path = posixpath.join(root, name)
    try:
        with fs.open_input_stream(path, compression=None) as f:
            data = f.read()
    except FileNotFoundError:
        return None
    return Manifest.from_bytes(data, path=path)


def write_manifest(fs: pafs.FileSystem, root: str, manifest: Manifest, *, name: str = MANIFEST_FILE) -> None:
    """One PUT on an object store, which replaces the object whole: a reader sees the old list or the new."""
    with fs.open_output_stream(posixpath.join(root, name), compression=None) as f:
        f.write(manifest.to_bytes())
