"""The TensorFlow layer: what adds TensorFlow (and Ray Train) to the Ray Data layer below it.

- Feeds: ``tensors`` (Arrow columns -> tensors), ``pipeline`` (the Arrow -> ``tf.data`` pipeline both feeds
  end in), ``feed`` (``tf_dataset``), ``distribution`` (equal steps on every rank, per-replica batches),
  ``lint`` (driver-side column warnings), ``resume`` (``ResumableFeed``: the ``tf.data`` adapter over
  ``ray_tfrecord._src.data.feed.passes``), ``native_reader`` (``tfrecord_dataset``: TensorFlow's own reads).
- Training: ``train`` (``tensorflow_trainer``), ``train_setup`` (the configs Ray Train's controller and
  dataset manager unpickle, TensorFlow-free), ``checkpoint`` (``ReportCheckpoint``, ``restore``),
  ``tensorboard_logs``, ``parameter_servers`` (``ps_trainer``; its Ray actors import no TensorFlow).
- ``inference``: batch inference with a saved model.

This package imports nothing itself, so its TensorFlow-free modules load in processes without
TensorFlow; the guard that names the ``tf`` extra is in the public ``ray_tfrecord.tf``.
"""
