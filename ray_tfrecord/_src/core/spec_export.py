"""Arrow -> TensorFlow's schemas, the inverse of ``feature_specs``: the ``tf.io`` feature spec that parses
a column as it is read (``describe``, in plain values: ``ray_tfrecord.tf.feature_spec`` makes the
``tf.io`` objects), and the TFMD ``Schema`` of a dataset or an Arrow schema (``tfmd_schema``), whose
text ``record_tfmd`` writes beside the dataset's Arrow schema at each commit.

TensorFlow is not imported. The TFMD text is written here, not by ``tensorflow-metadata``, so a write
records it without the ``tfmd`` extra; ``tfmd_schema`` parses it into the proto, which needs the extra.
A TFMD feature says what TensorFlow Transform's ``schema_as_feature_spec`` (and ``schema=``) reads
back: a ``shape`` (with ``presence.min_fraction`` 1, which it requires) a ``FixedLenFeature``, no shape
a ``VarLenFeature``. So a dense column or a list column maps, and what a TFMD feature cannot say (a
default, a ragged column's partitions, SequenceExample feature lists) is refused naming the column.

    >>> print(schema_text(pa.schema([("x", pa.list_(pa.float32(), 2)), ("tokens", pa.list_(pa.int64()))])))
    feature {
      name: "x"
      type: FLOAT
      presence {
        min_fraction: 1.0
      }
      shape {
        dim {
          size: 2
        }
      }
    }
    feature {
      name: "tokens"
      type: INT
    }
    <BLANKLINE>
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs

from .errors import SchemaError
from .feature_specs import arrow_schema, feature_info, leaf_dtype_name
from .layout import TFMD_SCHEMA_FILE
from .options import RecordType
from .public import public
from .schema import RECORD_TYPE_KEY, read_stored_schema
from .types import is_var_list, leaf_type

_TFMD_TYPES = {"int64": "INT", "float32": "FLOAT", "string": "BYTES"}


@dataclass(frozen=True)
class Described:
    """The ``tf.io`` feature spec that parses a column as it is read, in plain values: ``kind`` the spec's
    class name, ``dtype`` its dtype's name, ``default`` a dense one's flat values, ``value_key`` and
    ``partitions`` (``(how, key or length)``, outermost first) a ``RaggedFeature``'s."""

    kind: str
    dtype: str
    shape: tuple[int, ...] = ()
    default: tuple[Any, ...] | None = None
    value_key: str | None = None
    partitions: tuple[tuple[str, Any], ...] = ()
    allow_missing: bool = False


def describe(f: pa.Field, default: Any = None, *, sequence: bool = False) -> Described:
    """The feature spec of column ``f`` (``sequence``: in a SequenceExample, where ``list<list<T>>`` is a
    feature list); ``default`` for a dense column whose field carries none.

    Raises ``SchemaError`` naming a column with no feature spec (``list<null>``, nested fixed-size lists).
    """
    t = _storage(f.type)
    leaf = leaf_type(t)
    if pa.types.is_null(leaf):
        raise SchemaError("a list<null> column holds no values of any kind and has no feature spec; leave it out",
                          column=f.name)
    dtype = leaf_dtype_name(leaf)
    info = feature_info(f) or {}
    if "values" in info:
        return Described("RaggedFeature", dtype, value_key=info["values"],
                         partitions=tuple((how, arg) for how, arg in info["partitions"]))
    if "step_size" in info:
        return Described("FixedLenSequenceFeature", dtype, _dense_shape(t.value_type, f.name),
                         allow_missing="default" in info)
    if is_var_list(t):
        if not sequence and not is_var_list(t.value_type) and info.get("default") == []:
            return Described("VarLenFeature", dtype)
        return Described("RaggedFeature", dtype)
    shape = _dense_shape(f.type, f.name)
    if "default" in info:
        default = [bytes.fromhex(v) for v in info["default"]] if dtype == "string" else info["default"]
    if default is not None:
        default = tuple(np.asarray(default, dtype=object).reshape(-1).tolist())
    return Described("FixedLenFeature", dtype, shape, default)


def schema_of(source: Any, record_type: RecordType | None = None) -> tuple[pa.Schema, RecordType]:
    """``source`` as an Arrow schema and the records it describes: a dataset directory's recorded schema
    (and record type), or anything ``schema=`` takes (of ``record_type``, else Example, records)."""
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        fs, root = pafs.FileSystem.from_uri(path) if "://" in path else (pafs.LocalFileSystem(), os.path.abspath(path))
        if fs.get_file_info(root).type == pafs.FileType.Directory:
            stored = read_stored_schema(fs, root)
            if stored is None:
                raise SchemaError("no schema is recorded here (write_tfrecords records one); pass a pyarrow.Schema",
                                  path=path)
            recorded = (stored.metadata or {}).get(RECORD_TYPE_KEY, b"Example").decode()
            return stored, record_type or cast(RecordType, recorded)
    kind: RecordType = record_type or "Example"
    return arrow_schema(source, kind), kind


def schema_text(schema: pa.Schema, record_type: RecordType = "Example") -> str:
    """The TFMD ``Schema`` of ``schema``'s columns in text format (``schema.pbtxt``), as ``text_format``
    writes it. Raises ``SchemaError`` naming a column a TFMD feature cannot describe."""
    if record_type != "Example":
        raise SchemaError("SequenceExample records have no TFMD Schema here (TFMD has no standard form for "
                          "feature lists that tf.io reads); use ray_tfrecord.tf.feature_spec, whose "
                          "(context_features, sequence_features) pair tf.io.parse_sequence_example takes")
    return "".join(_feature_text(f) for f in schema)


