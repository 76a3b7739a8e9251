"""Checkpoints of a Keras model inside a Ray Train training function.

``ReportCheckpoint`` saves the model through ``ray.train.report``, after every epoch and,
with ``every_n_steps=``, inside epochs too; given a
``ResumableFeed`` it saves the feed's position with the weights.
``restore`` loads the latest checkpoint back after a restart.  Both are also importable from
``ray_tfrecord._src.tf.train``, next to the trainer they serve.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import ray.train
import tf_keras

from ray_tfrecord._src.core.public import public
from ray_tfrecord._src.tf.resume import FEED_FILE, ResumableFeed

MODEL_FILE = "model.keras"
"""The whole Keras model inside a checkpoint written by [`ReportCheckpoint`][ray_tfrecord.tf.ReportCheckpoint]
unless ``keras_file=False``: its file name in the checkpoint's directory."""

_WEIGHTS = "weights"
_STATE = "state.json"


@public("ray_tfrecord.tf")
class ReportCheckpoint(tf_keras.callbacks.Callback):
    """Keras callback: checkpoint the model and ``ray.train.report``, after every epoch and, with
    ``every_n_steps``, after every ``every_n_steps``-th step of an epoch.

    A checkpoint holds the weights with the optimizer state (what [`restore`][ray_tfrecord.tf.restore]
    resumes from) and, unless ``keras_file=False``, the whole model as
    [`MODEL_FILE`][ray_tfrecord.tf.MODEL_FILE] for inference (``tf_keras.models.load_model`` or
    [`predict`][ray_tfrecord.tf.predict]).  Every rank saves, since
    ``MultiWorkerMirroredStrategy`` wants all of them to take part, but only
    rank 0's copy is reported: the weights are mirrored.  The reported metrics
    are Keras's logs (the epoch's, or the running ones inside an epoch) plus ``epoch``
    (0-based) and, inside an epoch, ``step`` (Keras steps completed in it).

    With ``feed`` (the [`ResumableFeed`][ray_tfrecord.tf.ResumableFeed] that ``fit`` reads) the
    checkpoint also holds the rows the group has trained on, the rows of completed steps, so that
    [`restore`][ray_tfrecord.tf.restore] continues the epoch at the first row no rank has trained on.  Without one, a
    checkpoint inside an epoch resumes at that epoch's first row.  With a feed one ``fit`` trains
    the rest of a run after a restart: ``restore(model, feed)`` then ``model.fit(feed.dataset(),
    epochs=N, callbacks=[ReportCheckpoint(..., feed=feed)])``.  Each Keras epoch is then a whole
    epoch's steps of the feed, from where it stands (so after a restart inside an epoch, Keras's
    epochs end at the same step of the feed's epochs), and ``fit`` stops once the feed has fed
    epoch ``N - 1`` to its end: each of the ``N`` epochs is trained exactly once across restarts.
    The reported ``epoch`` and ``step`` are Keras's.
    """

    def __init__(self, *, keras_file: bool = True, every_n_steps: int | None = None,
                 feed: ResumableFeed | None = None) -> None:
        super().__init__()
        if every_n_steps is not None and every_n_steps <= 0:
            raise ValueError(f"every_n_steps must be positive, got {every_n_steps}")
        self._keras_file = keras_file
        self._every = every_n_steps
        self._feed = feed
        self._epoch = 0

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._feed is not None:
            self._feed.run_until(self.params["epochs"])

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
        self._epoch = epoch

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._every is not None and (batch + 1) % self._every == 0:
            self._report(logs, {"epoch": self._epoch, "step": batch + 1}, finished=False)
        if self._feed is not None:
            # The feed's last epoch ends inside this Keras epoch (a resumed run has fewer steps left
            # than its epochs hold): stop there, before the feed runs out under Keras.
            replicas = self.model.distribute_strategy.num_replicas_in_sync
            if self._feed.position(batch + 1, steps_per_batch=replicas).epoch >= self.params["epochs"]:
                self.model.stop_training = True

    def on_epoch_end(self, epoch: int, logs: Mapping[str, float] | None = None) -> None:
        self._report(logs, {"epoch": epoch}, finished=True)

    def _report(self, logs: Mapping[str, Any] | None, where: dict[str, int], *, finished: bool) -> None:
        metrics: dict[str, Any] = {k: float(v) for k, v in (logs or {}).items()}
        metrics.update(where)
        with tempfile.TemporaryDirectory() as tmp:
            self.model.save_weights(os.path.join(tmp, _WEIGHTS))
            if self._keras_file:
                # keras_v3 named: in a non-main thread (Ray Train's training loop) tf-keras's first .keras
                # save resets its v3 flag, and every later one would write HDF5, with a warning.
                self.model.save(os.path.join(tmp, MODEL_FILE), save_format="keras_v3")
            if self._feed is not None:
                # Keras under MultiWorkerMirroredStrategy cuts each element into one step per replica.
                replicas = self.model.distribute_strategy.num_replicas_in_sync
                self._feed.save(tmp, None if finished else where["step"], steps_per_batch=replicas)
            with open(os.path.join(tmp, _STATE), "w") as f:
                json.dump({"epoch": self._epoch if not finished else where["epoch"], "finished": finished}, f)
            rank = ray.train.get_context().get_world_rank()
            checkpoint = ray.train.Checkpoint.from_directory(tmp) if rank == 0 else None
            ray.train.report(metrics, checkpoint=checkpoint)


@public("ray_tfrecord.tf")
def restore(model: tf_keras.Model, feed: ResumableFeed | None = None) -> int:
    """Load the latest reported checkpoint into ``model``; return the epoch to start at.

    Returns 0 (and leaves ``model`` alone) on a fresh run; after a restart it
    returns the epoch following the checkpointed one, or the checkpointed epoch itself when the
    checkpoint was taken inside it, ready for ``model.fit(..., initial_epoch=restore(model))``.
    With ``feed``, the feed continues from the position saved with the weights, so the next pass
    over ``feed.dataset()`` feeds only the rows no rank has trained on yet, and it returns the
    feed's epoch; ``fit(feed.dataset(), epochs=N)`` with ``ReportCheckpoint(feed=feed)`` needs no
    ``initial_epoch``: the callback stops ``fit`` at the end of the feed's epoch ``N - 1``.
    """
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as path:
        # expect_partial: the optimizer's slots are restored lazily on its first step.
        model.load_weights(os.path.join(path, _WEIGHTS)).expect_partial()
        with open(os.path.join(path, _STATE)) as f:
            state = json.load(f)
        if feed is not None:
            if not os.path.exists(os.path.join(path, FEED_FILE)):
                raise ValueError(
                    f"the checkpoint {checkpoint.path} holds no feed position (it was reported without a feed); "
                    "pass the same feed= to ReportCheckpoint and restore, or call restore(model) without feed="
                )
            return feed.load(path)
        # Checkpoints from before every_n_steps= were all taken at an epoch's end.
        return state["epoch"] + 1 if state.get("finished", True) else state["epoch"]
