"""The TensorFlow layer: Arrow batches as tensors (``tensors``), the tf.data training feed (``feed``)
with its rank-equal step policy (``distribution``) and column warnings (``lint``), Ray Train helpers
(``train``, with ``checkpoint``), the resumable feed (``resume``) and batch inference (``inference``).

Imports the layers below it (``ray_tfrecord.core``, ``ray_tfrecord.io``), TensorFlow and Ray Train.
"""

from __future__ import annotations

import os
import re
import sys
import threading

# TensorFlow 2.21 logs its start-up lines (oneDNN, CUDA drivers, CPU features) once for each of two
# native libraries it loads, before any log level applies. Where this package is the first to import
# it, it does so with stderr passed through a pipe that drops a line repeating an earlier one (the
# timestamp aside): each line once, nothing else hidden. A user who imports TensorFlow first gets
# TensorFlow's own output.
_LOG_PREFIX = re.compile(rb"^[IWEF]\d{4} [\d:.]+\s+\d+ ")


def _import_tensorflow_with_each_line_once() -> None:
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to tidy
        import tensorflow  # noqa: F401

        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    captured: list[bytes] = []
    drain = threading.Thread(target=lambda: captured.extend(iter(lambda: os.read(read_end, 65536), b"")))
    drain.start()
    try:
        import tensorflow  # noqa: F401
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        drain.join()
        os.close(read_end)
        seen: set[bytes] = set()
        kept = []
        for line in b"".join(captured).splitlines(keepends=True):
            key = _LOG_PREFIX.sub(b"", line)
            if key not in seen:
                seen.add(key)
                kept.append(line)
        out = b"".join(kept)
        while out:
            out = out[os.write(2, out):]


if "tensorflow" not in sys.modules:
    _import_tensorflow_with_each_line_once()
