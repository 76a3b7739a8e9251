"""How big the pieces are: chunks of records decoded at once, file ranges, blocks and writes.

Every layer takes its sizes from here, so one number has one name and one reason. They are
tuning, not format: none changes what is read or written, only how it is cut up.
"""

from __future__ import annotations

MiB = 1 << 20

#: Encoded bytes decoded per block in a read task: decoding into a few MiB at a time is ~1.5x
#: faster than one huge buffer (fresh pages fault in as a large output grows), and image-like data
#: grows ~5x when decoded, which still leaves blocks well under Ray's target block size.
READ_CHUNK_BYTES = 4 * MiB
#: On an object store a read task opens the files after the one it decodes ahead of time, a round trip
#: each: their first reads (a file's first this many bytes, so a small file whole, in one request)...
OBJECT_FIRST_READ_BYTES = 8 * MiB
#: ...up to this many bytes ahead in all (and at least the next file).
OBJECT_READ_AHEAD_BYTES = 64 * MiB
#: Chunk of a plain ``iter_chunks`` call (the CLI, ``decode_records``' callers, users' loops).
STREAM_CHUNK_BYTES = 2 * MiB
#: Chunk read on the driver to check an explicit schema or infer one: a sample, not a block.
SAMPLE_CHUNK_BYTES = 1 * MiB
#: Bytes read from the raw file at a time under GZIP/ZLIB (TensorFlow's compression buffer size).
COMPRESSED_READ_BYTES = 256 << 10

#: A file is cut into ranges only if each range gets at least this many bytes: smaller ranges
#: cost more in task overhead than they gain in parallelism.
MIN_SPLIT_BYTES = 16 * MiB
#: Ray's target block size when its DataContext sets none.
TARGET_BLOCK_BYTES = 128 * MiB
#: Index sidecars record a record boundary about this often.
INDEX_SPACING_BYTES = 256 << 10

#: Input gathered per write task (so per file, unless a size or row limit cuts earlier)...
MIN_BYTES_PER_WRITE = 128 * MiB
#: ...but at most 1/this of the cluster's object store.
STORE_SHARE_PER_WRITE = 16
