"""Each shared option type is validated in one place; every entry point gives the same message."""

import enum

import pytest

from ray_tfrecord import options


@pytest.mark.parametrize("value", options.RECORD_TYPES)
def test_record_types_pass_through(value):
    assert options.record_type(value) == value


@pytest.mark.parametrize("check, bad", [
    (options.record_type, "example"),
    (options.on_corrupt, "ignore"),
    (options.mode, "overwrite!"),
    (lambda v: options.compression(v), "auto"),
    (lambda v: options.compression(v, allow_auto=True), "snappy"),
])
def test_bad_values_name_the_option_and_the_choices(check, bad):
    with pytest.raises(ValueError, match=r"must be one of .*; got " + repr(bad)):
        check(bad)


def test_compression_auto_only_where_allowed():
    assert options.compression("auto", allow_auto=True) == "auto"
    assert options.compression(None) is None
    assert [options.compression(c) for c in options.COMPRESSIONS] == ["gzip", "zlib"]


def test_mode_accepts_enum_members_by_value():
    class Saved(enum.Enum):
        APPEND = "append"

    assert options.mode(Saved.APPEND) == "append"
    assert options.mode("ignore") == "ignore"
