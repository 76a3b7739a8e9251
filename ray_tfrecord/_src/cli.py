"""ray-tfrecord: inspect, verify, index and convert TFRecord datasets.

examples:
  ray-tfrecord inspect s3://bucket/train/    schema, counts, files, partitions, first rows
  ray-tfrecord verify /data/train            full CRC scan; exit 1 on damage
  ray-tfrecord index /data/train             write index sidecars so reads can split files
  ray-tfrecord convert data.parquet out/ --partition-by day --compression gzip
  ray-tfrecord convert data.parquet out/ --num-files 128 --file-prefix train
  ray-tfrecord clean gs://bucket/train/ --dry-run   what killed writes left behind
  ray-tfrecord tensorboard /tmp/runs/my_run/tensorboard   TensorBoard on a training run's logs

Per-file work (counting, verifying, indexing, converting) runs as Ray Data jobs, so it is
parallel and shows Ray Data's progress bars. Exit codes: 0 success; 1 damaged data (a corrupt
record, a file that is not TFRecord) or a file that could not be indexed; 2 usage errors (the
message says which option to change).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import logging
import os
import posixpath
import re
import subprocess
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from ray.data import DataContext

from ray_tfrecord._src.core import options, sizes
from ray_tfrecord._src.core.errors import CorruptRecordError, StallError, TFRecordError
from ray_tfrecord._src.core.framing import CorruptionReport, iter_chunks, open_stream
from ray_tfrecord._src.core.index import build_index, dataset_root, write_index
from ray_tfrecord._src.core.manifest import explain_missing, is_object_store
from ray_tfrecord._src.core.schema import read_stored_schema, tensor_hints
from ray_tfrecord._src.data import compat, filesystems
from ray_tfrecord._src.data.read.datasource import TFRecordDatasource
from ray_tfrecord._src.data.read.listing import DataFile, Listing, list_files
from ray_tfrecord._src.data.task_errors import task_cause
from ray_tfrecord._src.data.write import dataset_files
from ray_tfrecord._src.data.write.commit import log
from ray_tfrecord._src.data.write.commit.protocol import DEFAULT_KEEP_REPLACED_S
from ray_tfrecord._src.data.write.datasink import write_tfrecords

_READERS = {
    "parquet": lambda src: ray.data.read_parquet(src),
    "csv": lambda src: ray.data.read_csv(src),
    "json": lambda src: ray.data.read_json(src),
}


def _ensure_ray(num_cpus: int | None) -> None:
    if ray.is_initialized():
        return
    # --num-cpus asks for a local Ray of that size: a new one, since ray.init() would otherwise join
    # a cluster `ray start` left on this machine and refuse num_cpus there. Without it, ray.init()
    # joins RAY_ADDRESS or that cluster, as Ray's own commands do.
    address = "local" if num_cpus is not None else None
    ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def _console_without_errors() -> None:
    """The CLI prints a failed job's error as one line; Ray Data would also log it on the
    console with its traceback. Those records stay in Ray Data's log file; progress and
    warnings still reach the console."""
    for handler in logging.getLogger("ray.data").handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.addFilter(lambda record: record.levelno < logging.ERROR)


def _rows(files: list[DataFile]) -> list[dict[str, Any]]:
    """One Ray Data row per file, for the per-file jobs."""
    return [{"path": f.path, "size": f.size} for f in files]


def _recorded_schema(listing: Listing, record_type: str) -> tuple[pa.Schema | None, str | None]:
    """The schema ``write_tfrecords`` recorded for the dataset that the listed path is, or is
    part of, and that dataset's root; ``(None, None)`` when none is recorded.

    The schema sits at the dataset root, so a file or a partition directory inside a dataset has
    none of its own: read alone, a ``string`` column would be inferred as ``binary`` (TFRecord
    stores both as bytes), and a file would disagree with its directory."""
    if len(listing.roots) != 1:
        return None, None
    path = listing.roots[0]
    # The path's own root when it is a directory (and, for a file, nothing); then the root of
    # the dataset holding it, less trailing Hive ``key=value`` directories.
    for root in dict.fromkeys([dataset_root(posixpath.join(path, "")), dataset_root(path)]):
        schema = read_stored_schema(listing.filesystem, root, options.record_type(record_type))
        if schema is not None:
            return schema.remove_metadata(), root
    return None, None


# The rows inspect reads to tell whether a bytes column holds serialized tensors (tensor_hints).
_TENSOR_SAMPLE_ROWS = 20


def _cmd_inspect(args) -> int:
    recorded, root = _recorded_schema(list_files(args.path, partitioning=None), args.record_type)
    with warnings.catch_warnings():
        # The schema is the dataset's, not a spelling of the caller's: a column that this
        # file's first records lack (sparse, or null in this partition) is no misspelling.
        warnings.filterwarnings("ignore", message=r"schema fields .* are in none of the first")
        source = TFRecordDatasource(args.path, record_type=args.record_type, schema=recorded)
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
    print(f"schema (recorded for the dataset at {root}):" if recorded is not None
          else "schema (inferred from a sample of the records; none recorded):")
    for field in schema:
        print(f"  {field.name}: {field.type}")
    _ensure_ray(args.num_cpus)
    ds = ray.data.read_datasource(source)
    print(f"records: {ds.count()}")
    sample = ds.take(max(args.rows, _TENSOR_SAMPLE_ROWS))
    print(f"first {args.rows} rows:")
    for row in sample[: args.rows]:
        print("  " + json.dumps({k: _shorten(v) for k, v in row.items()}, default=_jsonable))
    for hint in tensor_hints(schema, sample):
        print(hint)
    return 0


def _shorten(value: Any, keep: int = 8, keep_bytes: int = 32) -> Any:
    """A long list shows its first values and its length (an image row is 784 numbers); a long
    string or blob its first bytes and its length (an encoded image is kilobytes)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, list) and len(value) > keep:
        return [_shorten(v) for v in value[:keep]] + [f"... ({len(value)} values)"]
    if isinstance(value, list):
        return [_shorten(v) for v in value]
    if isinstance(value, str) and len(value) > keep_bytes:
        return f"{value[:keep_bytes]}... ({len(value)} characters)"
    if isinstance(value, bytes) and len(value) > keep_bytes:
        head = value[:keep_bytes]
        text = head.decode("utf-8", "replace")
        shown = text if text.isprintable() else head[:16].hex(" ")
        return f"{shown}... ({len(value)} bytes)"
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)


