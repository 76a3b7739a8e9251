"""What every example starts with: its common flags, and Ray started (or joined, under ``ray job
submit``) with a console a person can read."""

from __future__ import annotations

import argparse
import logging
import tempfile

import _quiet_tf
import ray


def flags(doc: str, *, epochs: int, min_accuracy: float | None, workers: bool = True,
          min_accuracy_help: str | None = None) -> argparse.ArgumentParser:
    """``--out``, ``--workers`` (Ray Train workers), ``--epochs`` and ``--min-accuracy``; the example adds its own."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", help="output directory (default: a new temporary one)")
    if workers:
        parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--min-accuracy", type=float, default=min_accuracy, help=min_accuracy_help)
    return parser


def start(out: str | None, name: str) -> str:
    """Start Ray for the example; its output directory (``out``, or a new temporary one)."""
    _quiet_tf.plain_log()
    ray.init(runtime_env=_quiet_tf.ray_runtime_env())
    # Ray Data's warnings, not its INFO lines (each dataset's plan and progress, a dozen lines a write):
    # the examples say what they did themselves.
    logging.getLogger("ray.data").setLevel(logging.WARNING)
    ray.data.DataContext.get_current().print_on_execution_start = False
    return out or tempfile.mkdtemp(prefix=f"{name}_")


def check(what: str, accuracy: float, minimum: float) -> None:
    """Fail the example, and a job that runs it, when ``accuracy`` is below ``--min-accuracy``."""
    if accuracy < minimum:
        raise SystemExit(f"{what} {accuracy:.4f} < --min-accuracy {minimum}")
