"""Shared test fixtures."""

import os
from concurrent.futures import ThreadPoolExecutor

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
    os.environ["RAY_TFRECORD_CACHE_DIR"] = str(tmp_path_factory.mktemp("index_cache"))
    yield


# tests/test_docs.py's test of each docs page. A page runs in a process of its own with its own local
# Ray and keeps the 2 cores about 65% busy (Ray's start-up and polls, Ray Train's waits); the other
# tests, one after another, about 70%. So the pages run in the background, one at a time, from the
# session's start, beside the other tests, and their tests come last and collect what the pages did.
# The pages ask for RAY_ADDRESS=local, and a Ray that ray.init starts advertises itself to no other
# process (only `ray start` does), so neither side joins the other's Ray.
PAGE_TEST = "test_every_python_block_runs"


def _is_page_test(item: pytest.Item) -> bool:
    return getattr(item, "originalname", None) == PAGE_TEST


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected
def pytest_collection_modifyitems(items):
    items.sort(key=_is_page_test)  # stable: the other tests keep their order


@pytest.fixture(scope="session", autouse=True)
def page_runs(request, index_cache, tmp_path_factory):
    """Each selected docs page's directory and the future of its run, started as the session starts
    (after ``index_cache``, whose variable the pages' processes inherit)."""
    from tests.test_docs import run_page

    pool = ThreadPoolExecutor(1)
    runs = {}
    for item in request.session.items:
        if _is_page_test(item):
            page = item.callspec.params["page"]
            where = tmp_path_factory.mktemp(page.name.removesuffix(".md"))
            runs[page] = (where, pool.submit(run_page, page, where))
    yield runs
    pool.shutdown(wait=False, cancel_futures=True)
