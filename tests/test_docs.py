"""Every ```python block of the README and of every docs page runs as written, and imports what exists.

A page's blocks run in order, as one script in a fresh Python process, the way a reader who pastes
the page into one session top to bottom would run them: a later block may use what an earlier one
defined. Paths under ``/tmp/`` are moved under the page's own temporary directory; nothing else is changed.
The process starts its own local Ray (``RAY_ADDRESS=local``: never a cluster someone else started),
sized by the machine (2 CPUs on the project's), and a timeout turns a hang into a failure. The pages
run one after another in the background while the other tests run (tests/conftest.py: ``page_runs``).

Pages are found, not listed: a new page under docs/ runs as soon as it exists. CI time: a Ray Train
example costs about a minute, other pages seconds plus Ray's start-up. So a slow example is shared, not run twice:
``RUNS_AFTER`` runs a page as the continuation of another, in one process, and a block that repeats
one of the other page's word for word runs once (the README's training example is the first block
of docs/training.md).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
TRAIN_EXAMPLES = ROOT / "train_examples"
# The namespaces user code may import from: every import in the README, the docs and train_examples/
# names one of them and only names in its __all__ (ray_tfrecord._src is the private implementation).
PUBLIC_NAMESPACES = {"ray_tfrecord", "ray_tfrecord.tf"}
# page -> the page it continues: run as one script, blocks repeated verbatim run once.
RUNS_AFTER = {"docs/training.md": "README.md"}


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.S | re.M)


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _script(page: Path) -> str:
    first = ROOT / RUNS_AFTER[_name(page)] if _name(page) in RUNS_AFTER else None
    ran = set(_python_blocks(first.read_text())) if first else set()
    parts = [_script(first)] if first else []
    parts += [f"# {_name(page)}, python block {i + 1}\n{b}" for i, b in enumerate(_python_blocks(page.read_text()))
              if b not in ran]
    return "\n".join(parts)


PAGES_WITH_CODE = [p for p in _pages() if _python_blocks(p.read_text())]
# The pages each test runs: a page another one continues runs inside that one's.
RUN_PAGES = [p for p in PAGES_WITH_CODE if _name(p) not in RUNS_AFTER.values()]


def test_the_pages_with_code_are_found():
    # The extraction itself can break (a fence written differently): these pages hold python blocks.
    found = {str(p.relative_to(ROOT)) for p in PAGES_WITH_CODE}
    assert {"README.md", "docs/reading.md", "docs/writing.md", "docs/training.md", "docs/inference.md",
            "docs/errors.md", "docs/types.md"} <= found, found
    # The README's training example is the one docs/training.md opens with, so it runs once.
    readme, training = (_python_blocks((ROOT / p).read_text()) for p in ("README.md", "docs/training.md"))
    assert training[0] in readme
    assert _script(ROOT / "docs/training.md").count(training[0]) == 1


def _failure(output: str) -> str:
    """What a failed page printed about why: its last traceback on (Ray's progress bars, printed
    until the process exits, would push it out of a plain tail), else the tail."""
    start = output.rfind("Traceback (most recent call last)")
    return output[start:start + 6000] if start >= 0 else output[-6000:]


def run_page(page: Path, where: Path) -> subprocess.CompletedProcess:
    """``page``'s blocks as one script in a fresh process under ``where``, with its own local Ray."""
    (where / "page.py").write_text(_script(page).replace("/tmp/", f"{where}/"))
    env = {**os.environ, "RAY_ADDRESS": "local"}
    return subprocess.run([sys.executable, "page.py"], cwd=where, env=env, capture_output=True, text=True, timeout=800)


