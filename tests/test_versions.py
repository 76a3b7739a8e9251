"""pyproject.toml declares a floor and no cap for each tested dependency, the installed versions respect
the floors, and the lowest-versions constraints file pins exactly those floors, so that a drift in either
(a bound edited without the pins or the other way round, a cap slipping back in) fails here. Also the
compatibility module's version logic: the warning for a Ray newer than the newest tested, and how Ray
task options reach a Ray call that does or does not name them."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import ray.data
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
LOWEST = REPO / ".ci" / "lowest-constraints.txt"
# The dependencies whose versions the package is tested at both ends of: a floor each, no cap.
BOUNDED = ["ray", "pyarrow", "numpy", "tqdm", "tensorflow", "tf-keras", "tensorflow-metadata"]
# Installed only with the tf (and tfmd) extra; the rest are always installed.
OPTIONAL = {"tensorflow", "tf-keras", "tensorflow-metadata"}
# Pinned in the lowest-versions file although the package does not depend on them, each for a reason given
# there (a floor release of a dependency that breaks with the newest release of one of its own dependencies).
COMPANIONS = {"pandas"}


def _declared() -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        reqs.extend(extra)
    out: dict[str, Requirement] = {}
    for text in reqs:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name == "ray-tfrecord":  # a self-reference between extras
            continue
        assert name not in out, f"{name} declared twice in pyproject.toml"
        out[name] = req
    return out


def _lower_bound(req: Requirement) -> Version:
    lows = [Version(s.version) for s in req.specifier if s.operator == ">="]
    assert len(lows) == 1, f"{req}: needs exactly one >= lower bound"
    return lows[0]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in LOWEST.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, version = line.partition("==")
        assert version, f"{LOWEST.name}: {line!r} is not a name==version pin"
        pins[canonicalize_name(name.strip())] = Version(version.strip())
    return pins


def _installed(name: str) -> Version | None:
    try:
        return Version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return None


@pytest.mark.parametrize("name", BOUNDED)
def test_declared_with_a_floor_and_no_cap(name):
    req = _declared()[name]
    ops = {s.operator for s in req.specifier}
    # A cap makes pip downgrade a user's newer release; a Ray newer than tested warns instead.
    assert ops == {">="}, f"{req}: needs exactly one >= bound and no upper bound"


def test_runtime_dependencies_are_what_the_package_imports():
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    runtime = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert runtime == {"ray", "pyarrow", "numpy", "tqdm"}


@pytest.mark.parametrize("name", BOUNDED)
def test_installed_version_within_declared_bounds(name):
    version = _installed(name)
    if version is None:
        assert name in OPTIONAL, f"{name} is a runtime dependency but not installed"
        pytest.skip(f"{name} not installed")
    req = _declared()[name]
    assert req.specifier.contains(version, prereleases=True), (
        f"{name} {version} is installed, below the floor {req.specifier} in pyproject.toml")


def test_lowest_constraints_pin_the_declared_lower_bounds():
    declared = _declared()
    pins = _pins()
    assert set(pins) - COMPANIONS == set(BOUNDED), f"{LOWEST.name} pins {sorted(pins)}, expected {BOUNDED}"
    for name, pin in pins.items():
        if name in COMPANIONS:
            continue
        low = _lower_bound(declared[name])
        # ">=2.50" and "==2.50.0" name the same release.
        assert pin == low, f"{LOWEST.name} pins {name}=={pin} but pyproject.toml's lower bound is {low}"
        assert declared[name].specifier.contains(pin, prereleases=True)


def test_ray_floor_is_the_compat_modules_oldest():
    from ray_tfrecord._src.data import compat

    low = _lower_bound(_declared()["ray"])
    assert (low.major, low.minor) == compat.OLDEST_SUPPORTED_RAY
    assert compat.OLDEST_SUPPORTED_RAY < compat.NEWEST_TESTED_RAY


def test_untested_ray_message_only_above_the_newest_tested():
    from ray_tfrecord._src.data.compat import NEWEST_TESTED_RAY, untested_ray_message

    major, minor = NEWEST_TESTED_RAY
    assert untested_ray_message(f"{major}.{minor}.3") is None
    assert untested_ray_message("2.50.0") is None
    message = untested_ray_message(f"{major}.{minor + 1}.0")
    assert message == (f"ray_tfrecord is tested with Ray 2.50 to {major}.{minor}; Ray {major}.{minor + 1}.0 is newer "
                       f"and untested. If reads or writes fail, install 'ray<={major}.{minor}.*' and report the "
                       "failure.")
    assert untested_ray_message(f"{major + 1}.0.0") is not None
    assert untested_ray_message(f"{major}.{minor + 1}.0rc1") is not None


_IMPORT_WARNINGS = """
import json, warnings, ray
if sys.argv[1]:
    ray.__version__ = sys.argv[1]
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import ray_tfrecord._src.data.compat, ray_tfrecord._src.data.read.datasource, ray_tfrecord._src.data.write.datasink
    import ray_tfrecord._src.data.compat as again
