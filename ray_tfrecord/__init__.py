"""ray_tfrecord: TFRecord as a first-class Ray Data format, and a feed into TensorFlow training.

Example::

    import ray
    import ray_tfrecord

    ds = ray.data.from_items([{"number": n % 3, "word": f"w{n}"} for n in range(10)])
    ray_tfrecord.write_tfrecords(ds, "/tmp/words", partition_cols=["number"], mode="overwrite")
    assert ray_tfrecord.read_tfrecords("/tmp/words").count() == 10

The format core (``ray_tfrecord.core``: ``codec``, ``framing``, ``schema``) needs only pyarrow and numpy; Ray and
TensorFlow are imported when the names that need them are first used.
"""

from importlib import import_module

from .core.codec import (
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
from .core.errors import CorruptRecordError, DecodeError, NotTFRecordError, SchemaError, TFRecordError
from .core.schema import infer_schema

# Ray and TensorFlow load only when a name that needs them is first used.
_LAZY = {
    "read_tfrecords": "io.datasource",
    "TFRecordDatasource": "io.datasource",
    "write_tfrecords": "io.datasink",
    "TFRecordDatasink": "io.datasink",
    "list_files": "io.listing",
    "tf_dataset": "tf.feed",
    "ImageTransform": "io.images", "ImageError": "io.images",
}

__all__ = [
    "BYTE_ARRAY_SCHEMA", "CorruptRecordError", "DecodeError", "Decoder", "EncodedRecords", "Encoder",
    "NotTFRecordError",
    "RecordType", "SchemaError", "TFRecordError", "check_encodable", "decode", "decode_records", "encode",
    "infer_schema", *_LAZY,
]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
