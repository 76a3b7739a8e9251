"""The installed versions of the pinned-range dependencies satisfy pyproject.toml's bounds, and the
lowest-versions constraints file pins exactly the declared lower bounds, so that a drift in either
(a newer release in .venv, a bound edited without the pins or the other way round) fails here."""

from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
LOWEST = REPO / ".ci" / "lowest-constraints.txt"
# The dependencies whose versions the package is tested at both ends of; each needs both bounds.
BOUNDED = ["ray", "pyarrow", "numpy", "tqdm", "tensorflow", "tf-keras"]
# Installed only with the tf extra; the rest are always installed.
OPTIONAL = {"tensorflow", "tf-keras"}


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
def test_declared_with_lower_and_upper_bounds(name):
    req = _declared()[name]
    ops = {s.operator for s in req.specifier}
    assert ">=" in ops and "<" in ops, f"{req}: needs both a >= and a < bound"


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
        f"{name} {version} is installed, outside the tested range {req.specifier} in pyproject.toml")


def test_lowest_constraints_pin_the_declared_lower_bounds():
    declared = _declared()
    pins = _pins()
    assert set(pins) == set(BOUNDED), f"{LOWEST.name} pins {sorted(pins)}, expected {BOUNDED}"
    for name, pin in pins.items():
        low = _lower_bound(declared[name])
        # ">=2.60" and "==2.60.0" name the same release.
        assert pin == low, f"{LOWEST.name} pins {name}=={pin} but pyproject.toml's lower bound is {low}"
        assert declared[name].specifier.contains(pin, prereleases=True)
