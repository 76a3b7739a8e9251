"""ray_tfrecord: TFRecord as a first-class Ray Data format, and a feed into TensorFlow training.

```python
import ray
import ray_tfrecord

ds = ray.data.from_items([{"number": n % 3, "word": f"w{n}"} for n in range(10)])
ray_tfrecord.write_tfrecords(ds, "/tmp/words", partition_cols=["number"], mode="overwrite")
assert ray_tfrecord.read_tfrecords("/tmp/words").count() == 10
```

The codec, framing and schema names need only pyarrow and numpy; Ray loads when a name that needs it is
first used. [`ResumableFeed`][ray_tfrecord.ResumableFeed] over [`plan_splits`][ray_tfrecord.plan_splits] is the
resumable feed for any training loop (NumPy or Arrow batches, no TensorFlow). The TensorFlow side (feeds, the
resumable feed's ``tf.data`` adapter, the trainer, inference) is ``ray_tfrecord.tf``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from ._src.core.manifest import ConflictError
from ._src.core.options import RayTaskOptions
from ._src.core.public import lazy_names as _lazy_names
from ._src.core.schema import infer_schema
from ._src.core.spec_export import tfmd_schema

if TYPE_CHECKING:
    from ._src.data.feed.images import ImageError, ImageTransform
    from ._src.data.feed.order import SEED_COLUMN
    from ._src.data.feed.random_access import TFRecordSource
    from ._src.data.feed.resumable import ResumableFeed
    from ._src.data.feed.splits import SplitPlan, plan_splits
    from ._src.data.feed.transforms import WEIGHT_COLUMN, TransformError
    from ._src.data.progress import set_stall_timeout
    from ._src.data.read.datasource import TFRecordDatasource, read_tfrecords
    from ._src.data.write.datasink import TFRecordDatasink, write_tfrecords

# Ray loads only when a name that needs it is first used.
_LAZY = {
    "read_tfrecords": "ray_tfrecord._src.data.read.datasource",
    "TFRecordDatasource": "ray_tfrecord._src.data.read.datasource",
    "write_tfrecords": "ray_tfrecord._src.data.write.datasink",
    "TFRecordDatasink": "ray_tfrecord._src.data.write.datasink",
    "set_stall_timeout": "ray_tfrecord._src.data.progress",
    "ImageTransform": "ray_tfrecord._src.data.feed.images",
    "ImageError": "ray_tfrecord._src.data.feed.images",
    # The resumable feed's columns and its transform's error: a transform running on a node without
    # TensorFlow imports them from here.
    "SEED_COLUMN": "ray_tfrecord._src.data.feed.order",
    "WEIGHT_COLUMN": "ray_tfrecord._src.data.feed.transforms",
    "TransformError": "ray_tfrecord._src.data.feed.transforms",
    # The resumable feed for any training loop (NumPy or Arrow batches), and its plan: no TensorFlow.
    "ResumableFeed": "ray_tfrecord._src.data.feed.resumable",
    "plan_splits": "ray_tfrecord._src.data.feed.splits",
    "SplitPlan": "ray_tfrecord._src.data.feed.splits",
    # Random access by global index (Grain, PyTorch map-style): no TensorFlow.
    "TFRecordSource": "ray_tfrecord._src.data.feed.random_access",
}

__all__ = [
    "BYTE_ARRAY_SCHEMA", "SEED_COLUMN", "WEIGHT_COLUMN", "ConflictError", "CorruptRecordError", "DecodeError",
    "Decoder", "EncodedRecords", "Encoder", "ImageError", "ImageTransform", "NotTFRecordError", "RayTaskOptions",
    "RecordType", "RecordWriter", "ResumableFeed", "SchemaError", "SplitPlan", "StallError", "TFRecordDatasink",
    "TFRecordDatasource",
    "TFRecordError", "TransformError", "check_encodable", "decode", "decode_records", "encode", "infer_schema",
    "iter_chunks", "open_stream", "plan_splits", "read_tfrecords", "set_stall_timeout", "write_tfrecords",
    "TFRecordSource", "tfmd_schema",
]


__getattr__, __dir__ = _lazy_names(__name__, _LAZY, globals())
