"""How the feed keeps the ranks of synchronous data-parallel training in step.

Equal steps on every rank
-------------------------
Synchronous data-parallel training (``MultiWorkerMirroredStrategy``) hangs if
one rank runs out of batches before the others.  The policy here is **drop the
remainder**: only full batches of ``batch_size`` rows are produced.  Ray
Train's default ``DataConfig`` splits every dataset with
``streaming_split(world_size, equal=True)``, which gives every rank exactly
``N // world_size`` rows, so every rank yields exactly
``(N // world_size) // batch_size`` batches per epoch; at most
``world_size * batch_size - 1`` rows per epoch go unseen (different ones each
epoch when the data is shuffled).  When the shards may be unequal (a custom
``DataConfig``, or each rank reading its own files), pass ``steps_per_epoch``:
every rank then yields exactly that many batches and raises, instead of
hanging its peers, if its shard is too short.

Batch size under MultiWorkerMirroredStrategy
--------------------------------------------
Keras ``fit`` under ``MultiWorkerMirroredStrategy`` follows TensorFlow's
global-batch convention: it splits every element of the dataset into
``num_replicas_in_sync`` pieces and the worker runs one step per piece.  So pass
``batch_size = per_replica_batch * world_size`` (what TensorFlow calls the
global batch size): each worker then takes that many rows from its own shard
per element and every replica trains on ``per_replica_batch`` rows per step.
The split is the same on every rank, so step counts stay equal: Keras runs,
and prints, ``world_size * ((N // world_size) // batch_size)`` steps per
epoch (1000 rows, 2 workers, ``batch_size=100``: ``10/10``), not the
``(N // world_size) // batch_size`` batches the feed yields.

Per-replica batches
-------------------
That re-split costs Keras a pass over every element, and on a ragged column
TensorFlow encodes each row as its own variant to do it: it can cost more than
the feed.  ``strategy=strategy`` skips it: the feed cuts each replica's
``batch_size // num_replicas_in_sync`` rows itself and returns a
``tf.distribute.DistributedDataset`` (``distribute_datasets_from_function``).
Keras requires a step count for those and keeps one iterator across epochs, so
pass the same ``steps_per_epoch`` to ``tf_dataset`` and ``model.fit``, counted
in Keras steps: ``(rows // world_size) // (batch_size // world_size)`` for an
equal split of ``rows``.  Each Keras epoch is then one pass over the shard.  As
Keras prefetches, the last epoch starts one more pass, which ends when ``fit``
returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

import tensorflow as tf

from ray_tfrecord._src.data.feed.resumable import worker_group

#: Builds one pipeline of ``batch_size``-row elements, ``steps`` of them an epoch (None: all the data gives).
Batches: TypeAlias = Callable[[int, int | None], tf.data.Dataset]


def check_partial_batches(*, drop_last: bool, steps_per_epoch: int | None) -> None:
    """Refuse a partial last batch when, inside a Ray Train run of several workers, ranks could
    then disagree on the step count (and hang synchronous training)."""
    if not drop_last and steps_per_epoch is None and (world_size := worker_group()[1]) > 1:
        raise ValueError(
            f"tf_dataset(drop_last=False) on one of {world_size} workers would let ranks run "
            "different step counts and hang synchronous training; keep "
            "drop_last=True or pass steps_per_epoch="
        )


@dataclass(frozen=True)
class PerReplica:
    """Per-replica batches under ``strategy`` (``tf_dataset(..., strategy=)``), checked to give
    every replica equal batches and equal steps."""

    strategy: tf.distribute.Strategy
    batch_size: int
    steps_per_epoch: int

    @classmethod
    def checked(cls, strategy: tf.distribute.Strategy, batch_size: int, steps_per_epoch: int | None) -> PerReplica:
        """Refuse a global ``batch_size`` the replicas cannot share equally, or no ``steps_per_epoch``."""
        replicas = strategy.num_replicas_in_sync
        if batch_size % replicas:
            raise ValueError(
                f"batch_size={batch_size} is the global batch, cut into equal parts for the strategy's {replicas} "
                f"replicas; pass a multiple of {replicas}, e.g. "
                f"batch_size={batch_size - batch_size % replicas or replicas}"
            )
        if steps_per_epoch is None:
            raise ValueError(
                "strategy= gives Keras a distributed dataset, and Keras fit then needs the step count up front: "
                "pass the same steps_per_epoch to tf_dataset and to model.fit: (rows // world_size) // "
                "(batch_size // world_size) for a Ray Train shard of a dataset of that many rows"
            )
        return cls(strategy, batch_size, steps_per_epoch)

    def distribute(self, batches: Batches) -> tf.distribute.DistributedDataset:
        """The pipelines ``batches`` builds, one per input pipeline, cut per replica and repeated."""
        return self.strategy.distribute_datasets_from_function(functools.partial(self._pipeline, batches))

    def _pipeline(self, batches: Batches, context: tf.distribute.InputContext) -> tf.data.Dataset:
        # This worker's replicas take its elements in turn, one each per step. Keras never
        # restarts a distributed dataset's iterator, so each repetition is one pass over the shard.
        local_replicas = context.num_replicas_in_sync // context.num_input_pipelines
        rows = context.get_per_replica_batch_size(self.batch_size)
        return batches(rows, self.steps_per_epoch * local_replicas).repeat()
