"""The package's layers, checked from its source: each layer imports only the layers below it, no
module reaches into another module's private names, and no module grows past 500 lines.

Layers, lowest first: ``ray_tfrecord._src.core`` (numpy and pyarrow only), ``ray_tfrecord._src.data`` (adds
Ray Data), ``ray_tfrecord._src.tf`` (adds TensorFlow and Ray Train), then the front ends: the two public
namespaces (``ray_tfrecord/__init__.py``, ``ray_tfrecord/tf/__init__.py``) and ``ray_tfrecord._src.cli``.
``_src`` marks the implementation as private to the package: the rules below read a module's name
without it, so ``_src``'s modules follow the same private-name rules as before, and the public
namespaces may import them.
"""

from __future__ import annotations

import ast
import pathlib
import textwrap

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "ray_tfrecord"
LAYERS = {"core": 0, "data": 1, "tf": 2}
FRONT = 3
# Third-party packages a layer may not import (nor may any layer below it).
FORBIDDEN = {0: ("ray", "tensorflow", "tf_keras", "keras"), 1: ("tensorflow", "tf_keras", "keras")}
MAX_LINES = 500
# The Ray Data layer's sub-packages ("" is its root, the modules they share): what each may not import.
ROOMS = {"": ("read", "write", "feed"), "read": ("write", "feed"), "write": ("feed",), "feed": ()}
# Modules of the TensorFlow layer that processes without TensorFlow import: Ray Train's controller and
# dataset manager (train_setup), a parameter-server cluster's Ray actors (parameter_servers); and the
# framework-free resumable feed, which JAX and PyTorch workers load (the Ray Data layer may not import
# TensorFlow anyway: this follows its imports, package __init__s included). Checked with what they import
# from this package, transitively.
TENSORFLOW_FREE = ("ray_tfrecord._src.tf.train_setup", "ray_tfrecord._src.tf.parameter_servers",
                   "ray_tfrecord._src.data.feed.resumable")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _inside(module: str) -> list[str]:
    """The module's name inside the package, with the implementation root ``_src`` left out."""
    parts = module.split(".")[1:]
    return parts[1:] if parts[:1] == ["_src"] else parts


def _layer(module: str) -> int:
    if module.split(".")[1:2] != ["_src"]:
        return FRONT  # the public namespaces
    parts = _inside(module)
    return LAYERS.get(parts[0], FRONT) if parts else FRONT


def _room(module: str) -> str | None:
    """The Ray Data layer's sub-package of ``module`` ("" at its root), or None outside that layer."""
    parts = _inside(module)
    if parts[:1] != ["data"]:
        return None
    return parts[1] if len(parts) >= 2 and parts[1] in ROOMS else ""


