"""Line coverage of the native codec's units over several lcov files (one per fuzz target): a line
counts as covered when any target executed it. Prints each unit, the total, and the functions never
executed. module.c (the Python glue) is not fuzzed, so it is not in the reports."""

from __future__ import annotations

import os
import sys


def main(paths: list[str]) -> None:
    hits: dict[tuple[str, int], int] = {}
    funcs: set[tuple[str, str]] = set()
    fcalls: dict[tuple[str, str], int] = {}
    for path in paths:
        source = ""
        for line in open(path):
            tag, _, rest = line.strip().partition(":")
            if tag == "SF":
                source = os.path.basename(rest)
            elif tag == "DA":
                no, count = rest.split(",")[:2]
                hits[source, int(no)] = hits.get((source, int(no)), 0) + int(count)
            elif tag == "FN":
                funcs.add((source, rest.split(",", 1)[1].rsplit(":", 1)[-1]))  # static ones carry "file.c:"
            elif tag == "FNDA":
                count, name = rest.split(",", 1)
                key = (source, name.rsplit(":", 1)[-1])
                fcalls[key] = fcalls.get(key, 0) + int(count)
    for label in sorted({s for s, _ in hits}) + ["all units"]:
        lines = [n for (s, _), n in hits.items() if label in (s, "all units")]
        covered = sum(1 for n in lines if n)
        print(f"{label}: {covered}/{len(lines)} lines covered ({100 * covered / max(1, len(lines)):.1f}%)")
    never = sorted(f"{s}:{n}" for s, n in funcs if not fcalls.get((s, n)))
    print("functions never executed:", ", ".join(never) or "none")


if __name__ == "__main__":
    main(sys.argv[1:])
