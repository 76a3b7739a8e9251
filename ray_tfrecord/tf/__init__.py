"""The TensorFlow layer: Arrow batches as tensors (``tensors``), the tf.data training feed (``feed``)
with its rank-equal step policy (``distribution``) and column warnings (``lint``), Ray Train helpers
(``train``, with ``checkpoint``), the resumable feed (``resume``) and batch inference (``inference``).

Imports the layers below it (``ray_tfrecord.core``, ``ray_tfrecord.io``), TensorFlow and Ray Train.
"""
