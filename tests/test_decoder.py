"""codec.Decoder: built once per schema, reused across chunks and threads; each chunk's batch is
assembled natively and owns its buffers, which its Arrow release callbacks hand back to the pool."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pytest

import ray_tfrecord
from ray_tfrecord._src.core import codec
from ray_tfrecord._src.core.errors import DecodeError, SchemaError
from ray_tfrecord._src.core.framing import RecordChunk, iter_chunks

SCHEMA = pa.schema([("id", pa.int64()), ("x", pa.float32()), ("s", pa.binary()), ("ids", pa.list_(pa.int64())),
                    ("e", pa.list_(pa.float32(), 3)), ("n", pa.list_(pa.null()))])


def table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = [None if k % 7 == 3 else rng.integers(0, 1000, int(rng.integers(0, 5))).tolist() for k in range(n)]
    return pa.table({
        "id": pa.array([None if k % 5 == 1 else int(v) for k, v in enumerate(rng.integers(-9, 9, n))], pa.int64()),
        "x": pa.array(rng.standard_normal(n).astype(np.float32)),
        "s": pa.array([bytes([k % 256]) * (k % 4) for k in range(n)], pa.binary()),
        "ids": pa.array(ids, pa.list_(pa.int64())),
        "e": pa.array([None if k % 3 == 0 else [k, k + 0.5, -k] for k in range(n)], pa.list_(pa.float32(), 3)),
        "n": pa.array([[] if k % 2 else None for k in range(n)], pa.list_(pa.null())),
    }, schema=SCHEMA)


def chunks_of(t: pa.Table, chunk_bytes: int = 4096) -> list:
    data = b"".join(bytes(codec.encode(b).data) for b in t.to_batches())
    return list(iter_chunks(io.BytesIO(data), path="m", chunk_bytes=chunk_bytes))


def test_decoder_is_exported_and_reused_across_chunks():
    assert ray_tfrecord.Decoder is codec.Decoder and "Decoder" in ray_tfrecord.__all__
    t = table(500, 1)
    chunks = chunks_of(t)
    assert len(chunks) > 3
    decoder = codec.Decoder(SCHEMA)
    batches = [decoder.decode(c) for c in chunks]
    assert all(b.schema == SCHEMA for b in batches)
    assert pa.Table.from_batches(batches).equals(t.combine_chunks())
    assert all(b.equals(codec.decode(c, SCHEMA)) for b, c in zip(batches, chunks))
    assert decoder.native_seconds > 0


def test_threads_decode_with_one_decoder_as_one_thread_does():
    chunks = [c for k in range(6) for c in chunks_of(table(300, k))]
    decoder = codec.Decoder(SCHEMA)
    alone = [decoder.decode(c) for c in chunks]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            together = list(pool.map(decoder.decode, chunks))
            assert all(a.equals(b) for a, b in zip(alone, together))


def test_a_batch_outlives_its_decoder_and_chunk():
    t = table(200, 2)
    (chunk,) = chunks_of(t, 1 << 20)
    decoder = codec.Decoder(SCHEMA)
    batch = decoder.decode(chunk)
    del decoder, chunk
    assert batch.equals(t.combine_chunks().to_batches()[0])


def test_schema_details_the_native_batch_lacks_are_kept():
    meta = pa.schema([pa.field("id", pa.int64(), metadata={"a": "b"}), pa.field("x", pa.float64()),
                      pa.field("s", pa.string(), nullable=False)], metadata={"k": "v"})
    t = pa.table({"id": [1, None], "x": [0.5, 2.0], "s": ["a", "b"]}, schema=meta)
    (chunk,) = chunks_of(t)
    batch = codec.Decoder(meta).decode(chunk)
    assert batch.schema.equals(meta, check_metadata=True) and batch.to_pydict() == t.to_pydict()
    tagged = pa.schema([pa.field("id", pa.int64())], metadata={"k": "v"})  # the batch as decoded, relabelled
    assert codec.Decoder(tagged).decode(chunk).schema.equals(tagged, check_metadata=True)
    missing = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    with pytest.raises(DecodeError, match="not nullable") as e:
        codec.Decoder(missing).decode(chunk)
    assert (e.value.column, e.value.offset) == ("id", chunk.offset(1))


def test_release_callbacks_hand_buffers_back_to_the_pool():
    # A fresh interpreter, so that the pool holds only this test's buffers.
    script = textwrap.dedent("""
        import io, resource, threading
        import pyarrow as pa
        from ray_tfrecord._src.core import _native, codec
        from ray_tfrecord._src.core.framing import iter_chunks

        rows = 400
        t = pa.table({"p": pa.FixedSizeListArray.from_arrays(pa.array(range(rows * 784), pa.int64()), 784)})
        (chunk,) = iter_chunks(io.BytesIO(bytes(codec.encode(t.to_batches()[0]).data)), path="m")
        decoder = codec.Decoder(t.schema)
        values = rows * 784 * 8
        batch = decoder.decode(chunk)
        held = _native.pool_held()
        del batch  # its release callback runs here
        assert _native.pool_held() >= held + values, (held, _native.pool_held())

        batch = decoder.decode(chunk)  # takes its buffer back from the pool
        held = _native.pool_held()
        assert batch.column(0).flatten().to_pylist() == list(range(rows * 784))
        box = [batch]
        del batch
        worker = threading.Thread(target=box.clear)  # dropped, and its thread ends, elsewhere
        worker.start()
        worker.join()
        assert _native.pool_held() >= held + values, (held, _native.pool_held())

        for _ in range(20):
            decoder.decode(chunk)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        for _ in range(300):
            decoder.decode(chunk)
        grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        assert grown < 64 << 10, grown  # KiB: 300 leaked batches would be 750 MB
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_decode_keeps_each_schemas_field_metadata():
    plain = pa.schema([pa.field("id", pa.int64())])
    tagged = pa.schema([pa.field("id", pa.int64(), metadata={"unit": "m"})])
    assert plain == tagged and hash(plain) == hash(tagged)  # what makes the decoder cache need a check
    (chunk,) = chunks_of(pa.table({"id": [1, 2]}))
    for schema in [plain, tagged, plain]:
        assert codec.decode(chunk, schema).schema.equals(schema, check_metadata=True)


