"""The Ray Data layer: TFRecord read, written and fed through Ray Data, one sub-package per concept.

Imports the format core (``ray_tfrecord._src.core``) and Ray Data; nothing from ``ray_tfrecord._src.tf``.

- ``read/``: ``listing`` (paths -> files and partitions), ``globs`` (Hadoop globs), ``foreign`` (other
  writers' staging output, sidecars, TFDS splits), ``planning`` (files -> byte ranges -> read tasks),
  ``read_tasks`` (what one read task does), ``datasource`` (the ``Datasource`` and ``read_tfrecords``).
- ``write/``: ``datasink`` (the ``Datasink`` and ``write_tfrecords``), ``writers`` (one write task's file
  writers), ``commit`` (the all-or-nothing commit, no Ray), ``dataset_files`` (the files a commit lists,
  deletes, and ``ray-tfrecord clean`` removes).
- ``feed/``: the resumable feed's framework-free half: ``splits`` (record-exact splits and their read
  tasks), ``passes`` (a rank's passes over them, epoch after epoch), ``order`` (seeded epochs, shares,
  positions), ``indexing`` (the splits' indexes), ``transforms`` (checked preprocessing),
  ``by_reference`` (a large tuple pickled as one object reference), ``images`` (``ImageTransform``).
- Shared by the three, at this root: ``compat`` (every private Ray name and Ray version), ``filesystems``
  (paths -> filesystems, ``gs://`` beside ``s3://``), ``partitioning`` (Hive paths), ``progress`` (jobs
  that cannot progress), ``task_errors`` (errors out of Ray tasks as a few lines).

Arrows between them (``tests/test_layers.py``): the root imports no sub-package; ``read`` imports neither
``write`` nor ``feed``; ``write`` does not import ``feed``; ``feed`` reads through ``read``.
"""