def _package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def _resolve(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """What ``source`` (the text of ``module``) breaks of the layer rules."""
    package = _package_of(module, is_package)
    layer = _layer(module)
    found = []
    imported_modules: dict[str, str] = {}  # local name -> module, for attribute checks below

    def check_target(target: str, lineno: int) -> None:
        if target.split(".")[0] == "ray_tfrecord":
            if _layer(target) > layer and layer != FRONT:
                found.append(f"{module}:{lineno} imports {target} from a higher layer")
            room, other = _room(module), _room(target)
            if room is not None and other in ROOMS[room]:
                found.append(f"{module}:{lineno} imports {target}: data/{room or '(root)'} may not import data/{other}")
            private = [p for p in _inside(target) if _is_private(p)]
            # A private module may be imported by its own package's modules only.
            if private and target.rpartition(".")[0] != package:
                found.append(f"{module}:{lineno} imports the private module {target}")
        else:
            top = target.split(".")[0]
            if any(layer <= lower and top in names for lower, names in FORBIDDEN.items()):
                found.append(f"{module}:{lineno} imports {top}, which its layer may not")

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                check_target(alias.name, node.lineno)
                if alias.asname:
                    imported_modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(node, package)
            check_target(target, node.lineno)
            if target.split(".")[0] != "ray_tfrecord":
                continue
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if _is_private(alias.name):
                    # `from . import _native` inside its own package is a module, and allowed.
                    if target != package:
                        found.append(f"{module}:{node.lineno} imports the private name {full}")
                else:
                    imported_modules[alias.asname or alias.name] = full
        elif (isinstance(node, ast.Attribute) and _is_private(node.attr) and isinstance(node.value, ast.Name)
              and node.value.id in imported_modules):
            found.append(f"{module}:{node.lineno} uses the private name {imported_modules[node.value.id]}.{node.attr}")
    return found


SOURCES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_its_three_layers_behind_two_namespaces():
    implementation = PACKAGE / "_src"
    assert {p.parent.name for p in SOURCES if p.parent.parent == implementation} == set(LAYERS)
    assert {p.relative_to(PACKAGE).as_posix() for p in SOURCES if implementation not in p.parents} == {
        "__init__.py", "tf/__init__.py"}


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_keeps_to_its_layer(path):
    assert violations(path.read_text(), _module_name(path), path.name == "__init__.py") == []


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_at_most_500_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("source, module, expected", [
    ("from ray_tfrecord._src.tf.feed import tf_dataset", "ray_tfrecord._src.data.read.datasource", "from a higher layer"),
    ("from ...tf import feed", "ray_tfrecord._src.data.write.datasink", "from a higher layer"),
    ("from ray_tfrecord._src.data.write.commit import Commit", "ray_tfrecord._src.data.read.listing",
     "data/read may not import data/write"),
    ("from ..feed import splits", "ray_tfrecord._src.data.read.planning", "data/read may not import data/feed"),
    ("from ray_tfrecord._src.data.feed.order import SEED_COLUMN", "ray_tfrecord._src.data.write.writers",
     "data/write may not import data/feed"),
    ("from ray_tfrecord._src.data.read import listing", "ray_tfrecord._src.data.progress",
     "data/(root) may not import data/read"),
    ("import tensorflow as tf", "ray_tfrecord._src.core.codec", "imports tensorflow"),
    ("import ray", "ray_tfrecord._src.core.codec", "imports ray"),
    ("from .codec import _leaf", "ray_tfrecord._src.core.schema", "private name ray_tfrecord._src.core.codec._leaf"),
    ("from ray_tfrecord._src.core import _native", "ray_tfrecord._src.tf.feed", "private name ray_tfrecord._src.core._native"),
    ("from ray_tfrecord._src.data._compat import x", "ray_tfrecord._src.cli", "private module ray_tfrecord._src.data._compat"),
    ("from ray_tfrecord._src.core import codec\ncodec._leaf(1)", "ray_tfrecord._src.tf.feed", "private name ray_tfrecord._src.core.codec._leaf"),
])
def test_the_checker_catches_each_kind_of_breach(source, module, expected):
    (found,) = violations(textwrap.dedent(source), module)
    assert expected in found


@pytest.mark.parametrize("source, module", [
    ("from . import _native\nfrom ._contract import Kind", "ray_tfrecord._src.core.codec"),
    ("from ray_tfrecord._src.core.codec import decode", "ray_tfrecord._src.tf.feed"),
    ("from . import _compat\n_compat.from_task(1)", "ray_tfrecord._src.data.read.datasource"),
    ("import tensorflow as tf", "ray_tfrecord._src.tf.feed"),
    ("from ray_tfrecord._src.data.read.listing import list_files", "ray_tfrecord._src.data.feed.splits"),
    ("from ray_tfrecord._src.data import compat, partitioning", "ray_tfrecord._src.data.write.writers"),
    ("from ._src.tf.feed import tf_dataset", "ray_tfrecord"),
    ("from .._src.tf.resume import ResumableFeed", "ray_tfrecord.tf"),
])
def test_the_checker_allows_what_the_layers_allow(source, module):
    assert violations(textwrap.dedent(source), module, module in ("ray_tfrecord", "ray_tfrecord.tf")) == []


def _imports_at_load(path: pathlib.Path) -> set[str]:
    """What ``path`` imports when it loads: module-level statements, not those inside functions."""
    module = _module_name(path)
    package = _package_of(module, path.name == "__init__.py")
    found = set()
    tree = ast.parse(path.read_text())
    guarded = [n for n in tree.body if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test)]
    for node in tree.body:
        if node in guarded:
            continue
        for inner in ast.walk(node):
            if isinstance(inner, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                break
            if isinstance(inner, ast.Import):
                found.update(a.name for a in inner.names)
            elif isinstance(inner, ast.ImportFrom):
                target = _resolve(inner, package)
                found.add(target)
                found.update(f"{target}.{a.name}" for a in inner.names)
    return found


def _source_of(module: str) -> pathlib.Path | None:
    base = PACKAGE.parent / module.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.exists()), None)


@pytest.mark.parametrize("module", TENSORFLOW_FREE)
def test_tensorflow_free_modules_of_the_tf_layer_import_no_tensorflow(module):
    """Every module of this package that loads with ``module`` (its packages' ``__init__`` included)
    imports no TensorFlow or Keras at load time."""
    seen, todo, found = set(), [module], []
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix in seen or (path := _source_of(prefix)) is None:
                continue
            seen.add(prefix)
            for target in _imports_at_load(path):
                top = target.split(".")[0]
                if top in ("tensorflow", "tf_keras", "keras"):
                    found.append(f"{prefix} imports {target}")
                elif top == "ray_tfrecord":
                    todo.append(target)
    assert found == [] and module.rpartition(".")[0] in seen  # the walk went through its package
