"""Training with TensorFlow on Ray: one import for a training script.

::

    from ray_tfrecord.tf import (ReportCheckpoint, ResumableFeed, plan_splits, restore,
                                 tensorflow_trainer, tf_dataset)

``tf_dataset`` feeds a Ray dataset shard to Keras or a custom loop; ``plan_splits`` and
``ResumableFeed`` give a feed that resumes mid-epoch; ``tensorflow_trainer`` builds Ray Train's
``TensorflowTrainer`` (a fixed ``num_workers`` or an elastic ``(min, max)`` range);
``ReportCheckpoint`` and ``restore`` checkpoint and resume a Keras model; ``inference`` and
``predict`` run a saved model over a dataset.

TensorFlow is imported here as it is anywhere else: its own messages, a fatal one included, reach
stderr unchanged.  Each name loads its module (Ray Train, tf_keras) when first used, so this import
costs TensorFlow's and nothing more.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

try:
    import tensorflow  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "tensorflow":
        raise
    raise ImportError(
        "ray_tfrecord.tf needs TensorFlow, which is not installed: pip install 'ray_tfrecord[tf]'"
    ) from error

if TYPE_CHECKING:
    from ray_tfrecord.io.splits import SplitPlan, plan_splits
    from ray_tfrecord.tf.checkpoint import ReportCheckpoint, restore
    from ray_tfrecord.tf.feed import tf_dataset
    from ray_tfrecord.tf.inference import inference, predict
    from ray_tfrecord.tf.resume import ResumableFeed
    from ray_tfrecord.tf.train import KerasVersionError, tensorflow_trainer

# Where each public name lives. Lazy: Ray Train costs seconds to import, and tf_keras must not load
# in a Keras 3 worker that never checkpoints with ReportCheckpoint.
_LAZY = {
    "tf_dataset": ".feed",
    "ResumableFeed": ".resume",
    "plan_splits": "..io.splits",
    "SplitPlan": "..io.splits",
    "ReportCheckpoint": ".checkpoint",
    "restore": ".checkpoint",
    "tensorflow_trainer": ".train",
    "KerasVersionError": ".train",
    "inference": ".inference",
    "predict": ".inference",
}

__all__ = [
    "KerasVersionError", "ReportCheckpoint", "ResumableFeed", "SplitPlan", "inference", "plan_splits", "predict",
    "restore", "tensorflow_trainer", "tf_dataset",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})