@pytest.mark.slow
# The pages run in the background from the session's start (tests/conftest.py: page_runs); a page's
# test waits for what is left of its run, which has a timeout of 800 s.
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("page", RUN_PAGES, ids=_name)
def test_every_python_block_runs(page, page_runs):
    where, started = page_runs[page]
    run = started.result()
    assert run.returncode == 0, _failure(run.stdout + run.stderr)
    if "README.md" in (_name(page), RUNS_AFTER.get(_name(page))):
        assert (where / "words" / "_SUCCESS").exists()
        assert sorted(p.name for p in (where / "words").iterdir() if p.is_dir()) == [
            "number=1", "number=2", "number=8"]
        # The steps rule docs/training.md states, as Keras printed it in the 2-worker run (verbose=2,
        # the only one): 2 * ((1000 // 2) // 100) = 10 steps per epoch on every rank.
        progress = re.findall(r"\b(\d+)/(\d+) - ", run.stdout + run.stderr)
        assert progress and set(progress) == {("10", "10")}, progress


def _imports(source: str, where: str) -> list[tuple[str, str, str | None]]:
    """(where, module, name) for every ``ray_tfrecord`` import in ``source``: ``from M import n``
    gives (M, n); ``import ray_tfrecord as rt`` then ``rt.n`` gives ("ray_tfrecord", n); a bare
    ``import M`` gives (M, None)."""
    tree = ast.parse(source)
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray_tfrecord":
            found += [(where, node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "ray_tfrecord":
                    found.append((where, a.name, None))
                    if a.asname or "." not in a.name:
                        aliases[a.asname or a.name] = a.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append((where, aliases[node.value.id], node.attr))
    return found


def _user_imports() -> list[tuple[str, str, str | None]]:
    found = []
    for page in PAGES_WITH_CODE:
        found += _imports("\n".join(_python_blocks(page.read_text())), _name(page))
    for example in sorted(TRAIN_EXAMPLES.glob("*.py")):
        found += _imports(example.read_text(), _name(example))
    return found


def test_user_code_imports_only_what_exists():
    imports = _user_imports()
    assert {m for _, m, _ in imports} >= {"ray_tfrecord"}, imports
    wrong = []
    for where, module, name in imports:
        try:
            mod = importlib.import_module(module)
        except ImportError as e:
            wrong.append(f"{where}: import {module}: {e}")
            continue
        if name is not None and not hasattr(mod, name) and not _is_module(f"{module}.{name}"):
            wrong.append(f"{where}: {module} has no {name}")
        if module not in PUBLIC_NAMESPACES:
            wrong.append(f"{where}: imports {module}, not one of {sorted(PUBLIC_NAMESPACES)}")
        elif name is not None and name not in getattr(mod, "__all__", ()):
            wrong.append(f"{where}: {module}.{name} is not in {module}.__all__")
    assert not wrong, "\n".join(wrong)


def _is_module(name: str) -> bool:
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def test_the_site_builds_strict(tmp_path):
    """`make docs`'s build (mkdocs --strict: a broken link, anchor or nav entry fails), on a copy."""
    for name in ("mkdocs.yml", "ARCHITECTURE.md", "CHANGELOG.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copytree(DOCS, tmp_path / "docs")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, capture_output=True, text=True, timeout=300,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    site = tmp_path / "site"
    # Snippets were included, not left as text, and the chart travelled with the page that shows it.
    assert "The tree" in (site / "architecture" / "index.html").read_text()
    assert "| bench |" not in (site / "benchmarks" / "index.html").read_text()
    assert "<table>" in (site / "benchmarks" / "index.html").read_text()
    assert (site / "img" / "bench.png").stat().st_size > 10_000
    # The API reference was rendered from the docstrings (mkdocstrings), entries and cross-references.
    feed = (site / "reference" / "training-feed" / "index.html").read_text()
    assert 'id="ray_tfrecord.tf.tf_dataset"' in feed and "Parameters:" in feed
    assert 'href="../resuming/#ray_tfrecord.tf.ResumableFeed"' in feed


def test_the_readme_links_resolve():
    """The README is not part of the site, so mkdocs does not check its links: every relative one
    names a file of the repository."""
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text())
    local = [link for link in links if "://" not in link]
    assert "docs/index.md" in local and "docs/img/bench.png" in local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
