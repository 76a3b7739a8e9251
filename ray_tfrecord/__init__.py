"""ray_tfrecord."""
