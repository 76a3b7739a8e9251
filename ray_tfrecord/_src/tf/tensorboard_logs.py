"""TensorBoard logs of a ``tensorflow_trainer(..., tensorboard=True)`` run: where they go, and the Keras
callback that writes them there.

Ray Train v2 takes no Tune logger callbacks, so the logs are Keras's own: the trainer names a directory
under the run's storage path (``<storage_path>/<name>/tensorboard``), hands it to every worker in
``TENSORBOARD_DIR_ENV`` and prints how to open it; ``TensorBoard`` in ``model.fit``'s callbacks
writes there.  Under ``MultiWorkerMirroredStrategy`` Keras keeps the chief's (rank 0's) logs: the other
workers write to temporary directories that Keras deletes.

Example (in the training function)::

    model.fit(feed, epochs=5, callbacks=[ReportCheckpoint(), TensorBoard()])
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import tf_keras

from ray_tfrecord._src.core.public import public

#: The training workers' environment variable that holds the run's TensorBoard directory.
TENSORBOARD_DIR_ENV = "RAY_TFRECORD_TENSORBOARD_DIR"


def run_log_dir(storage_path: str, name: str) -> str:
    """The TensorBoard directory of run ``name`` under ``storage_path``."""
    return f"{storage_path.rstrip('/')}/{name}/tensorboard"


def announce(log_dir: str) -> None:
    """Say, in one line, where the logs go and how to open them."""
    print(f"TensorBoard logs: {log_dir}; open them with: tensorboard --logdir {log_dir}", flush=True)


@public("ray_tfrecord.tf")
class TensorBoard(tf_keras.callbacks.TensorBoard):
    """Keras's ``TensorBoard`` callback, writing to the run's directory when ``log_dir`` is not given:
    the one ``tensorflow_trainer(..., tensorboard=True)`` printed.  Other arguments are Keras's
    (``update_freq=``, ``histogram_freq=``, ``profile_batch=``, ...).

    Raises ``ValueError`` outside such a run without ``log_dir``, and ``ImportError`` where the
    ``tensorboard`` package, which writes the summaries, is not installed.
    """

    def __init__(self, log_dir: str | None = None, **kwargs: Any) -> None:
        log_dir = log_dir or os.environ.get(TENSORBOARD_DIR_ENV)
        if not log_dir:
            raise ValueError("TensorBoard(): no log_dir=, and this is not a worker of "
                             "tensorflow_trainer(..., tensorboard=True); pass one of them")
        if importlib.util.find_spec("tensorboard") is None:
            raise ImportError("TensorBoard(): the tensorboard package, which writes the logs, is not installed "
                              "on this worker; pip install tensorboard on every node")
        super().__init__(log_dir=log_dir, **kwargs)
