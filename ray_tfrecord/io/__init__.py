"""The Ray I/O layer: listing, planning, partitioning, the Ray Data datasource and datasink.

Imports the format core (``ray_tfrecord.core``) and Ray Data; nothing from ``ray_tfrecord.tf``.
"""