def test_encoder_is_built_once_and_refuses_another_schema():
    t = table(50, 3)
    encoder = codec.Encoder(SCHEMA)
    assert ray_tfrecord.Encoder is codec.Encoder and "Encoder" in ray_tfrecord.__all__
    enc = encoder.encode(t)
    assert bytes(enc.data) == bytes(codec.encode(t).data) and len(enc) == 50
    (chunk,) = list(iter_chunks(io.BytesIO(bytes(enc.data)), path="m"))
    assert codec.Decoder(SCHEMA).decode(chunk).equals(t.combine_chunks().to_batches()[0])
    with pytest.raises(SchemaError, match="this encoder writes batches of"):
        encoder.encode(t.select(["id"]))
    with pytest.raises(SchemaError, match="column 'm'"):
        codec.Encoder(pa.schema([("m", pa.map_(pa.string(), pa.int64()))]))


def test_buffers_dropped_on_a_thread_that_only_uses_batches_go_back_to_the_decoder_thread():
    # The README's pattern: a decoder thread decodes, the main thread uses and drops the batches. The
    # main thread's frees must reach the decoder thread, else they are stranded in the main thread's
    # own slots (counted against the pool's bound, so recycling stops and every decode faults in
    # fresh pages). The main thread encodes first, as a writer would: it allocated too.
    script = textwrap.dedent("""
        import io
        from concurrent.futures import ThreadPoolExecutor
        import pyarrow as pa
        from ray_tfrecord._src.core import _native, codec
        from ray_tfrecord._src.core.framing import iter_chunks

        t = pa.table({"s": pa.array([bytes([65 + k % 26]) * 100_000 for k in range(400)], pa.binary())})  # 40 MB
        (chunk,) = iter_chunks(io.BytesIO(bytes(codec.encode(t.to_batches()[0]).data)), path="m",
                               chunk_bytes=1 << 30)
        decoder = codec.Decoder(t.schema)
        taken = []
        with ThreadPoolExecutor(1) as worker:
            for _ in range(12):
                before = _native.pool_held()
                batch = worker.submit(decoder.decode, chunk).result()
                taken.append(_native.pool_held() < before)  # the decode took its buffer from the pool
                del batch  # on the main thread
        assert all(taken[-6:]), taken
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_a_forked_child_counts_only_the_buffers_it_holds():
    # The worker keeps the one pooled buffer in its own slots; the child has no such thread, so its
    # pool holds nothing (counting the worker's bytes would shrink the child's pool for good).
    script = textwrap.dedent("""
        import io, os, threading
        import pyarrow as pa
        from ray_tfrecord._src.core import _native, codec
        from ray_tfrecord._src.core.framing import iter_chunks

        t = pa.table({"p": pa.FixedSizeListArray.from_arrays(pa.array([0] * 100 * 784, pa.int64()), 784)})
        (chunk,) = iter_chunks(io.BytesIO(bytes(codec.encode(t.to_batches()[0]).data)), path="m")
        assert _native.pool_held() == 0  # the 80 KB of records are too small for the pool
        decoded, done = threading.Event(), threading.Event()

        def work():
            batch = codec.Decoder(t.schema).decode(chunk)
            del batch  # 627 KB of values into this thread's slots
            decoded.set()
            done.wait()

        worker = threading.Thread(target=work)
        worker.start()
        decoded.wait()
        assert _native.pool_held() > 0
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, str(_native.pool_held()).encode())
            os._exit(0)
        os.close(w)
        child = int(os.read(r, 64))
        os.waitpid(pid, 0)
        done.set()
        worker.join()
        assert child == 0, child
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_byte_array_errors_name_the_file_and_offset():
    buf = np.zeros(1 << 20, np.uint8)
    # 2,100 records of ~1 MiB (all over the same bytes): more than one binary column holds
    huge = RecordChunk(buf, np.zeros(2100, np.int64), np.full(2100, (1 << 20) - 16, np.int64), 4096, "big.tfrecord")
    with pytest.raises(DecodeError) as e:
        codec.Decoder(codec.BYTE_ARRAY_SCHEMA, "ByteArray").decode(huge)
    assert (e.value.path, e.value.offset, e.value.column) == ("big.tfrecord", None, None)
    assert e.value.reason == "records exceed 2 GiB in one batch; read smaller chunks"
    outside = RecordChunk(buf, np.array([0, 1 << 20], np.int64), np.array([4, 4], np.int64), 4096, "bad.tfrecord")
    with pytest.raises(DecodeError, match="record span lies outside the buffer") as e:
        codec.decode(outside, codec.BYTE_ARRAY_SCHEMA, "ByteArray")
    assert (e.value.path, e.value.offset) == ("bad.tfrecord", outside.offset(1))
