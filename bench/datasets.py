"""The benchmark datasets, generated once into bench/data/ and reused.

- ``tabular``: 25 features per record: 10 int64 scalars, 8 float scalars, 4 short-string scalars,
  one variable-length int64 list (0-20 values), one 32-float embedding, one int64 label.
- ``image``: 784 int64 pixel values (0-255) per record plus an int64 label, like MNIST.

Files are framed by ``tf.io.TFRecordWriter`` (4 files per dataset), so every reader in the
benchmark reads bytes TensorFlow wrote.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

DATA = Path(__file__).parent / "data"
VERSION = 1
FILES = 4


def tabular_table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    cols: dict[str, pa.Array] = {}
    for i in range(10):
        cols[f"i{i}"] = pa.array(rng.integers(-(10 ** (i + 1)), 10 ** (i + 1), n), pa.int64())
    for i in range(8):
        cols[f"f{i}"] = pa.array(rng.standard_normal(n).astype(np.float32))
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"], dtype=object)
    for i in range(4):
        cols[f"s{i}"] = pa.array(words[rng.integers(0, len(words), n)], pa.binary())
    lengths = rng.integers(0, 21, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    cols["ids"] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 1 << 40, offsets[-1])))
    emb = rng.standard_normal(n * 32).astype(np.float32)
    cols["embedding"] = pa.FixedSizeListArray.from_arrays(pa.array(emb), 32)
    cols["label"] = pa.array(rng.integers(0, 2, n), pa.int64())
    return pa.table(cols)


def image_table(n: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, n * 784).astype(np.int64)
    return pa.table({"pixels": pa.FixedSizeListArray.from_arrays(pa.array(pixels), 784),
                     "label": pa.array(rng.integers(0, 10, n), pa.int64())})


def tf_feature_spec(schema: pa.Schema) -> dict:
    """The tf.io.parse_example spec that reads a benchmark schema as our codec does."""
    import tensorflow as tf

    def dtype(t: pa.DataType):
        return tf.int64 if pa.types.is_integer(t) else tf.float32 if pa.types.is_floating(t) else tf.string

    spec = {}
    for f in schema:
        if pa.types.is_fixed_size_list(f.type):
            spec[f.name] = tf.io.FixedLenFeature([f.type.list_size], dtype(f.type.value_type))
        elif pa.types.is_list(f.type):
            spec[f.name] = tf.io.RaggedFeature(dtype(f.type.value_type))
        else:
            spec[f.name] = tf.io.FixedLenFeature([], dtype(f.type))
    return spec


@dataclass
class BenchContext:
    tabular_dir: str
    image_dir: str
    tabular_schema: pa.Schema
    image_schema: pa.Schema
    tabular_rows: int
    image_rows: int
    tmp: str

    def files(self, dataset: str) -> list[str]:
        d = self.tabular_dir if dataset == "tabular" else self.image_dir
        return sorted(str(p) for p in Path(d).glob("*.tfrecord"))

    def bytes(self, dataset: str) -> int:
        return sum(os.path.getsize(f) for f in self.files(dataset))

    def repeated(self, dataset: str, passes: int) -> list[str]:
        """The dataset's files ``passes`` times over, under distinct names (see :func:`repeated`)."""
        return repeated(self.files(dataset), Path(self.tmp) / "passes" / dataset, passes)


def repeated(files: list[str], directory: Path, passes: int) -> list[str]:
    """``files`` ``passes`` times over, under distinct names (hard links in ``directory``): a reader
    given one path twice may read it once (ray_tfrecord does), so a repeated list of the same paths
    would time less data than it claims."""
    out = []
    for k in range(passes):
        d = directory / f"{k:02d}"
        d.mkdir(parents=True, exist_ok=True)
        for f in files:
            link = d / Path(f).name
            if not link.exists():
                try:
                    os.link(f, link)
                except OSError:  # a filesystem without hard links
                    shutil.copyfile(f, link)
            out.append(str(link))
    return out


def _write_with_tensorflow(table: pa.Table, directory: Path) -> None:
    import io

    import tensorflow as tf

    from ray_tfrecord import encode, iter_chunks

    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-table.num_rows // FILES)
    for k in range(FILES):
        part = table.slice(k * per_file, per_file)
        enc = encode(part)
        with tf.io.TFRecordWriter(str(directory / f"part-{k:05d}.tfrecord")) as w:
            for chunk in iter_chunks(io.BytesIO(bytes(enc.data)), path="mem"):
                for i in range(len(chunk)):
                    w.write(bytes(chunk.record(i)))


def prepare(tabular_rows: int = 100_000, image_rows: int = 20_000) -> BenchContext:
    """Generate (or reuse) the datasets and return the context every benchmark module receives."""
    root = DATA / f"v{VERSION}-{tabular_rows}-{image_rows}"
    tables = {"tabular": lambda: tabular_table(tabular_rows), "image": lambda: image_table(image_rows)}
    for name, make in tables.items():
        d = root / name
        if not (d / "_DONE").exists():
            _write_with_tensorflow(make(), d)
            (d / "_DONE").touch()
    tmp = root / "tmp"
    tmp.mkdir(exist_ok=True)
    return BenchContext(str(root / "tabular"), str(root / "image"), tabular_table(1).schema, image_table(1).schema,
                        tabular_rows, image_rows, str(tmp))
