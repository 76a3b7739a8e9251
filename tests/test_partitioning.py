"""Hive partitioning: what the writer encodes, the reader decodes back, typed."""

import pyarrow as pa
import pytest
from ray.data.datasource import Partitioning

from ray_tfrecord._src.core.layout import HIVE_NULL_PARTITION
from ray_tfrecord._src.data.partitioning import hive_directory, parse_partitions, split_by_partitions

SPECIAL = ["a/b", "x=y", "100%", "two words", "São Paulo", "?&#", "", "__HIVE", ".hidden", "_under"]


def _round_trip(rows):
    """Encode each row's values as a directory, decode all directories together."""
    paths = [f"/root/{hive_directory(row)}/part-0.tfrecord" for row in rows]
    schema, values = parse_partitions(paths)
    return schema, [dict(v) for v in values]


@pytest.mark.parametrize(
    "values, arrow_type",
    [
        ([3, -7, 0, None, 2**62], pa.int64()),
        ([1.5, -2.0, 1e-05, None], pa.float64()),
        ([True, False, None], pa.bool_()),
        (["007", "us", None], pa.string()),  # a code with a leading zero is not a number
        (SPECIAL + [None], pa.string()),
    ],
)
def test_encode_then_decode_gives_back_typed_values(values, arrow_type):
    rows = [{"k": v, "n": i} for i, v in enumerate(values)]
    schema, decoded = _round_trip(rows)
    assert schema == pa.schema([("k", arrow_type), ("n", pa.int64())])
    assert decoded == rows


def test_null_spelling_and_quoting():
    assert hive_directory({"a": None, "b": True, "c": "a/b"}) == f"a={HIVE_NULL_PARTITION}/b=true/c=a%2Fb"


def test_split_by_partitions_groups_rows_and_drops_the_columns():
    table = pa.table({"p": ["x/y", None, "x/y", None], "q": [1, 1, 2, 1], "v": [0, 1, 2, 3]})
    pieces = {d: t.to_pydict() for d, t in split_by_partitions(table, ["p", "q"])}
    assert pieces == {
        "p=x%2Fy/q=1": {"v": [0]},
        "p=x%2Fy/q=2": {"v": [2]},
        f"p={HIVE_NULL_PARTITION}/q=1": {"v": [1, 3]},
    }
    # ...and decoding the directories gives the values back.
    _, decoded = _round_trip([{"p": "x/y", "q": 2}, {"p": None, "q": 1}])
    assert decoded == [{"p": "x/y", "q": 2}, {"p": None, "q": 1}]
    assert list(split_by_partitions(table, [])) == [("", table)]


def test_explicit_field_types_and_no_partitioning():
    paths = ["/r/code=007/f", "/r/code=12/f"]
    schema, values = parse_partitions(paths, Partitioning("hive", field_types={"code": str}))
    assert schema.field("code").type == pa.string()
    assert [dict(v)["code"] for v in values] == ["007", "12"]
    assert parse_partitions(paths, None) == (pa.schema([]), [(), ()])


def test_a_key_missing_from_some_paths_is_null_there():
    schema, values = parse_partitions(["/r/a=1/f", "/r/b=x/f"])
    assert schema.names == ["a", "b"]
    assert values == [(("a", 1), ("b", None)), (("a", None), ("b", "x"))]


def test_relative_paths_parse_as_their_absolute_ones():
    # A glob's files are parsed relative to its dataset root: "run=3" above it is no column.
    relative = ["year=2021/f", "year=2022/g", "h"]
    schema, values = parse_partitions(relative)
    assert schema == pa.schema([("year", pa.int64())])
    assert values == [(("year", 2021),), (("year", 2022),), (("year", None),)]
    assert parse_partitions([f"/d/run=3/data/{p}" for p in relative])[0].names == ["run", "year"]
