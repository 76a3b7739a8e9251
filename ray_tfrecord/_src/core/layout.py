"""The names a TFRecord dataset directory uses on disk, in one place.

A dataset is a directory of data files (``part-*``, optionally under Hive ``col=value/``
directories) beside a few hidden entries that readers skip: any path component starting with
``.`` or ``_`` (the Hadoop convention: ``_SUCCESS``, ``_temporary/``, ``.crc`` files). The names
other writers leave (Beam's ``beam-temp-*``, TFDS metadata, index files) are
``ray_tfrecord._src.data.read.foreign``'s.

>>> is_hidden("year=2021/_temporary/0/part-0")
True
>>> is_hidden("year=2021/part-0")
False
"""

from __future__ import annotations

#: Written last by a successful write; readers waiting for a dataset poll for it.
SUCCESS_MARKER = "_SUCCESS"
#: Where write tasks stage their files until the write commits (Hadoop's name).
STAGING_DIR = "_temporary"
#: The records' Arrow schema as written (hidden, like ``_SUCCESS``), so a read restores what
#: TFRecord cannot carry: string vs binary, integer widths, fixed-size lists.
SCHEMA_FILE = "_tfrecord_schema.arrow"
#: The recorded schema as TFMD text, beside ``SCHEMA_FILE``: what TFX's ImportSchemaGen, TFDV's
#: ``load_schema_text`` or ``read_tfrecords(schema=)`` load (``ray_tfrecord._src.core.spec_export``).
TFMD_SCHEMA_FILE = "_tfrecord_schema.pbtxt"
#: Index sidecars live at the dataset root as ``_index.<relative path, percent-encoded>``, so
#: TensorFlow's globs (which do not skip dot-files) match data files only.
INDEX_PREFIX = "_index."
#: The former index layout, a hidden sidecar beside its data file (``.<name>.idx``); still read.
LEGACY_INDEX_SUFFIX = ".idx"
#: On object stores, the list of the dataset's committed files (with their indexes); writing it is the
#: commit, and our readers read only the files it lists (``ray_tfrecord._src.core.manifest``).
MANIFEST_FILE = "_tfrecord_manifest.json"
#: The dataset's log: one file per committed version at the root, ``_tfrecord_log.<20-digit version>.json``,
#: each created once (put if absent) and never replaced; the highest is the dataset. At the root, like the
#: sidecars, so that TensorFlow's ``<dataset>/*/*`` globs of a partitioned dataset match data files only.
#: Replaces ``MANIFEST_FILE``, still read where there is no log (``ray_tfrecord._src.core.manifest``).
LOG_PREFIX = "_tfrecord_log."
#: Hive's spelling of a null partition value (Spark writes it too).
HIVE_NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
#: A name that starts with one of these is hidden from readers.
HIDDEN_PREFIXES = (".", "_")


def is_hidden_name(name: str) -> bool:
    """Whether readers skip an entry of this name."""
    return name.startswith(HIDDEN_PREFIXES)


def is_hidden(relative_path: str) -> bool:
    """Whether any component of a path relative to the dataset root is hidden."""
    return any(is_hidden_name(part) for part in relative_path.split("/") if part)
