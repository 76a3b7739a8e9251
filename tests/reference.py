"""An independent reference for the native codec, built on TensorFlow's protobuf messages.

It decodes serialized records with protobuf's own parser (which implements every wire-format rule:
packed and unpacked scalars, unknown fields, last map key wins, oneof replacement) and encodes
Python rows by building ``tf.train.Example`` messages. The tests compare the native codec with it
and with TensorFlow's parsing ops.
"""

from __future__ import annotations

import pyarrow as pa
from tensorflow.core.example import example_pb2, feature_pb2

KIND_OF = {"int64_list": "int64", "float_list": "float32", "bytes_list": "binary"}


def feature_values(f: feature_pb2.Feature) -> tuple[str | None, list]:
    kind = f.WhichOneof("kind")
    if kind is None:
        return None, []
    return kind, list(getattr(f, kind).value)


def decode_example(payload: bytes) -> dict[str, tuple[str | None, list]]:
    ex = example_pb2.Example.FromString(payload)
    return {k: feature_values(v) for k, v in ex.features.feature.items()}


def decode_sequence_example(payload: bytes) -> tuple[dict, dict]:
    ex = example_pb2.SequenceExample.FromString(payload)
    context = {k: feature_values(v) for k, v in ex.context.feature.items()}
    lists = {k: [feature_values(f) for f in v.feature] for k, v in ex.feature_lists.feature_list.items()}
    return context, lists


def expected_column(rows: list[dict], name: str, t: pa.DataType) -> list:
    """What a column of type ``t`` must hold, from reference-decoded rows (None when missing)."""
    out = []
    for row in rows:
        if name not in row:
            out.append(None)
            continue
        _, values = row[name]
        if pa.types.is_list(t) and pa.types.is_list(t.value_type):
            out.append([v for _, v in values])
        elif pa.types.is_list(t) or pa.types.is_fixed_size_list(t):
            out.append(values)
        else:
            out.append(values[0])
    return out


def feature(kind: str, values: list) -> feature_pb2.Feature:
    if kind == "bytes_list":
        return feature_pb2.Feature(bytes_list=feature_pb2.BytesList(value=values))
    if kind == "float_list":
        return feature_pb2.Feature(float_list=feature_pb2.FloatList(value=values))
    if kind == "int64_list":
        return feature_pb2.Feature(int64_list=feature_pb2.Int64List(value=values))
    return feature_pb2.Feature()


def encode_example(features: dict[str, tuple[str, list]]) -> bytes:
    ex = example_pb2.Example()
    for name, (kind, values) in features.items():
        ex.features.feature[name].CopyFrom(feature(kind, values))
    return ex.SerializeToString()


def encode_sequence_example(context: dict, lists: dict) -> bytes:
    ex = example_pb2.SequenceExample()
    for name, (kind, values) in context.items():
        ex.context.feature[name].CopyFrom(feature(kind, values))
    for name, (kind, steps) in lists.items():
        fl = ex.feature_lists.feature_list[name]
        for values in steps:
            fl.feature.add().CopyFrom(feature(kind, values))
    return ex.SerializeToString()
