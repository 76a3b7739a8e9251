"""The Ray I/O layer: listing, planning, partitioning, the Ray Data datasource and its read tasks,
the datasink with its file writers and commit protocol.

Imports the format core (``ray_tfrecord._src.core``) and Ray Data; nothing from ``ray_tfrecord.tf``.
The commit protocol (``ray_tfrecord._src.io.commit``) imports no Ray at all.
"""
