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
