"""Which paths TensorFlow's own file ops can open, asked before a TensorFlow-native pipeline is built, so
that an ``s3://`` plan fails when ``tfrecord_dataset`` or ``ps_trainer`` is called, not at the first batch
(TensorFlow's ``UnimplementedError: File system scheme 's3' not implemented``).

Imports no TensorFlow: ``ps_trainer``'s driver may have none. S3 and HDFS left TensorFlow's core for
tensorflow-io in 2.6, and tensorflow-io's last release (0.37.1) does not load on TensorFlow 2.18 and later,
the versions this package supports, so without TensorFlow at hand the core's own schemes are the answer
(TensorFlow 2.21's ``tf.io.gfile.get_registered_schemes()``: ``''``, ``file``, ``ram``, ``gs``).
"""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow.fs as pafs

from ray_tfrecord._src.core.errors import TFRecordError
from ray_tfrecord._src.data import compat

#: The schemes TensorFlow 2.18-2.21 registers itself (``''`` and ``file``: local paths).
CORE_SCHEMES = ("", "file", "ram", "gs")
# pyarrow filesystem type -> the scheme TensorFlow's file systems know it by.
_SCHEMES = {"local": "", "s3": "s3", "gcs": "gs", "hdfs": "hdfs"}


def tf_scheme(fs: pafs.FileSystem) -> str:
    """The scheme TensorFlow would open ``fs``'s paths by (``''`` for local files)."""
    name = compat.unwrap_filesystem(fs).type_name
    return _SCHEMES.get(name, name)


def check_tf_opens(what: str, fs: pafs.FileSystem, path: str, registered: Iterable[str] = CORE_SCHEMES) -> None:
    """Raise ``TFRecordError`` naming ``path``'s scheme, what TensorFlow opens here and the ways out, when
    none of TensorFlow's ``registered`` file systems opens ``fs``'s paths."""
    scheme = tf_scheme(fs)
    opens = sorted(set(registered))
    if scheme in opens:
        return
    shown = ", ".join(["local paths", *(f"{s}://" for s in opens if s not in ("", "file"))])
    raise TFRecordError(f"{what} reads with TensorFlow's own file ops, which have no file system for "
                        f"'{scheme}://' here (they open {shown}; S3 and HDFS left TensorFlow for tensorflow-io, "
                        "which does not load on TensorFlow 2.18 and later); feed the plan through ResumableFeed "
                        "or tf_dataset, which read it with pyarrow, or copy the files to local disk or gs:// and "
                        "plan those", path=path if scheme == "" or "://" in path else f"{scheme}://{path}")
