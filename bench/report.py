"""A bench run's results as JSON, as a Markdown table and as a headline chart (PNG), in docs/img/ by default.

The JSON holds every row the run printed, with when, where and with what it ran, so the chart can
be drawn again (``python -m bench --chart-from docs/img/bench.json``) and the docs can quote one
dated run. A section too slow to rerun with the others (``objectstore``) is run alone and merged in,
its rows replacing that section's, with its own run line:

    python -m bench --only objectstore --out /tmp/objectstore
    python -m bench.report --merge /tmp/objectstore/bench.json docs/img/bench.json

The chart has one panel per benchmark and dataset that has a peer: every implementation's
rows/s in that run, ours in colour, on a log scale with each bar's ratio to ours, so each panel
compares figures taken minutes apart on the same files and machine.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import sys
from importlib import metadata
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "docs" / "img"
# The sections whose figures make the headline chart, in this order; others stay in the JSON only.
HEADLINE = ["codec", "ray_io", "feed", "train drain", "train fit", "images", "objectstore"]
OURS_COLOR, REFERENCE_COLOR, PEER_COLOR = "#d9480f", "#ffa94d", "#868e96"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def machine(name: str | None) -> dict:
    """Where the run happened: the name given (``--machine``) and what the OS says."""
    memory = _memory_gib()
    return {
        "name": name or platform.node(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "memory_gib": round(memory, 1) if memory else None,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        # Other work on the machine changes every figure; the docs quote the load beside the run.
        "load_avg_at_start": _load(),
    }


def _load() -> list[float] | None:
    return [round(v, 1) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def write_json(path: Path, rows: list[dict], argv: list[str], datasets: dict, machine_info: dict) -> dict:
    result = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": _command(argv),
        "machine": {**machine_info, "load_avg_at_end": _load()},
        "versions": {p: _version(p) for p in ("ray", "pyarrow", "numpy", "tensorflow", "ray_tfrecord")},
        "datasets": datasets,
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    write_table(path.with_name("bench_table.md"), result)
    return result


# Options that change where a run's files go or what its machine is called, not what it measures.
_UNMEASURED = ("--out", "--machine")


def _command(argv: list[str]) -> str:
    """The command that measures the same: ``python -m bench`` and ``argv`` without ``_UNMEASURED``."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _UNMEASURED:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _UNMEASURED)):
            kept.append(arg)
    return "python -m bench " + shlex.join(kept) if kept else "python -m bench"


def _fmt(v: float | None, digits: int = 0) -> str:
    return "—" if v is None else f"{v:,.{digits}f}"


def _run_line(result: dict) -> str:
    m, v = result["machine"], result["versions"]
    return (f"{result['date']}, `{result['command']}`, on {m['name']}: {m['cpus']} CPUs ({m['cpu']}), "
            f"{m['memory_gib']} GiB, {m['os']}, Python {m['python']}; load average (1, 5, 15 min) "
            f"{m['load_avg_at_start']} at the start, {m.get('load_avg_at_end') or 'not recorded'} at the end. "
            + ", ".join(f"{k} {val}" for k, val in v.items() if val) + ".")


def write_table(path: Path, result: dict) -> None:
    """The run as Markdown, which docs/benchmarks.md includes: when, where, with what, then every row.
    A ``note`` added to the JSON afterwards (what else ran on the machine) follows the run line; each
    section merged in from another run (:func:`merge`) gets that run's line."""
    d = result["datasets"]
    lines = [
        f"**Run:** {_run_line(result)} "
        + "; ".join(f"{name}: {x['rows']:,} rows, {x['mb']} MB" for name, x in d.items()) + "."
        + (f" {result['note']}" if result.get("note") else ""),
        *(f"\n**{', '.join(run['sections'])}, merged from its own run:** {_run_line(run)}"
          for run in result.get("merged", [])),
        "",
        "| bench | dataset | implementation | rows/s | MB/s | note |",
        "|---|---|---|---:|---:|---|",
    ]
    for r in result["rows"]:
        lines.append(f"| {r['bench']} | {r['dataset']} | {r['impl']} | {_fmt(r.get('rows_per_s'))} | "
                     f"{_fmt(r.get('mb_per_s'), 1)} | {r.get('note', '')} |")
    path.write_text("\n".join(lines) + "\n")


def merge(run: dict, into: dict) -> dict:
    """``into`` with the rows of ``run``'s sections replaced by ``run``'s, which keep ``run``'s date, command,
    machine and versions beside them (under ``"merged"``)."""
    sections = sorted({r["bench"] for r in run["rows"]})
    kept = [m for m in into.get("merged", []) if not set(m["sections"]) & set(sections)]
    own = {"sections": sections, **{k: run[k] for k in ("date", "command", "machine", "versions")}}
    return {**into, "rows": [r for r in into["rows"] if r["bench"] not in sections] + run["rows"],
            "merged": [*kept, own]}


