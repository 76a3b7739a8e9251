"""Exceptions raised by ray_tfrecord. Every one names where the problem is."""

from __future__ import annotations

from .public import public


@public("ray_tfrecord")
class TFRecordError(ValueError):
    """Base class: a problem with TFRecord data, located by file, byte offset and column.

    ``offset`` is the byte offset of the record's header in the file (in the decompressed stream
    for GZIP/ZLIB files); ``column`` is the feature name where one is involved; ``reason`` is the
    message without the location.
    """

    def __init__(self, message: str, *, path: str | None = None, offset: int | None = None,
                 column: str | None = None) -> None:
        where = []
        if path is not None:
            where.append(str(path))
        if offset is not None:
            where.append(f"offset {offset}")
        if column is not None:
            where.append(f"column {column!r}")
        self.message = f"{', '.join(where)}: {message}" if where else message
        super().__init__(self.message)
        self.reason = message
        self.path = path
        self.offset = offset
        self.column = column

    def __str__(self) -> str:
        # Ray Data appends its retry advice to ``args`` of any exception leaving a task; the
        # message stays what this package said.
        return self.message


@public("ray_tfrecord")
class CorruptRecordError(TFRecordError):
    """The framing is broken: a truncated record, a CRC mismatch or a damaged compressed stream."""


@public("ray_tfrecord")
class NotTFRecordError(CorruptRecordError):
    """The file's first bytes are not a TFRecord record header (a Parquet, CSV or text file)."""


@public("ray_tfrecord")
class DecodeError(TFRecordError):
    """A record's protobuf is malformed, or a feature does not fit its column (kind or count)."""


@public("ray_tfrecord")
class SchemaError(TFRecordError):
    """A schema cannot be inferred or an Arrow type cannot be written as TFRecord."""


@public("ray_tfrecord")
class StallError(RuntimeError):
    """A job that cannot make progress: the cluster cannot hold its actors and a task at once (raised
    before the job starts), or nothing of it ran for ``set_stall_timeout``'s time (raised while it
    runs). The message names what waits, for which resources, what holds them, and the fix."""