def _verify_file(row: dict[str, Any], filesystem: pafs.FileSystem) -> dict[str, Any]:
    report = CorruptionReport(max_samples=100)
    records = 0
    with explain_missing(filesystem, row["path"]):
        stream, found = open_stream(row["path"], filesystem, "auto")
    with contextlib.closing(stream):
        for chunk in iter_chunks(stream, path=row["path"], on_corrupt="skip", report=report,
                                 compressed=bool(found)):
            records += len(chunk)
    return {"path": row["path"], "records": records, "bad": report.count,
            "samples": json.dumps(report.samples)}


def _cmd_verify(args) -> int:
    listing = list_files(args.path, partitioning=None)
    _ensure_ray(args.num_cpus)
    fs = listing.filesystem
    results = ray.data.from_items(_rows(listing.files)).map(functools.partial(_verify_file, filesystem=fs)).take_all()
    bad = [r for r in results if r["bad"]]
    print(f"verified {len(results)} files, {sum(r['records'] for r in results)} good records, "
          f"{sum(r['bad'] for r in bad)} corrupt")
    for r in sorted(bad, key=lambda r: r["path"]):
        for path, offset, reason in json.loads(r["samples"]):
            print(f"CORRUPT {path} offset {offset}: {reason}")
    return 1 if bad else 0


def _index_file(row: dict[str, Any], filesystem: pafs.FileSystem, spacing: int) -> dict[str, Any]:
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
        .map(functools.partial(_index_file, filesystem=listing.filesystem, spacing=args.spacing))
        .take_all()
    )
    for r in sorted(results, key=lambda r: r["path"]):
        print(f"{r['status']}: {r['path']}" + (f" ({r['records']} records)" if r["records"] >= 0 else ""))
    return 1 if any(r["status"].startswith("error") for r in results) else 0


