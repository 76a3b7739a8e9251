"""``ray-tfrecord``: inspect, verify, index and convert TFRecord datasets.

Examples::

    ray-tfrecord inspect s3://bucket/train/            # schema, counts, files, partitions, rows
    ray-tfrecord verify /data/train                    # full CRC scan; exit 1 on damage
    ray-tfrecord index /data/train                     # write split-index sidecars
    ray-tfrecord convert data.parquet out/ --partition-by day --compression gzip

Per-file work (counting, verifying, indexing, converting) runs as Ray Data jobs, so
it is parallel and shows Ray's progress bars. Exit codes: 0 success, 1 damaged data
found (``verify``) or a file could not be indexed (``index``), 2 usage errors.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Dict, List, Optional

import pyarrow.fs as pafs

import ray

from ray_tfrecord import options
from ray_tfrecord.datasink import write_tfrecords
from ray_tfrecord.datasource import TFRecordDatasource
from ray_tfrecord.errors import TFRecordError
from ray_tfrecord.framing import CorruptionReport, iter_chunks, open_stream
from ray_tfrecord.index import DEFAULT_SPACING_BYTES, build_index, write_index
from ray_tfrecord.listing import DataFile, list_files

_READERS = {
    "parquet": lambda src: ray.data.read_parquet(src),
    "csv": lambda src: ray.data.read_csv(src),
    "json": lambda src: ray.data.read_json(src),
}


def _ensure_ray(num_cpus: Optional[int]) -> None:
    if not ray.is_initialized():
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def _rows(files: List[DataFile]) -> List[Dict[str, Any]]:
    """One Ray Data row per file, for the per-file jobs."""
    return [{"path": f.path, "size": f.size} for f in files]


def _cmd_inspect(args) -> int:
    source = TFRecordDatasource(args.path, record_type=args.record_type, verify_crc=False)
    files = source.listing.files
    schema = source.output_schema()
    print(f"files: {len(files)} ({sum(f.size for f in files)} bytes)")
    for f in files[: args.files]:
        print(f"  {f.path}  {f.size} bytes")
    if len(files) > args.files:
        print(f"  ... {len(files) - args.files} more")
    if len(source.listing.partition_schema):
        print("partitions:")
        for field in source.listing.partition_schema:
            values = sorted({dict(f.partitions)[field.name] for f in files}, key=repr)
            shown = ", ".join(map(repr, values[:10])) + (" ..." if len(values) > 10 else "")
            print(f"  {field.name}: {field.type} ({len(values)} values: {shown})")
    print("schema:")
    for field in schema:
        print(f"  {field.name}: {field.type}")
    _ensure_ray(args.num_cpus)
    ds = ray.data.read_datasource(source)
    print(f"records: {ds.count()}")
    print(f"first {args.rows} rows:")
    for row in ds.take(args.rows):
        print("  " + json.dumps({k: _shorten(v) for k, v in row.items()}, default=_jsonable))
    return 0


def _shorten(value: Any, keep: int = 8) -> Any:
    """A long list shows its first values and its length (an image row is 784 numbers)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and len(value) > keep:
        return [_shorten(v) for v in value[:keep]] + [f"... ({len(value)} values)"]
    if isinstance(value, list):
        return [_shorten(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _verify_file(row: Dict[str, Any], filesystem: pafs.FileSystem) -> Dict[str, Any]:
    report = CorruptionReport(max_samples=100)
    records = 0
    try:
        stream, found = open_stream(row["path"], filesystem, "auto")
        with contextlib.closing(stream):
            for chunk in iter_chunks(stream, path=row["path"], on_corrupt="skip", report=report,
                                     compressed=bool(found)):
                records += len(chunk)
    except TFRecordError as e:  # a broken compressed stream cannot be resynchronised
        report.add(row["path"], e.offset if e.offset is not None else -1, str(e))
    return {"path": row["path"], "records": records, "bad": report.count,
            "samples": json.dumps(report.samples)}


def _cmd_verify(args) -> int:
    listing = list_files(args.path, partitioning=None)
    _ensure_ray(args.num_cpus)
    fs = listing.filesystem
    results = ray.data.from_items(_rows(listing.files)).map(_verify_file, fn_kwargs={"filesystem": fs}).take_all()
    bad = [r for r in results if r["bad"]]
    print(f"verified {len(results)} files, {sum(r['records'] for r in results)} good records, "
          f"{sum(r['bad'] for r in bad)} corrupt")
    for r in sorted(bad, key=lambda r: r["path"]):
        for path, offset, reason in json.loads(r["samples"]):
            print(f"CORRUPT {path} offset {offset}: {reason}")
    return 1 if bad else 0


def _index_file(row: Dict[str, Any], filesystem: pafs.FileSystem, spacing: int) -> Dict[str, Any]:
    try:
        index = build_index(filesystem, row["path"], spacing_bytes=spacing)
    except TFRecordError as e:
        return {"path": row["path"], "status": f"error: {e}", "records": -1}
    if index is None:
        return {"path": row["path"], "status": "skipped (compressed)", "records": -1}
    write_index(filesystem, row["path"], index)
    return {"path": row["path"], "status": "indexed", "records": index.num_records}


def _cmd_index(args) -> int:
    listing = list_files(args.path, partitioning=None)
    _ensure_ray(args.num_cpus)
    results = (
        ray.data.from_items(_rows(listing.files))
        .map(_index_file, fn_kwargs={"filesystem": listing.filesystem, "spacing": args.spacing})
        .take_all()
    )
    for r in sorted(results, key=lambda r: r["path"]):
        print(f"{r['status']}: {r['path']}" + (f" ({r['records']} records)" if r["records"] >= 0 else ""))
    return 1 if any(r["status"].startswith("error") for r in results) else 0


def _cmd_convert(args) -> int:
    fmt = args.format or _guess_format(args.src)
    _ensure_ray(args.num_cpus)
    ds = _READERS[fmt](args.src)
    result = write_tfrecords(
        ds,
        args.dst,
        record_type=args.record_type,
        partition_cols=args.partition_by.split(",") if args.partition_by else None,
        compression=None if args.compression == "none" else args.compression,
        mode=args.mode,
        max_rows_per_file=args.max_rows_per_file,
        allow_float64_narrowing=args.allow_float64_narrowing,
    )
    if result.skipped:
        print(f"{args.dst} exists; nothing written (mode=ignore)")
    else:
        print(f"wrote {result.num_rows} records in {result.num_files} files to {args.dst}")
    return 0


def _guess_format(src: str) -> str:
    for fmt, suffixes in (("parquet", (".parquet", ".pq")), ("csv", (".csv",)),
                          ("json", (".json", ".jsonl"))):
        if src.rstrip("/").lower().endswith(suffixes):
            return fmt
    raise SystemExit(f"cannot tell the format of {src!r}; pass --format parquet|csv|json")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ray-tfrecord", description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    sub = parser.add_subparsers(dest="command", required=True)
    record_types = list(options.RECORD_TYPES)

    p = sub.add_parser("inspect", help="schema, record count, files, partitions, first rows")
    p.add_argument("path")
    p.add_argument("--record-type", default="Example", choices=record_types)
    p.add_argument("--rows", type=int, default=5)
    p.add_argument("--files", type=int, default=10, help="files to list")
    p.set_defaults(fn=_cmd_inspect)

    p = sub.add_parser("verify", help="full CRC scan; exit 1 and list bad file/offsets on damage")
    p.add_argument("path")
    p.set_defaults(fn=_cmd_verify)

    p = sub.add_parser("index", help="write index sidecars so reads can split large files")
    p.add_argument("path")
    p.add_argument("--spacing", type=int, default=DEFAULT_SPACING_BYTES, help="bytes between checkpoints")
    p.set_defaults(fn=_cmd_index)

    p = sub.add_parser("convert", help="Parquet / CSV / JSON -> TFRecord through Ray Data")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--format", choices=sorted(_READERS))
    p.add_argument("--partition-by", help="comma-separated partition columns")
    p.add_argument("--compression", default="none", choices=["none", *options.COMPRESSIONS])
    p.add_argument("--record-type", default="Example", choices=record_types)
    p.add_argument("--mode", default="error", choices=list(options.MODES))
    p.add_argument("--max-rows-per-file", type=int)
    p.add_argument("--allow-float64-narrowing", action="store_true",
                   help="write float64 columns as float32 (TFRecord has no float64)")
    p.set_defaults(fn=_cmd_convert)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point of the ``ray-tfrecord`` console script."""
    args = _parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"ray-tfrecord {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
