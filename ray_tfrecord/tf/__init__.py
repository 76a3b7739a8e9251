"""Training with TensorFlow on Ray: one import for a training script.

```python
from ray_tfrecord.tf import (ReportCheckpoint, ResumableFeed, plan_splits, restore,
                             tensorflow_trainer, tf_dataset)
```

[`tf_dataset`][ray_tfrecord.tf.tf_dataset] feeds a Ray dataset shard to Keras or a custom loop;
[`tfrecord_dataset`][ray_tfrecord.tf.tfrecord_dataset] reads a dataset with TensorFlow's own ops, without
Ray (parameter-server workers, TPU hosts); [`plan_splits`][ray_tfrecord.tf.plan_splits] and
[`ResumableFeed`][ray_tfrecord.tf.ResumableFeed] give a feed that resumes mid-epoch;
[`tensorflow_trainer`][ray_tfrecord.tf.tensorflow_trainer] builds Ray Train's ``TensorflowTrainer`` (a
fixed ``num_workers`` or an elastic ``(min, max)`` range), [`ps_trainer`][ray_tfrecord.tf.ps_trainer] a
parameter-server cluster of Ray actors ([`PSTrainer`][ray_tfrecord.tf.PSTrainer], whose ``fit`` returns a
[`PSResult`][ray_tfrecord.tf.PSResult]; [`ps_checkpoint_dir`][ray_tfrecord.tf.ps_checkpoint_dir] its checkpoints);
[`ReportCheckpoint`][ray_tfrecord.tf.ReportCheckpoint] and [`restore`][ray_tfrecord.tf.restore]
checkpoint and resume a Keras model, [`TensorBoard`][ray_tfrecord.tf.TensorBoard] logs it;
[`inference`][ray_tfrecord.tf.inference] and [`predict`][ray_tfrecord.tf.predict] run a saved model over a
dataset.

TensorFlow is imported here as it is anywhere else: its own messages, a fatal one included, reach
stderr unchanged.  Each name loads its module (Ray Train, tf_keras) when first used, so this import
costs TensorFlow's and nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ray_tfrecord._src.core.public import lazy_names as _lazy_names

# TensorFlow, imported plainly (its own messages, a fatal one included, reach stderr unchanged); without
# it an ImportError names the tf extra.
try:
    import tensorflow  # noqa: F401
except ModuleNotFoundError as _error:
    if _error.name != "tensorflow":
        raise
    raise ImportError(
        "ray_tfrecord.tf needs TensorFlow, which is not installed: pip install 'ray_tfrecord[tf]'"
    ) from _error

if TYPE_CHECKING:
    from ray_tfrecord._src.data.feed.splits import SplitPlan, plan_splits
    from ray_tfrecord._src.tf.checkpoint import MODEL_FILE, ReportCheckpoint, restore
    from ray_tfrecord._src.tf.feature_spec import feature_spec
    from ray_tfrecord._src.tf.feed import tf_dataset
    from ray_tfrecord._src.tf.inference import inference, predict
    from ray_tfrecord._src.tf.native_reader import tfrecord_dataset
    from ray_tfrecord._src.tf.parameter_servers import (
        ClusterFailedError,
        PSResult,
        PSTrainer,
        ps_checkpoint_dir,
        ps_trainer,
    )
    from ray_tfrecord._src.tf.resume import ResumableFeed
    from ray_tfrecord._src.tf.tensorboard_logs import TensorBoard
    from ray_tfrecord._src.tf.train import KerasVersionError, tensorflow_trainer

# Where each public name lives. Lazy: Ray Train costs seconds to import, and tf_keras must not load
# in a Keras 3 worker that never checkpoints with ReportCheckpoint.
_LAZY = {
    "tf_dataset": "ray_tfrecord._src.tf.feed",
    "tfrecord_dataset": "ray_tfrecord._src.tf.native_reader",
    "feature_spec": "ray_tfrecord._src.tf.feature_spec",
    "ResumableFeed": "ray_tfrecord._src.tf.resume",
    "plan_splits": "ray_tfrecord._src.data.feed.splits",
    "SplitPlan": "ray_tfrecord._src.data.feed.splits",
    "ReportCheckpoint": "ray_tfrecord._src.tf.checkpoint",
    "restore": "ray_tfrecord._src.tf.checkpoint",
    "MODEL_FILE": "ray_tfrecord._src.tf.checkpoint",
    "tensorflow_trainer": "ray_tfrecord._src.tf.train",
    "KerasVersionError": "ray_tfrecord._src.tf.train",
    "TensorBoard": "ray_tfrecord._src.tf.tensorboard_logs",
    "ps_trainer": "ray_tfrecord._src.tf.parameter_servers",
    "ps_checkpoint_dir": "ray_tfrecord._src.tf.parameter_servers",
    "ClusterFailedError": "ray_tfrecord._src.tf.parameter_servers",
    "PSTrainer": "ray_tfrecord._src.tf.parameter_servers",
    "PSResult": "ray_tfrecord._src.tf.parameter_servers",
    "inference": "ray_tfrecord._src.tf.inference",
    "predict": "ray_tfrecord._src.tf.inference",
}

__all__ = [
    "MODEL_FILE", "ClusterFailedError", "KerasVersionError", "PSResult", "PSTrainer", "ReportCheckpoint",
    "ResumableFeed", "SplitPlan",
    "TensorBoard", "feature_spec", "inference", "plan_splits", "predict", "ps_checkpoint_dir", "ps_trainer", "restore",
    "tensorflow_trainer", "tf_dataset", "tfrecord_dataset",
]


__getattr__, __dir__ = _lazy_names(__name__, _LAZY, globals())
