"""ray_tfrecord: TFRecord as a first-class Ray Data format, and a feed into TensorFlow training.

Example::

    import ray
    import ray_tfrecord

    ds = ray.data.from_items([{"number": n % 3, "word": f"w{n}"} for n in range(10)])
    ray_tfrecord.write_tfrecords(ds, "/tmp/words", partition_cols=["number"], mode="overwrite")
    assert ray_tfrecord.read_tfrecords("/tmp/words").count() == 10

The codec, framing and schema names need only pyarrow and numpy; Ray loads when a name that needs it is
first used. The TensorFlow side (feeds, the resumable feed, the trainer, inference) is ``ray_tfrecord.tf``.
"""

import warnings
from importlib import import_module

from ._src.core.codec import (
    BYTE_ARRAY_SCHEMA,
    Decoder,
    EncodedRecords,
    Encoder,
    RecordType,
    check_encodable,
    decode,
    decode_records,
    encode,
)
from ._src.core.errors import (
    CorruptRecordError,
    DecodeError,
    NotTFRecordError,
    SchemaError,
    StallError,
    TFRecordError,
)
from ._src.core.framing import RecordWriter, iter_chunks, open_stream
from ._src.core.schema import infer_schema

# Ray loads only when a name that needs it is first used.
_LAZY = {
    "read_tfrecords": "._src.io.datasource",
    "TFRecordDatasource": "._src.io.datasource",
    "write_tfrecords": "._src.io.datasink",
    "TFRecordDatasink": "._src.io.datasink",
    "list_files": "._src.io.listing",
    "set_stall_timeout": "._src.io.progress",
    "ImageTransform": "._src.io.images",
    "ImageError": "._src.io.images",
    # The resumable feed's columns and its transform's error: a transform running on a node without
    # TensorFlow imports them from here.
    "SEED_COLUMN": "._src.io.order",
    "WEIGHT_COLUMN": "._src.io.transforms",
    "TransformError": "._src.io.transforms",
}

# Names that moved to ray_tfrecord.tf; they keep working, with a warning, until 0.2.
_MOVED = {"tf_dataset": "ray_tfrecord.tf"}

__all__ = [
    "BYTE_ARRAY_SCHEMA", "CorruptRecordError", "DecodeError", "Decoder", "EncodedRecords", "Encoder",
    "NotTFRecordError", "RecordType", "RecordWriter", "SchemaError", "StallError", "TFRecordError", "check_encodable",
    "decode",
    "decode_records", "encode", "infer_schema", "iter_chunks", "open_stream", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    if name in _MOVED:
        warnings.warn(f"ray_tfrecord.{name} moved: from {_MOVED[name]} import {name} (the old name goes in 0.2)",
                      FutureWarning, stacklevel=2)
        return getattr(import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