def _ours(impl: str) -> bool:
    return "ray_tfrecord" in impl


def _reference(impl: str) -> bool:
    """A ceiling, neither ours-through-Ray nor a peer: our own codec outside Ray (ray_io's), or the
    images section's limit lines (one decoder thread's decodes times the cores)."""
    return impl.startswith(("in-process", "limit"))


def _color(impl: str) -> str:
    return OURS_COLOR if _ours(impl) else REFERENCE_COLOR if _reference(impl) else PEER_COLOR


def _operation(impl: str) -> tuple[str, str]:
    """What a row measures, so each peer is compared with ours doing the same: writing, reading or
    feeding Keras ``fit`` (the images section's "-> fit" rows), and the CPUs in the name's trailing
    parentheses ("(1 CPU)")."""
    if any(w in impl.lower() for w in ("encode", "write")):
        kind = "write"
    else:
        kind = "fit" if impl.endswith("-> fit") else "read"
    tag = impl.rsplit("(", 1)[1] if impl.endswith(")") and "CPU" in impl.rsplit("(", 1)[1] else ""
    return kind, tag


def _panels(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    panels: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        if r["bench"] in HEADLINE and r.get("rows_per_s"):
            panels.setdefault((r["bench"], r["dataset"]), []).append(r)
    ordered = sorted(panels.items(), key=lambda kv: HEADLINE.index(kv[0][0]))
    # A panel needs something to compare: ours and at least one peer.
    return [(f"{bench}, {dataset}", group) for (bench, dataset), group in ordered
            if any(_ours(r["impl"]) for r in group)
            and any(not _ours(r["impl"]) and not _reference(r["impl"]) for r in group)]


def _label(row: dict, group: list[dict]) -> str:
    """A bar's rows/s, and for a peer how many times as fast ours is at the same operation (the
    first of our rows for it, which is the one-thread or plain figure where there are several)."""
    text = f"{row['rows_per_s']:,.0f}"
    if not _ours(row["impl"]) and not _reference(row["impl"]):
        same = [r for r in group if _ours(r["impl"]) and _operation(r["impl"]) == _operation(row["impl"])]
        if same:
            text += f"  (ours: {same[0]['rows_per_s'] / row['rows_per_s']:.1f}x)"
    return text


def draw(result: dict, path: Path) -> None:
    """The headline PNG: a panel of horizontal bars (rows/s, log scale) per benchmark and dataset."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("python -m bench: drawing the chart needs matplotlib: pip install -e '.[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # A merged section's panels say which run they come from; the figure's title names the main one.
    dates = {section: run["date"] for run in result.get("merged", []) for section in run["sections"]}
    panels = [(title + (f" (its own run, {dates[group[0]['bench']]})" if group[0]["bench"] in dates else ""), group)
              for title, group in _panels(result["rows"])]
    if not panels:
        print(f"python -m bench: no section of this run has a peer to compare with; {path} left as it was",
              file=sys.stderr)
        return
    heights = [0.32 * len(group) + 0.9 for _, group in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(11, sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, group) in zip(axes[:, 0], panels):
        labels = [r["impl"] if len(r["impl"]) <= 70 else r["impl"][:67] + "..." for r in group]
        rates = [r["rows_per_s"] for r in group]
        colors = [_color(r["impl"]) for r in group]
        ax.barh(range(len(group)), rates, color=colors)
        ax.set_yticks(range(len(group)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        # A panel spanning about one decade would otherwise label its minor ticks, over each other.
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(title, fontsize=10, loc="left")
        for i, (rate, row) in enumerate(zip(rates, group)):
            ax.text(rate, i, " " + _label(row, group), va="center", fontsize=7)
        ax.set_xlim(min(rates) / 2, max(rates) * 10)
        ax.tick_params(axis="x", labelsize=8)
    m = result["machine"]
    fig.suptitle("rows/s, log scale: ray_tfrecord (orange; light: a ceiling, its codec alone or one decoder "
                 "thread x cores) and its peers (grey), same run, same files\n"
                 f"{result['date']}, {m['name']}: {m['cpus']} CPUs ({m['cpu']})\n{result['command']}",
                 fontsize=9, x=0.01, ha="left")
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / sum(heights)))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench.report")
    ap.add_argument("--merge", nargs=2, type=Path, metavar=("RUN", "INTO"), required=True,
                    help="put the sections of the run RUN (a bench.json) into INTO, replacing theirs, and redraw "
                         "INTO's table and chart beside it")
    run_path, into_path = ap.parse_args().merge
    merged = merge(json.loads(run_path.read_text()), json.loads(into_path.read_text()))
    into_path.write_text(json.dumps(merged, indent=1) + "\n")
    write_table(into_path.with_name("bench_table.md"), merged)
    draw(merged, into_path.with_suffix(".png"))
