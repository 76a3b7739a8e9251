"""What Ray Train's own processes unpickle for ``tensorflow_trainer``, kept free of TensorFlow.

A Ray Train run starts a controller and a dataset manager beside its workers. They unpickle the
trainer's backend config and its dataset config, and a class's module is imported on unpickling.
Ray's ``TensorflowConfig`` lives in ``ray.train.tensorflow``, whose ``__init__`` imports TensorFlow and
Keras, and so made both processes import TensorFlow, which neither uses: about 8 s of CPU each on
every ``fit()``, before the workers start.
The two configs here do what Ray's do, from modules that import Ray alone.
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import ray
from ray.data import DataContext, Dataset, ExecutionOptions, ExecutionResources
from ray.train import DataConfig
from ray.train.backend import Backend, BackendConfig

from ray_tfrecord._src.data import compat


class TensorflowBackendConfig(BackendConfig):
    """Ray's ``TensorflowConfig``: each worker gets a ``TF_CONFIG`` naming every worker's address, so
    ``MultiWorkerMirroredStrategy`` finds its peers. Unlike Ray's backend, it leaves
    ``TF_USE_LEGACY_KERAS`` as the workers' runtime environment set it (Ray's sets ``1`` on every worker,
    whatever Keras the run asked for)."""

    @property
    def backend_cls(self) -> type[Backend]:
        return _TensorflowBackend

    @property
    def framework(self) -> Any:
        return compat.tensorflow_framework()


class _TensorflowBackend(Backend):
    def on_start(self, worker_group: Any, backend_config: BackendConfig) -> None:
        addresses = worker_group.execute(_free_address)
        ray.get([worker_group.execute_single_async(rank, _set_tf_config, addresses, rank)
                 for rank in range(len(addresses))])


def _free_address() -> str:
    """This node's address and a port free on it now, as ``host:port`` (IPv6 hosts in brackets)."""
    host = ray.util.get_node_ip_address()
    ipv6 = ":" in host
    with socket.socket(socket.AF_INET6 if ipv6 else socket.AF_INET) as probe:
        probe.bind(("", 0))
        port = probe.getsockname()[1]
    return f"[{host}]:{port}" if ipv6 else f"{host}:{port}"


def _set_tf_config(addresses: list[str], rank: int) -> None:
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": addresses}, "task": {"type": "worker", "index": rank}})


def _ingest_options() -> ExecutionOptions:
    """Ray Train's default ingest options (``DataConfig.default_ingest_options``), built from the
    current ``DataContext`` without passing ``exclude_resources`` unless someone set it.

    Ray 2.60's default passes that deprecated property to ``ExecutionOptions()``, whose setter
    warns ``ExecutionOptions.exclude_resources is deprecated`` from Ray Train's dataset actor
    in every training run that has datasets; given options, Ray Train uses them instead.
    """
    current = DataContext.get_current().execution_options
    excluded = current.exclude_resources
    return ExecutionOptions(
        resource_limits=current.resource_limits,
        preserve_order=current.preserve_order,
        verbose_progress=current.verbose_progress,
        exclude_resources=None if excluded == ExecutionResources.zero() else excluded,
    )


class IngestConfig(DataConfig):
    """Every dataset split across the workers, with ``_ingest_options``, and no progress bars
    when the driver's output is not a terminal (a file, a job's log).

    The split coordinator that runs the datasets is a Ray actor, whose bars Ray Data sends to the
    driver to re-draw, with ANSI escapes, every epoch: thousands of lines in a captured log.
    ``configure`` runs in Ray Train's dataset manager on its own copies of the datasets, so the
    driver's own context (and its progress bars elsewhere) stays as it was.
    """

    def __init__(self, *, progress_bars: bool) -> None:
        super().__init__(datasets_to_split="all", execution_options=_ingest_options())
        self._progress_bars = progress_bars

    def configure(self, datasets: dict[str, Dataset], *args: Any, **kwargs: Any) -> Any:
        if not self._progress_bars:
            for ds in datasets.values():
                ds.context.enable_progress_bars = False
        return super().configure(datasets, *args, **kwargs)
