"""TensorFlow-native reads refuse, when built, a plan on a file system TensorFlow cannot open."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import tensorflow as tf

from ray_tfrecord import TFRecordError
from ray_tfrecord._src.data.feed.splits import Split, SplitPlan
from ray_tfrecord._src.tf.tf_filesystems import CORE_SCHEMES, check_tf_opens
from ray_tfrecord.tf import ps_trainer, tfrecord_dataset

S3_MESSAGE = ("s3://bkt/d/part-0: tfrecord_dataset reads with TensorFlow's own file ops, which have no file system "
              "for 's3://' here (they open local paths, gs://, ram://; S3 and HDFS left TensorFlow for "
              "tensorflow-io, which does not load on TensorFlow 2.18 and later); feed the plan through "
              "ResumableFeed or tf_dataset, which read it with pyarrow, or copy the files to local disk or gs:// "
              "and plan those")


def _plan(fs: pafs.FileSystem, path: str) -> SplitPlan:
    return SplitPlan((Split(path, 0, 100, 3, 100),), pa.schema([("x", pa.int64())]), fs, None)


def _s3() -> pafs.FileSystem:
    return pafs.S3FileSystem(anonymous=True, region="us-east-1")  # constructing it reaches no server


def test_an_s3_plan_fails_when_tfrecord_dataset_is_called_naming_the_scheme_and_the_ways_out():
    with pytest.raises(TFRecordError) as info:
        tfrecord_dataset(_plan(_s3(), "bkt/d/part-0"), feature_columns="x", batch_size=2)
    assert str(info.value) == S3_MESSAGE
    with pytest.raises(tf.errors.UnimplementedError, match="File system scheme 's3' not implemented"):
        tf.io.gfile.exists("s3://bkt/d/part-0")  # what the first batch raised before


def test_the_registered_schemes_are_the_ones_assumed_without_tensorflow_and_gcs_passes():
    # ps_trainer's driver checks against CORE_SCHEMES, without TensorFlow: they must be this TensorFlow's.
    assert sorted(tf.io.gfile.get_registered_schemes()) == sorted(CORE_SCHEMES)
    check_tf_opens("tfrecord_dataset", pafs.GcsFileSystem(anonymous=True), "bkt/d/part-0",
                   tf.io.gfile.get_registered_schemes())
    check_tf_opens("tfrecord_dataset", pafs.LocalFileSystem(), "/tmp/d/part-0")


def test_ps_trainer_refuses_an_s3_plan_in_its_config_before_starting_anything():
    with pytest.raises(TFRecordError, match="^s3://bkt/d/part-0: ps_trainer reads with TensorFlow's own file ops"):
        ps_trainer(lambda config: None, num_workers=1, train_loop_config={"plan": _plan(_s3(), "bkt/d/part-0")})
