"""The TensorFlow layer: Arrow batches as tensors (``tensors``), the tf.data training feed (``feed``)
with its rank-equal step policy (``distribution``) and column warnings (``lint``), Ray Train helpers
(``train``, with ``checkpoint``), the resumable feed (``resume``) and batch inference (``inference``).
Users import it through ``ray_tfrecord.tf``.

TensorFlow is imported plainly: its own messages, a fatal one included, reach stderr unchanged.
"""

try:
    import tensorflow  # noqa: F401
except ModuleNotFoundError as error:
    if error.name != "tensorflow":
        raise
    raise ImportError(
        "ray_tfrecord.tf needs TensorFlow, which is not installed: pip install 'ray_tfrecord[tf]'"
    ) from error
