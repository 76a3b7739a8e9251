"""Hadoop glob patterns in input paths: the syntax, and a matcher per path component.

The syntax is Hadoop's (``org.apache.hadoop.fs.GlobPattern``, as Spark reads it):

- ``*`` matches any run of characters and ``?`` one character, never ``/`` (``**`` is ``*``);
- ``[abc]``, ``[a-z]``, ``[^a]`` or ``[!a]`` match one character of (or not of) a set;
- ``{a,b}`` matches either alternative; alternatives nest and may hold ``/``
  (``{2024/01,2023/12}``), which Hadoop's ``GlobExpander`` allows too;
- ``\\`` makes the next character literal (``a\\[1\\].tfrecord``).

Unlike ``fnmatch``, a pattern is matched one path component at a time, so that listing walks
only the directories that can match. Names starting with ``.`` or ``_`` (``_SUCCESS``,
``_temporary``, index sidecars) are matched only by a component that starts with that character
written out: ``*`` skips them as a directory listing does, ``_tmp*`` finds them.

    >>> glob = parse_glob("/data/date=2024-0[1-3]/part-*")
    >>> glob.base
    '/data'
    >>> [c if isinstance(c, str) else c.pattern for c in glob.branches[0]][:2]
    ['', 'data']
    >>> glob.branches[0][2].fullmatch("date=2024-02") is not None
    True
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

from ray_tfrecord._src.core.errors import TFRecordError

# What makes a path a pattern (Hadoop's ``hasWildcard`` characters, and the escape).
_GLOB_CHARS = frozenset("*?[{\\")
# Placed before every wildcard: at a name's first character, a wildcard does not match "." or
# "_" (``^`` is the component's start; elsewhere the lookahead always passes).
_NOT_HIDDEN = r"(?!^[._])"
_BACKSLASH_FIX = "write '\\\\' for a literal backslash"

# A path component: a literal name, or a pattern its names must ``fullmatch``.
Component = Union[str, "re.Pattern[str]"]

# The parsed pattern: a sequence of items, each a literal character, "/" or a wildcard.
# ("sep",), ("star",), ("any",), ("lit", character), ("set", regex) or ("alt", branches).
_Item = tuple
_SEP, _STAR, _ANY = ("sep",), ("star",), ("any",)


@dataclass(frozen=True)
class Glob:
    """A parsed glob: its base directory and the component patterns to walk below it."""

    pattern: str
    # The directory before the first component holding a wildcard or ``{``, unescaped ("" for a
    # relative pattern that starts with one, "/" for an absolute one).
    base: str
    # One component list per alternative left after expanding the ``{}`` that hold "/"; a
    # leading "" component marks an absolute path.
    branches: tuple[tuple[Component, ...], ...]


def is_glob(path: str) -> bool:
    """Whether ``path`` holds a glob character (``*?[{`` or the ``\\`` escape)."""
    return not _GLOB_CHARS.isdisjoint(path)


def parse_glob(pattern: str) -> Glob:
    """Parse a Hadoop glob. Raises ``TFRecordError`` naming the pattern for a malformed one
    (an unclosed ``[`` or ``{``, an empty range, a trailing ``\\``)."""
    items, _ = _parse(pattern, 0, nested=False)
    branches = tuple(_components(flat) for flat in _expand(items))
    return Glob(pattern, _base(items), branches)


def _error(pattern: str, reason: str, fix: str) -> TFRecordError:
    # Only paths that do not exist as written are parsed: say so, the user may have meant a file.
    return TFRecordError(f"no such path, and not a valid glob: {reason}; {fix}", path=pattern)


def _parse(p: str, i: int, *, nested: bool) -> tuple[list[_Item], int]:
    """Items from ``p[i:]`` up to the end, or inside ``{}`` up to the next "," or "}" of this level."""
    items: list[_Item] = []
    while i < len(p):
        c = p[i]
        if c == "\\":
            if i + 1 == len(p):
                raise _error(p, "it ends with '\\'", _BACKSLASH_FIX)
            items.append(_SEP if p[i + 1] == "/" else ("lit", p[i + 1]))
            i += 2
        elif nested and c in ",}":
            return items, i
        elif c == "[":
            regex, i = _parse_set(p, i)
            items.append(("set", regex))
        elif c == "{":
            branches = []
            j = i + 1
            while True:
                branch, j = _parse(p, j, nested=True)
                branches.append(tuple(branch))
                if j == len(p):
                    raise _error(p, f"the '{{' at character {i + 1} is not closed",
                                 "close it with '}', or write '\\{' for a literal '{'")
                j += 1
                if p[j - 1] == "}":
                    break
            items.append(("alt", tuple(branches)))
            i = j
        else:
            items.append({"/": _SEP, "*": _STAR, "?": _ANY}.get(c, ("lit", c)))
            i += 1
    return items, i


def _parse_set(p: str, start: int) -> tuple[str, int]:
    """The regex of the ``[...]`` at ``p[start]``, and the index after it."""
    i = start + 1
    negate = i < len(p) and p[i] in "^!"
    i += negate
    parts: list[str] = []

    def char(i: int) -> tuple[str, int]:
        if i == len(p) or p[i] == "/":
            where = " before the next '/'" if i < len(p) else ""
            raise _error(p, f"the '[' at character {start + 1} is not closed{where}",
                         "close it with ']', or write '\\[' for a literal '['")
        if p[i] == "\\":
            if i + 1 == len(p):
                raise _error(p, "it ends with '\\'", _BACKSLASH_FIX)
            return p[i + 1], i + 2
        return p[i], i + 1

    # A "]" first in the set is a member (POSIX), so "[]]" is a set of "]".
    while i == len(p) or p[i] != "]" or not parts:
        lo, i = char(i)
        if i + 1 < len(p) and p[i] == "-" and p[i + 1] != "]":
            hi, i = char(i + 1)
            if hi < lo:
                raise _error(p, f"the range '{lo}-{hi}' is empty", f"write it low to high, '{hi}-{lo}'")
            parts.append(f"{re.escape(lo)}-{re.escape(hi)}")
        else:
            parts.append(re.escape(lo))
    return "[" + "^" * negate + "".join(parts) + "]", i + 1


def _holds_sep(items) -> bool:
    return any(it == _SEP or (it[0] == "alt" and any(map(_holds_sep, it[1]))) for it in items)


def _expand(items) -> list[list[_Item]]:
    """``items`` with every ``{}`` that holds a "/" replaced by each alternative in turn; the
    others stay, matched within one component."""
    flats: list[list[_Item]] = [[]]
    for it in items:
        if it[0] == "alt" and any(map(_holds_sep, it[1])):
            options = [e for branch in it[1] for e in _expand(branch)]
        else:
            options = [[it]]
        flats = [f + o for f in flats for o in options]
    return flats


def _components(items: list[_Item]) -> tuple[Component, ...]:
    parts: list[list[_Item]] = [[]]
    for it in items:
        if it == _SEP:
            parts.append([])
        else:
            parts[-1].append(it)
    # "a//b" and a trailing "/" name the same directories as "a/b"; a leading "" stays.
    parts = parts[:1] + [part for part in parts[1:] if part]
    return tuple(_component(part) for part in parts)


def _component(items: list[_Item]) -> Component:
    if all(it[0] == "lit" for it in items):
        return "".join(it[1] for it in items)
    return re.compile(_regex(items), re.DOTALL)


def _regex(items) -> str:
    out = []
    for it in items:
        if it == _STAR:
            out.append(_NOT_HIDDEN + "[^/]*")
        elif it == _ANY:
            out.append(_NOT_HIDDEN + "[^/]")
        elif it[0] == "lit":
            out.append(re.escape(it[1]))
        elif it[0] == "set":
            out.append(_NOT_HIDDEN + it[1])
        else:
            out.append("(?:" + "|".join(_regex(branch) for branch in it[1]) + ")")
    return "".join(out)


def _base(items: list[_Item]) -> str:
    """The literal directory before the first component with a wildcard or ``{}``."""
    literal: list[str] = []
    for it in items:
        if it[0] not in ("sep", "lit"):
            break
        literal.append("/" if it == _SEP else it[1])
    text = "".join(literal)
    cut = text.rfind("/")
    return "/" if cut == 0 else text[:max(cut, 0)]
