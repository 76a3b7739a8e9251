"""The resumable feed's framework-free half: record-exact splits and their reads (``splits``, ``indexing``,
``by_reference``), seeded epochs and positions (``order``), a rank's passes over an epoch (``passes``),
checked preprocessing (``transforms``) and ``ImageTransform`` (``images``). ``ray_tfrecord._src.tf.resume``
adapts the passes to ``tf.data``."""
