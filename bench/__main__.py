"""Run the benchmarks and print one table: our figures beside the peers', same run, same files.

    python -m bench                      # everything
    python -m bench --only codec,ray_io  # some sections
    python -m bench --quick              # smaller datasets, for a smoke run
    python -m bench --only codec --threads 1,2,4   # decode on these thread counts (default 1, 2, 4, ... CPUs)
    python -m bench --chart-from docs/img/bench.json   # redraw the chart of a recorded run

Every run also writes its rows as JSON and Markdown and draws the headline chart (bench/report.py): by
default docs/img/bench.json, bench_table.md and bench.png, which the README and docs/benchmarks.md show.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SECTIONS = ["codec", "ray_io", "feed", "train", "resume", "soak", "plan", "images", "objectstore", "ps",
            "random_access"]
# Run only when named in --only: slow (scaling writes gigabytes of scratch files; races prints its own table).
OPTIONAL_SECTIONS = ["scaling", "races"]


def _fmt(v, digits=0):
    if v is None:
        return "—"
    return f"{v:,.{digits}f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench")
    ap.add_argument("--only", default=",".join(SECTIONS),
                    help="comma-separated sections: " + ", ".join(SECTIONS + OPTIONAL_SECTIONS))
    ap.add_argument("--quick", action="store_true", help="small datasets (smoke run)")
    ap.add_argument("--threads", type=lambda v: [int(t) for t in v.split(",")], default=None,
                    help="codec: comma-separated thread counts to decode on (default 1, 2, 4, ... up to the CPUs)")
    ap.add_argument("--out", default=None,
                    help="where bench.json and bench.png go (default docs/img/); --out '' writes neither")
    ap.add_argument("--machine", default=None,
                    help="the machine's name in the JSON and the chart (default: the host name)")
    ap.add_argument("--chart-from", type=Path, default=None, metavar="JSON",
                    help="redraw the chart and table of a recorded run (beside the JSON) and exit; runs nothing")
    args = ap.parse_args(argv)
    from . import report

    if args.chart_from:
        result = json.loads(args.chart_from.read_text())
        report.write_table(args.chart_from.with_name("bench_table.md"), result)
        report.draw(result, args.chart_from.with_suffix(".png"))
        return 0
    out = report.OUT if args.out is None else Path(args.out) if args.out else None
    machine = report.machine(args.machine)
    from .datasets import prepare

    ctx = prepare(10_000, 2_000) if args.quick else prepare()
    print(f"datasets: tabular {ctx.tabular_rows:,} rows ({ctx.bytes('tabular') / 1e6:.1f} MB), "
          f"image {ctx.image_rows:,} rows ({ctx.bytes('image') / 1e6:.1f} MB); {os.cpu_count()} CPUs", flush=True)
    rows = []
    for name in args.only.split(","):
        module = importlib.import_module(f"bench.{name}")
        t0 = time.perf_counter()
        section = module.run(ctx, args.threads) if name == "codec" else module.run(ctx)
        rows.extend(section)
        print(f"[{name}: {time.perf_counter() - t0:.0f}s]", file=sys.stderr, flush=True)
    print()
    print("| bench | dataset | implementation | rows/s | MB/s | note |")
    print("|---|---|---|---:|---:|---|")
    for r in rows:
        print(f"| {r['bench']} | {r['dataset']} | {r['impl']} | {_fmt(r.get('rows_per_s'))} | "
              f"{_fmt(r.get('mb_per_s'), 1)} | {r.get('note', '')} |")
    if out is not None:
        datasets = {"tabular": {"rows": ctx.tabular_rows, "mb": round(ctx.bytes("tabular") / 1e6, 1)},
                    "image": {"rows": ctx.image_rows, "mb": round(ctx.bytes("image") / 1e6, 1)}}
        result = report.write_json(out / "bench.json", rows, sys.argv[1:] if argv is None else argv, datasets,
                                   machine)
        report.draw(result, out / "bench.png")
        print(f"\nwrote {out / 'bench.json'}, {out / 'bench_table.md'} and {out / 'bench.png'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
