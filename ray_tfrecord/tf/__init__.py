"""The TensorFlow layer: Arrow batches as tensors, the tf.data training feed, Ray Train helpers
and batch inference.

Imports the layers below it (``ray_tfrecord.core``, ``ray_tfrecord.io``), TensorFlow and Ray Train.
"""
