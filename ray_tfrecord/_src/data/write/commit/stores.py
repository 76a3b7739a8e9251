"""Create-if-absent, the one atomic step a commit needs of a store, for each store that has one.

pyarrow's filesystems cannot do it (a PUT with ``If-None-Match`` or ``ifGenerationMatch`` is dropped: see
apache/arrow#44281), so S3 goes through boto3 (``If-None-Match: *``), GCS through google-cloud-storage
(``if_generation_match=0``), each built from the pyarrow filesystem's own settings and imported only when
that store is written; local disk links a finished temporary file to the name (``link(2)`` fails if the
name exists); HDFS renames one (its rename refuses an existing target). Any other filesystem gets a
check, then a write: two writers committing within that gap can both succeed, and the later one's version
replaces the earlier (docs/cloud-storage.md says so).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import posixpath
import uuid
from typing import Any

import pyarrow.fs as pafs

logger = logging.getLogger(__name__)


def create_if_absent(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    """Create ``path`` holding ``data`` unless it exists; ``False`` (nothing written) if it does. ``fs`` is
    the filesystem itself, not a wrapper (Ray's retrying one): its type picks the store's precondition."""
    kind = fs.type_name
    if kind == "local":
        return _local(path, data)
    if kind == "s3":
        return _s3(fs, path, data)
    if kind == "gcs":
        return _gcs(fs, path, data)
    if kind == "hdfs":
        return _by_rename(fs, path, data)
    _warn_unconditional(kind)
    if fs.get_file_info(path).type != pafs.FileType.NotFound:
        return False
    _write(fs, path, data)
    return True


def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path, compression=None) as out:
        out.write(data)


def _local(path: str, data: bytes) -> bool:
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())  # a version that outlives a power loss must hold its bytes
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _by_rename(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    tmp = posixpath.join(posixpath.dirname(path), f".tmp-{uuid.uuid4().hex}")
    _write(fs, tmp, data)
    try:
        fs.move(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            fs.delete_file(tmp)
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            raise
        return False
    return True


def _settings(fs: pafs.FileSystem) -> dict[str, Any]:
    """The keyword arguments ``fs`` was built with (what pyarrow pickles it by)."""
    return fs.__reduce__()[1][0]


def _s3(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    from botocore.exceptions import ClientError

    bucket, key = path.split("/", 1)
    s = _settings(fs)
    client = _s3_client(s.get("endpoint_override") or "", s.get("scheme") or "https", s.get("region") or "",
                        s.get("access_key") or "", s.get("secret_key") or "", s.get("session_token") or "")
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except ClientError as e:
        # 412: the key exists. 409 ConditionalRequestConflict: another conditional PUT of the key is in flight;
        # the caller lists again and finds whichever won.
        if e.response.get("Error", {}).get("Code") in ("PreconditionFailed", "ConditionalRequestConflict"):
            return False
        raise
    return True


@functools.lru_cache(maxsize=8)
def _s3_client(endpoint: str, scheme: str, region: str, access_key: str, secret_key: str, token: str) -> Any:
    try:
        import boto3
    except ImportError:
        raise ImportError("committing to S3 needs boto3, for its conditional PUT: pip install "
                          "'ray_tfrecord[s3]'") from None
    if endpoint and "://" not in endpoint:
        endpoint = f"{scheme}://{endpoint}"
    keys = {}
    if access_key:  # else boto3's own chain (environment, profile, instance role), as pyarrow's
        keys = {"aws_access_key_id": access_key, "aws_secret_access_key": secret_key,
                "aws_session_token": token or None}
    return boto3.session.Session().client("s3", endpoint_url=endpoint or None, region_name=region or None, **keys)


def _gcs(fs: pafs.FileSystem, path: str, data: bytes) -> bool:
    from google.api_core.exceptions import PreconditionFailed

    bucket, key = path.split("/", 1)
    s = _settings(fs)
    client = _gcs_client(bool(s.get("anonymous")), s.get("access_token") or "", s.get("scheme") or "https",
                         s.get("endpoint_override") or "", s.get("project_id") or "")
    try:
        client.bucket(bucket).blob(key).upload_from_string(data, if_generation_match=0)
    except PreconditionFailed:
        return False
    return True


@functools.lru_cache(maxsize=8)
def _gcs_client(anonymous: bool, token: str, scheme: str, endpoint: str, project: str) -> Any:
    try:
        from google.cloud import storage
    except ImportError:
        raise ImportError("committing to GCS needs google-cloud-storage, for its generation preconditions: pip "
                          "install 'ray_tfrecord[gcs]'") from None
    options = {"api_endpoint": f"{scheme}://{endpoint}"} if endpoint else None
    if anonymous:
        from google.auth.credentials import AnonymousCredentials

        return storage.Client(project=project or "anonymous", credentials=AnonymousCredentials(),
                              client_options=options)
    if token:
        from google.oauth2.credentials import Credentials

        return storage.Client(project=project or None, credentials=Credentials(token), client_options=options)
    return storage.Client(project=project or None, client_options=options)


@functools.cache
def _warn_unconditional(kind: str) -> None:
    logger.warning("the %s filesystem has no atomic create-if-absent: two writes committing to one dataset at the "
                   "same moment may lose the earlier one's files; give concurrent writes their own paths", kind)