def _cmd_clean(args) -> int:
    paths, fs = filesystems.resolve_paths([args.path], None)
    fs, path = compat.retrying_filesystem(fs), paths[0].rstrip("/")
    # orphans() finds nothing in a path that is not there, which would read as a clean dataset.
    kind = fs.get_file_info(path).type
    if kind == pafs.FileType.NotFound:
        raise FileNotFoundError(f"{args.path} does not exist, so there is nothing to clean; check the path")
    if kind != pafs.FileType.Directory:
        raise ValueError(f"{args.path} is a file; pass the dataset directory that holds it")
    # Files replaced within --keep-replaced may still be read by reads planned before their replacement.
    found = dataset_files.orphans(fs, path, kept=frozenset(log.replaced_recently(fs, path, args.keep_replaced)))
    for p in found:
        print(f"{'would delete' if args.dry_run else 'deleting'}: {p}")
    if not args.dry_run:
        dataset_files.remove(fs, found)
        local = not is_object_store(compat.unwrap_filesystem(fs))
        log.expire(fs, path, args.keep_replaced, local=local)
        dataset_files.remove_empty_first_version(fs, path, local=local)
    print(f"{len(found)} left by killed or failed writes{' (dry run: nothing deleted)' if args.dry_run else ''}")
    return 0


def _cmd_convert(args) -> int:
    fmt = args.format or _guess_format(args.src)
    if args.compression_level is not None and args.compression == "none":
        raise ValueError("--compression-level applies to compressed files only; add --compression gzip or "
                         "--compression zlib")
    _ensure_ray(args.num_cpus)
    ds = _READERS[fmt](args.src)
    result = write_tfrecords(
        ds,
        args.dst,
        record_type=args.record_type,
        partition_cols=args.partition_by.split(",") if args.partition_by else None,
        compression=None if args.compression == "none" else args.compression,
        compression_level=args.compression_level,
        mode=args.mode,
        min_rows_per_file=args.min_rows_per_file,
        max_rows_per_file=args.max_rows_per_file,
        num_files=args.num_files,
        file_prefix=args.file_prefix,
        allow_float64_narrowing=args.allow_float64_narrowing,
        allow_decimal_narrowing=args.allow_decimal_narrowing,
    )
    if result.skipped:
        print(f"{args.dst} exists; nothing written (mode=ignore)")
    else:
        print(f"wrote {result.num_rows} records in {result.num_files} files to {args.dst}")
    return 0


def _cmd_tensorboard(args) -> int:
    if importlib.util.find_spec("tensorboard") is None:
        raise ValueError("TensorBoard is not installed here; pip install tensorboard, or open the logs "
                         f"where it is: tensorboard --logdir {args.logdir}")
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", args.logdir, "--port", str(args.port)]
    return subprocess.call(command + (["--bind_all"] if args.bind_all else []))


def _guess_format(src: str) -> str:
    for fmt, suffixes in (("parquet", (".parquet", ".pq")), ("csv", (".csv",)),
                          ("json", (".json", ".jsonl"))):
        if src.rstrip("/").lower().endswith(suffixes):
            return fmt
    raise SystemExit(f"cannot tell the format of {src!r}; pass --format parquet|csv|json")


def _compression_level(text: str) -> int:
    try:
        level = int(text)
        options.compression_level(level, "gzip")
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 0 (fastest) to 9 (smallest), or -1 for zlib's default; "
                                         f"got {text!r}") from None
    return level


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}")
    return value


