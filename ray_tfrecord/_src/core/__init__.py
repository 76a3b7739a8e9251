"""The format core: TFRecord framing, the native codec, schemas and index sidecars.

Needs only numpy and pyarrow; imports nothing from the Ray I/O (``ray_tfrecord._src.data``) or
TensorFlow (``ray_tfrecord.tf``) layers.
"""
