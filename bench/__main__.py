"""Run the benchmarks and print one table: our figures beside the peers', same run, same files.

    python -m bench                      # everything
    python -m bench --only codec,ray_io  # some sections
    python -m bench --quick              # smaller datasets, for a smoke run
    python -m bench --only codec --threads 1,2,4   # decode on these thread counts (default 1, 2, 4, ... CPUs)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

SECTIONS = ["codec", "ray_io", "feed", "train", "soak", "images"]
# Run only when named in --only: slow, and they write gigabytes of scratch files.
OPTIONAL_SECTIONS = ["scaling"]


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
    args = ap.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
