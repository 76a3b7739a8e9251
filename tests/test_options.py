"""Each shared option type is validated in one place; every entry point gives the same message."""

import enum
import re

import pytest

from ray_tfrecord._src.core import options


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


@pytest.mark.parametrize("level", [-1, 0, 1, 9])
def test_compression_levels_are_zlibs(level):
    assert options.compression_level(level, "gzip") == level
    assert options.compression_level(None, None) is None


@pytest.mark.parametrize("bad", [10, -2, True, 5.0, "9"])
def test_compression_level_outside_zlibs_range_is_refused(bad):
    with pytest.raises(ValueError, match=r"compression_level must be an integer from 0 \(fastest\) to 9 \(smallest\), "
                                         r"or -1 for zlib's default; got " + re.escape(repr(bad))):
        options.compression_level(bad, "zlib")


def test_compression_level_without_compression_is_refused_not_ignored():
    with pytest.raises(ValueError, match=r"^compression_level=9 applies to compressed files only; pass "
                                         r"compression='gzip' or 'zlib' as well, or leave compression_level unset$"):
        options.compression_level(9, None)
