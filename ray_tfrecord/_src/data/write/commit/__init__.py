"""The commit of a write: ``protocol`` (the steps the datasink drives), ``log`` (a version committed against
other writers, and what expired versions leave), ``stores`` (each store's create-if-absent)."""

from ray_tfrecord._src.data.write.commit.protocol import (
    Commit,
    StagedFile,
    TFRecordWriteResult,
    checkpoint_file_base,
    make_dirs,
)

__all__ = ["Commit", "StagedFile", "TFRecordWriteResult", "checkpoint_file_base", "make_dirs"]