def _feature_text(f: pa.Field) -> str:
    d = describe(f)
    if d.kind == "FixedLenFeature" and d.default is not None:
        raise SchemaError("a FixedLenFeature's default_value has no TFMD form (TensorFlow Transform reads a feature "
                          "with a shape as required); give tf.data the feature spec (ray_tfrecord.tf.feature_spec) "
                          "or leave the default out", column=f.name)
    if d.kind == "RaggedFeature" and (d.partitions or d.value_key not in (None, f.name)):
        raise SchemaError("a RaggedFeature built from other features (value_key, partitions) has no TFMD feature "
                          "form; give tf.data the feature spec (ray_tfrecord.tf.feature_spec)", column=f.name)
    if d.kind == "FixedLenSequenceFeature" or (d.kind == "RaggedFeature" and is_var_list(_storage(f.type).value_type)):
        raise SchemaError("a list<list<T>> column is a SequenceExample feature list, which has no TFMD feature "
                          "form; give tf.data the feature spec (ray_tfrecord.tf.feature_spec)", column=f.name)
    lines = [f"  name: {_quoted(f.name)}", f"  type: {_TFMD_TYPES[d.dtype]}"]
    if d.kind == "FixedLenFeature":
        dims = "".join(f"    dim {{\n      size: {n}\n    }}\n" for n in d.shape)
        lines += ["  presence {\n    min_fraction: 1.0\n  }", f"  shape {{\n{dims}  }}"]
    return "feature {\n" + "\n".join(lines) + "\n}\n"


def _quoted(name: str) -> str:
    """``name`` as a text-format string: its UTF-8 bytes, C-escaped as protobuf's own writer escapes them."""
    out = []
    for b in name.encode("utf-8"):
        c = chr(b)
        out.append({'"': '\\"', "\\": "\\\\", "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or
                   (c if 0x20 <= b < 0x7F else f"\\{b:03o}"))
    return '"' + "".join(out) + '"'


@public("ray_tfrecord")
def tfmd_schema(source: pa.Schema | str | os.PathLike[str]) -> Any:
    """The TFMD ``Schema`` (``tensorflow_metadata``'s ``schema_pb2.Schema``) of a dataset or an Arrow schema:
    what TFX and TFDV load, and what ``read_tfrecords(schema=)`` reads back to the same values.

    ``source`` is a ``pyarrow.Schema`` or the directory of a dataset ``write_tfrecords`` wrote (its
    recorded schema; the write also records this schema's text there, as ``_tfrecord_schema.pbtxt``). A
    scalar, ``fixed_size_list`` or tensor column is a feature with its ``shape`` (required in every
    record, as TensorFlow Transform reads a shape: a ``FixedLenFeature``), a ``list`` column a feature
    without one (a ``VarLenFeature``); the type is ``INT``, ``FLOAT`` or ``BYTES`` as the column's values
    are written. Needs the ``tfmd`` extra (``pip install 'ray_tfrecord[tfmd]'``).

    Raises [`SchemaError`][ray_tfrecord.SchemaError] naming a column that a TFMD feature cannot describe:
    a default value, a ragged column built from other features, a SequenceExample feature list,
    ``list<null>``. [`feature_spec`][ray_tfrecord.tf.feature_spec] gives those their ``tf.io`` specs.

    Example:
        >>> import pyarrow as pa
        >>> schema = tfmd_schema(pa.schema([("label", pa.int64()), ("tokens", pa.list_(pa.int64()))]))
        >>> {f.name: f.HasField("shape") for f in schema.feature}
        {'label': True, 'tokens': False}
    """
    schema, record_type = schema_of(source) if not isinstance(source, pa.Schema) else (source, "Example")
    try:
        from google.protobuf import text_format
        from tensorflow_metadata.proto.v0 import schema_pb2
    except ImportError:
        raise ImportError("tfmd_schema returns a tensorflow_metadata Schema, which needs the tensorflow-metadata "
                          "package: pip install 'ray_tfrecord[tfmd]'") from None
    return text_format.Parse(schema_text(schema, record_type), schema_pb2.Schema())


def record_tfmd(filesystem: pafs.FileSystem, root: str, recorded: pa.Schema | None) -> None:
    """Keep ``TFMD_SCHEMA_FILE`` the text of the dataset's ``recorded`` Arrow schema: written when every
    column has a TFMD feature, removed otherwise (``recorded`` None: no schema is recorded either)."""
    path = posixpath.join(root, TFMD_SCHEMA_FILE)
    text = None
    if recorded is not None:
        kind = (recorded.metadata or {}).get(RECORD_TYPE_KEY, b"Example").decode()
        try:
            text = schema_text(recorded, cast(RecordType, kind))
        except SchemaError:
            text = None  # a column has no TFMD form: feature_spec still reads the Arrow schema
    if text is not None:
        with filesystem.open_output_stream(path, compression=None) as f:
            f.write(text.encode("utf-8"))
    else:
        # Racing committers may both delete it; the copy is written after the commit, which must not fail then.
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(path)


def _storage(t: pa.DataType) -> pa.DataType:
    return t.storage_type if isinstance(t, pa.BaseExtensionType) else t


def _dense_shape(t: pa.DataType, name: str) -> tuple[int, ...]:
    shape = getattr(t, "shape", None)
    if shape is not None:
        return tuple(int(d) for d in shape)
    storage = _storage(t)
    if pa.types.is_fixed_size_list(storage):
        if not (pa.types.is_fixed_size_list(storage.value_type) or is_var_list(storage.value_type)):
            return (storage.list_size,)
    elif not is_var_list(storage):
        return ()
    raise SchemaError(f"type {t} has no feature spec (a scalar, fixed-size list, tensor or list column has)",
                      column=name)
