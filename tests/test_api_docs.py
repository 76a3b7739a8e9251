"""The public docstrings are the API reference (docs/reference/, rendered by mkdocstrings): they name
only public objects and docs pages, in Markdown that renders.

A public docstring is the module docstring of ``ray_tfrecord`` or ``ray_tfrecord.tf``, the docstring
of a name in either ``__all__``, or that of a public method or property of such a class. There,
``ray_tfrecord._src`` (the private implementation, which may change in any release) is never the
answer to a reader's question, and a Sphinx role (``:func:`x```) prints as written: a cross-reference
is ``[`name`][ray_tfrecord.name]``. Private docstrings write ``name`` as a plain literal.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "ray_tfrecord"
NAMESPACES = ("ray_tfrecord", "ray_tfrecord.tf")
SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const|ref|doc|term):`")


def _constant_docstrings() -> dict[str, str]:
    """Module-level ``NAME = ...`` followed by a string (an attribute docstring), in every
    ``_src`` module: the only docstring a constant has."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        body = ast.parse(path.read_text()).body
        for node, after in zip(body, body[1:]):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                if isinstance(node, ast.AnnAssign) else []
            if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                    and isinstance(after.value.value, str)):
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = after.value.value
    return found


def _public_docstrings() -> list[tuple[str, str]]:
    constants = _constant_docstrings()
    docs = []
    for namespace in NAMESPACES:
        module = importlib.import_module(namespace)
        docs.append((namespace, module.__doc__ or ""))
        for name in module.__all__:
            obj = getattr(module, name)
            where = f"{namespace}.{name}"
            if not (inspect.isclass(obj) or inspect.isroutine(obj)):
                docs.append((where, constants.get(name, "")))
                continue
            docs.append((where, obj.__doc__ or ""))
            if not inspect.isclass(obj):
                continue
            for member, value in vars(obj).items():
                if member.startswith("_") and member != "__init__":
                    continue
                value = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
                doc = value.__doc__ if isinstance(value, property) or inspect.isfunction(value) else None
                if doc:
                    docs.append((f"{where}.{member}", doc))
    return docs


PUBLIC_DOCSTRINGS = _public_docstrings()


def test_the_public_docstrings_are_found():
    where = {w for w, _ in PUBLIC_DOCSTRINGS}
    assert {"ray_tfrecord", "ray_tfrecord.tf", "ray_tfrecord.read_tfrecords", "ray_tfrecord.tf.tf_dataset",
            "ray_tfrecord.TFRecordDatasource.corruption_report", "ray_tfrecord.tf.ResumableFeed.dataset",
            "ray_tfrecord.SEED_COLUMN", "ray_tfrecord.tf.MODEL_FILE"} <= where, sorted(where)
    assert len(PUBLIC_DOCSTRINGS) > 60


@pytest.mark.parametrize(("where", "doc"), PUBLIC_DOCSTRINGS, ids=[w for w, _ in PUBLIC_DOCSTRINGS])
def test_a_public_docstring_names_only_public_things(where, doc):
    assert doc.strip(), f"{where} has no docstring: its reference entry would be empty"
    private = [line.strip() for line in doc.splitlines() if "_src" in line]
    assert not private, f"{where} sends the reader into ray_tfrecord._src: {private}"
    roles = [line.strip() for line in doc.splitlines() if SPHINX_ROLE.search(line)]
    assert not roles, f"{where} holds Sphinx roles, which the reference prints as written: {roles}"


def test_no_sphinx_role_is_left_in_the_package():
    """Private docstrings and comments too: there a name is a plain ``literal``."""
    left = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}"
            for path in sorted(PACKAGE.rglob("*.py"))
            for n, line in enumerate(path.read_text().splitlines(), 1) if SPHINX_ROLE.search(line)]
    assert not left, "\n".join(left)


def test_every_public_name_has_a_reference_entry():
    """Each name of either ``__all__`` is one ``::: namespace.name`` entry of docs/reference/."""
    entries = re.findall(r"^::: (\S+)$", "\n".join(p.read_text() for p in (ROOT / "docs" / "reference").glob("*.md")),
                         re.M)
    public = [f"{ns}.{name}" for ns in NAMESPACES for name in importlib.import_module(ns).__all__]
    assert sorted(e for e in entries if e not in NAMESPACES) == sorted(public)