def _parser() -> argparse.ArgumentParser:
    # Global options are accepted before and after the subcommand: each subparser has them
    # too, and SUPPRESS keeps a subcommand's unset copy from erasing the value given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--num-cpus", type=int, default=argparse.SUPPRESS,
                        help="CPUs for the local Ray this command starts (default: all)")
    parser = argparse.ArgumentParser(prog="ray-tfrecord", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, parents=[common])
    parser.set_defaults(flags={})  # the commands without a flag for a library keyword
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                help="what to do; `ray-tfrecord COMMAND --help` lists its options")
    record_types = list(options.RECORD_TYPES)
    path_help = ("a TFRecord file, a directory of them (read recursively) or a quoted Hadoop glob "
                 "('data/part-*'); local, s3://, gs://, ...")
    record_type_help = "what each record holds: tf.train.Example, SequenceExample or raw bytes (default: Example)"

    p = sub.add_parser("inspect", parents=[common], help="schema, record count, files, partitions, first rows",
                       description="Show the schema, record count, files, partitions and first rows; "
                                   "exit 1 if a record is corrupt.")
    p.add_argument("path", help=path_help)
    p.add_argument("--record-type", default="Example", choices=record_types, help=record_type_help)
    p.add_argument("--rows", type=int, default=5, help="rows to show (default: 5)")
    p.add_argument("--files", type=int, default=10, help="files to list (default: 10)")
    p.set_defaults(fn=_cmd_inspect)

    p = sub.add_parser("verify", parents=[common], help="full CRC scan; exit 1 and list bad file/offsets on damage",
                       description="Check every record's CRCs; print each damaged file and offset and exit 1 "
                                   "on damage.")
    p.add_argument("path", help=path_help)
    p.set_defaults(fn=_cmd_verify)

    p = sub.add_parser("index", parents=[common], help="write index sidecars so reads can split large files",
                       description="Write an index sidecar for each uncompressed file so that reads can split "
                                   "it into byte ranges.")
    p.add_argument("path", help=path_help)
    p.add_argument("--spacing", type=int, default=sizes.INDEX_SPACING_BYTES,
                   help=f"bytes between index checkpoints (default: {sizes.INDEX_SPACING_BYTES})")
    p.set_defaults(fn=_cmd_index)

    p = sub.add_parser("clean", parents=[common], help="delete what killed or failed writes left in a dataset",
                       description="Delete the files the dataset's latest version does not list (what killed "
                                   "writes left, and what commits replaced over --keep-replaced seconds ago) and "
                                   "the staging directories of writes that did not finish; a checkpointed job's are "
                                   "kept for its rerun. Run it while no write to PATH is running: a running "
                                   "write's files are not listed yet.")
    p.add_argument("path", help="the dataset directory (local, s3://, gs://, ...)")
    p.add_argument("--keep-replaced", type=float, default=DEFAULT_KEEP_REPLACED_S, metavar="SECONDS",
                   help="keep files replaced less than this long ago, for reads planned before; files a write "
                        "kept with keep_replaced_files stay that long whatever this says "
                        f"(default: {DEFAULT_KEEP_REPLACED_S:g}, as write_tfrecords' keep_replaced_files)")
    p.add_argument("--dry-run", action="store_true", help="list what would be deleted; delete nothing")
    p.set_defaults(fn=_cmd_clean)

    p = sub.add_parser("convert", parents=[common], help="Parquet / CSV / JSON -> TFRecord through Ray Data",
                       description="Convert Parquet, CSV or JSON to TFRecord through Ray Data.")
    p.add_argument("src", help="the Parquet, CSV or JSON file or directory to convert")
    p.add_argument("dst", help="the directory to write TFRecord files into")
    p.add_argument("--format", choices=sorted(_READERS),
                   help="the format of SRC (default: from its extension)")
    p.add_argument("--partition-by", help="comma-separated columns to partition the output by (Hive key=value "
                                          "directories)")
    p.add_argument("--compression", default="none", choices=["none", *options.COMPRESSIONS],
                   help="compress each output file (default: none)")
    p.add_argument("--compression-level", type=_compression_level, metavar="0-9",
                   help="zlib level for --compression gzip/zlib: 1 fastest, 9 smallest (default: zlib's, 6)")
    p.add_argument("--record-type", default="Example", choices=record_types, help=record_type_help)
    p.add_argument("--mode", default="error", choices=list(options.MODES),
                   help="what to do when DST already holds data (default: error)")
    p.add_argument("--min-rows-per-file", type=_positive,
                   help="gather at least this many rows per write task (so per file) before writing; a hint, "
                        "as in Ray's write_tfrecords")
    p.add_argument("--max-rows-per-file", type=_positive, help="start a new file after this many rows")
    p.add_argument("--num-files", type=_positive, metavar="N",
                   help="write exactly N files of balanced rows, named PREFIX-00000-of-0000N.tfrecord as TFDS and "
                        "Beam name shards")
    p.add_argument("--file-prefix", metavar="PREFIX",
                   help="the names' prefix with --num-files (default: part-<8 hex of the write's id>)")
    # The library names its options by their keyword (allow_float64_narrowing=True, file_prefix='x');
    # errors show the flag.
    flags = {keyword: "--" + keyword.replace("_", "-") for keyword in
             ("mode", "compression_level", "min_rows_per_file", "max_rows_per_file", "num_files", "file_prefix")}
    for flag, help_text in (
        ("--allow-float64-narrowing", "write float64 columns as float32 (TFRecord has no float64)"),
        ("--allow-decimal-narrowing", "write decimals with no exact float32 form as the nearest float32"),
    ):
        flags[p.add_argument(flag, action="store_true", help=help_text).dest] = flag
    p.set_defaults(fn=_cmd_convert, flags=flags)

    p = sub.add_parser("tensorboard", help="TensorBoard on a training run's logs (tensorboard=True)",
                       description="Start TensorBoard on LOGDIR, the directory tensorflow_trainer(..., "
                                   "tensorboard=True) printed; needs the tensorboard package.")
    p.add_argument("logdir", help="the run's TensorBoard directory (<storage_path>/<name>/tensorboard)")
    p.add_argument("--port", type=int, default=6006, help="the port to serve on (default: 6006)")
    p.add_argument("--bind-all", action="store_true", help="serve on every network interface, not localhost only")
    p.set_defaults(fn=_cmd_tensorboard)
    return parser


