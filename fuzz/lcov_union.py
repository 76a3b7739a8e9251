"""Line coverage of _native.c over several lcov files (one per fuzz target): a line counts as
covered when any target executed it. Prints the whole file, the C cores (everything but the
Python wrappers, which the fuzz targets do not call), and the core functions never executed."""

from __future__ import annotations

import sys

WRAPPERS = ("py_", "PyInit_", "nb_", "buf_to_py", "raise_err", "spans_", "maybe_buf", "get_opt_buffer")


def main(paths: list[str]) -> None:
    hits: dict[int, int] = {}
    funcs: dict[str, int] = {}  # name -> first line
    fcalls: dict[str, int] = {}
    for path in paths:
        for line in open(path):
            tag, _, rest = line.strip().partition(":")
            if tag == "DA":
                no, count = rest.split(",")[:2]
                hits[int(no)] = hits.get(int(no), 0) + int(count)
            elif tag == "FN":
                no, name = rest.split(",", 1)
                funcs[name.rsplit(":", 1)[-1]] = int(no)  # static functions carry a "file.c:" prefix
            elif tag == "FNDA":
                count, name = rest.split(",", 1)
                name = name.rsplit(":", 1)[-1]
                fcalls[name] = fcalls.get(name, 0) + int(count)
    starts = sorted((no, name) for name, no in funcs.items())
    def owner(line: int) -> str:
        name = ""
        for no, fn in starts:
            if no > line:
                break
            name = fn
        return name
    core = {no: n for no, n in hits.items() if not owner(no).startswith(WRAPPERS)}
    for label, lines in (("_native.c", hits), ("_native.c C cores (Python wrappers excluded)", core)):
        covered = sum(1 for n in lines.values() if n)
        print(f"{label}: {covered}/{len(lines)} lines covered ({100 * covered / max(1, len(lines)):.1f}%)")
    never = [n for _, n in starts if not fcalls.get(n) and not n.startswith(WRAPPERS)]
    print("core functions never executed:", ", ".join(never) or "none")


if __name__ == "__main__":
    main(sys.argv[1:])
