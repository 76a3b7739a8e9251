"""Shared test fixtures."""

import pytest
import ray


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the whole session, sized for a 2-core machine.

    Tests that start their own cluster (e.g. ``ray start --head``) must not use it.
    """
    ray.init(
        # "local": never attach to a cluster someone else started with `ray start`.
        address="local",
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=2 * 1024**3,
        log_to_driver=False,
    )
    yield
    ray.shutdown()


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: starts Ray Train worker groups or a Ray cluster (tens of seconds)")


@pytest.fixture(scope="session", autouse=True)
def index_cache(tmp_path_factory):
    """plan_splits keeps the indexes of directories that take no sidecar in a cache under the home
    directory; the tests' go to a temporary one."""
    import os

    os.environ["RAY_TFRECORD_CACHE_DIR"] = str(tmp_path_factory.mktemp("index_cache"))
    yield
