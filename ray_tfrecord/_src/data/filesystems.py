"""Paths to filesystems, with GCS first-class beside S3.

``gs://`` paths resolve to pyarrow's ``GcsFileSystem`` without a ``filesystem=``, as ``s3://``
ones do. When ``STORAGE_EMULATOR_HOST`` is set (the variable Google's own clients read, e.g.
``http://127.0.0.1:4443`` for a local emulator), they go to that endpoint without credentials,
where pyarrow alone would look for Google credentials and wait on the metadata server.
"""

from __future__ import annotations

import datetime
import os
import urllib.parse

import pyarrow.fs as pafs

from ray_tfrecord._src.data import compat

#: Google's clients' variable for a GCS emulator's address.
EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
# An emulator that is down fails a call after this long, not after pyarrow's 15 minutes.
_EMULATOR_RETRY = datetime.timedelta(seconds=20)


def resolve_paths(paths: list[str], filesystem: pafs.FileSystem | None) -> tuple[list[str], pafs.FileSystem]:
    """``paths`` normalised and their filesystem, as Ray resolves them, with ``gs://`` sent to the
    emulator that ``STORAGE_EMULATOR_HOST`` names, if any."""
    emulator = os.environ.get(EMULATOR_ENV)
    if filesystem is None and emulator and paths and all(p.startswith("gs://") for p in paths):
        url = urllib.parse.urlsplit(emulator if "://" in emulator else f"http://{emulator}")
        filesystem = pafs.GcsFileSystem(anonymous=True, scheme=url.scheme, endpoint_override=url.netloc,
                                        retry_time_limit=_EMULATOR_RETRY)
    return compat.resolve_paths(paths, filesystem)

