"""ray_tfrecord's implementation, private: its modules move and change without notice.

Users import from the two public namespaces, ``ray_tfrecord`` and ``ray_tfrecord.tf``. Inside,
three layers, each importing only those below it: ``core`` (the format: numpy and pyarrow only),
``io`` (Ray Data), ``tf`` (TensorFlow and Ray Train); ``cli`` is the command line.
"""