def _quiet_data_context() -> None:
    """Create this process's Ray Data context without Ray's deprecation warnings about it.

    Ray 2.60's ``DataContext()`` assigns every field, and assigning ``use_push_based_shuffle``,
    ``use_polars`` or ``use_arrow_tensor_v2`` warns that the field is deprecated, although
    nobody set it; every later ``DataContext.get_current()`` returns the context made here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module="ray.data.context")
        DataContext.get_current()


def main(argv: Sequence[str | os.PathLike[str]] | None = None) -> int:
    """Entry point of the ``ray-tfrecord`` console script; ``argv`` may hold path-like objects."""
    args = _parser().parse_args(None if argv is None else [os.fspath(a) for a in argv])
    _quiet_data_context()
    args.num_cpus = getattr(args, "num_cpus", None)
    _console_without_errors()
    try:
        return args.fn(args)
    except Exception as e:
        # One line, no traceback: the library's message names the file, offset and fix.
        error = task_cause(e) or e
        if not isinstance(error, (ValueError, FileNotFoundError, StallError)):
            raise
        print(f"ray-tfrecord {args.command}: {_in_cli_terms(str(error), args.flags)}", file=sys.stderr)
        return 1 if isinstance(error, CorruptRecordError) else 2


def _in_cli_terms(message: str, flags: dict[str, str]) -> str:
    """``message`` with each option named as a Python keyword named as the command's flag instead:
    ``allow_float64_narrowing=True`` as ``--allow-float64-narrowing``, ``file_prefix='x'`` as
    ``--file-prefix x``, ``mode='overwrite', 'append' or 'ignore'`` as ``--mode overwrite, append or ignore``,
    a bare ``num_files`` as ``--num-files`` (only names with an underscore: a bare
    "mode" is also a word); ``flags`` maps the keywords to the flags. The library's messages name the
    keyword only, so the CLI alone knows its flags."""
    for keyword, flag in flags.items():
        message = message.replace(f"{keyword}=True", flag)
        # A choice of values: mode='overwrite', 'append' or 'ignore' -> --mode overwrite, append or ignore.
        message = re.sub(rf"\b{keyword}=('[^']*'(?:(?:, | or )'[^']*')+)",
                         functools.partial(_unquoted_choice, flag), message)
        message = re.sub(rf"\b{keyword}=(['\"]?)([^'\",;)\s]+)\1", rf"{flag} \2", message)
        if "_" in keyword:
            message = re.sub(rf"\b{keyword}\b", flag, message)
    message = re.sub(r"ray\.init\(num_cpus=(\d+)\)", r"--num-cpus \1", message)
    # A fix that only the Python API offers is no fix here: list_files' "check the pattern, or pass
    # ignore_missing_paths=True to skip it" for a glob that matches nothing.
    return re.sub(r", or pass \w+=True to [^;]*", "", message)


def _unquoted_choice(flag: str, match: re.Match[str]) -> str:
    return f"{flag} " + match.group(1).replace("'", "")


if __name__ == "__main__":
    sys.exit(main())
