"""Checkpoints of a Keras model inside a Ray Train training function.

:class:`ReportCheckpoint` saves the model through ``ray.train.report``;
:func:`restore` loads the latest one back after a restart.  Both are also
importable from :mod:`ray_tfrecord.tf.train`, next to the trainer they serve.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping

import ray.train
import tf_keras

__all__ = ["MODEL_FILE", "ReportCheckpoint", "restore"]

#: The whole Keras model inside a checkpoint written by :class:`ReportCheckpoint`.
MODEL_FILE = "model.keras"

_WEIGHTS = "weights"
_STATE = "state.json"


class ReportCheckpoint(tf_keras.callbacks.Callback):
    """Keras callback: after every epoch, checkpoint the model and ``ray.train.report``.

    A checkpoint holds the weights with the optimizer state (what :func:`restore`
    resumes from) and, unless ``keras_file=False``, the whole model as
    :data:`MODEL_FILE` for inference (``tf_keras.models.load_model`` or
    :func:`ray_tfrecord.tf.inference.predict`).  Every rank saves, since
    ``MultiWorkerMirroredStrategy`` wants all of them to take part, but only
    rank 0's copy is reported: the weights are mirrored.  The reported metrics
    are the epoch's Keras logs plus ``epoch`` (0-based).
    """

    def __init__(self, keras_file: bool = True) -> None:
        super().__init__()
        self._keras_file = keras_file

    def on_epoch_end(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items()}
        metrics["epoch"] = epoch
        with tempfile.TemporaryDirectory() as tmp:
            self.model.save_weights(os.path.join(tmp, _WEIGHTS))
            if self._keras_file:
                self.model.save(os.path.join(tmp, MODEL_FILE))
            with open(os.path.join(tmp, _STATE), "w") as f:
                json.dump({"epoch": epoch}, f)
            rank = ray.train.get_context().get_world_rank()
            checkpoint = ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None
            ray.train.report(metrics, checkpoint=checkpoint)


def restore(model: tf_keras.Model) -> int:
    """Load the latest reported checkpoint into ``model``; return the epoch to start at.

    Returns 0 (and leaves ``model`` alone) on a fresh run; after a restart it
    returns the epoch following the checkpointed one, ready for
    ``model.fit(..., initial_epoch=restore(model))``.
    """
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as path:
        # expect_partial: the optimizer's slots are restored lazily on its first step.
        model.load_weights(os.path.join(path, _WEIGHTS)).expect_partial()
        with open(os.path.join(path, _STATE)) as f:
            return json.load(f)["epoch"] + 1