print(json.dumps([str(w.message) for w in caught if "ray_tfrecord" in w.filename + str(w.message)]))
"""


def _import_warnings(version: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", "import sys" + _IMPORT_WARNINGS, version], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def test_a_newer_ray_warns_once_at_import_and_the_tested_one_not_at_all():
    from ray_tfrecord._src.data.compat import NEWEST_TESTED_RAY

    newer = f"{NEWEST_TESTED_RAY[0]}.{NEWEST_TESTED_RAY[1] + 1}.0"
    assert _import_warnings(newer) == [f"ray_tfrecord is tested with Ray 2.50 to {NEWEST_TESTED_RAY[0]}."
                                       f"{NEWEST_TESTED_RAY[1]}; Ray {newer} is newer and untested. If reads or "
                                       f"writes fail, install 'ray<={NEWEST_TESTED_RAY[0]}.{NEWEST_TESTED_RAY[1]}.*' "
                                       "and report the failure."]
    assert _import_warnings("") == []  # this suite's own Ray is a tested one


def test_ray_options_go_by_name_where_the_call_names_them_else_into_ray_remote_args():
    from ray_tfrecord._src.data.compat import ray_call_args

    def newer(ds, *, num_cpus=None, resources=None, concurrency=None, ray_remote_args=None): ...

    def older(ds, *, num_cpus=None, concurrency=None, ray_remote_args=None): ...

    given = {"num_cpus": 0.5, "resources": {"disk": 1}, "concurrency": None, "ray_remote_args": None}
    assert ray_call_args(newer, given) == {"num_cpus": 0.5, "resources": {"disk": 1}}
    assert ray_call_args(older, given) == {"num_cpus": 0.5, "ray_remote_args": {"resources": {"disk": 1}}}
    # The caller's own ray_remote_args pass through (Ray's deprecation path), merged under named options.
    merged = ray_call_args(older, {**given, "ray_remote_args": {"max_retries": 1, "resources": {"x": 2}}})
    assert merged == {"num_cpus": 0.5, "ray_remote_args": {"max_retries": 1, "resources": {"disk": 1}}}
    assert ray_call_args(older, {"num_cpus": None, "ray_remote_args": None}) == {}
    with pytest.raises(TypeError, match=r"^Ray .* does not take compute; upgrade Ray or leave it out$"):
        ray_call_args(older, {"compute": object()})


def test_a_private_ray_name_that_is_gone_costs_its_feature_with_one_warning():
    from ray_tfrecord._src.data.compat import _private

    with pytest.warns(UserWarning, match=r"^Ray \S+ has no _GONE: transient errors are not retried$"):
        assert _private(("ray.data._internal.no_such_module", "ray.data"), "_GONE", "transient errors are not "
                        "retried") is None
    assert _private(("ray.data._internal.no_such_module", "ray.data"), "Dataset", "") is ray.data.Dataset
