"""The README's example runs as written (with its output directory moved under tmp_path)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs(ray_local, tmp_path):
    text = README.read_text()
    block = re.search(r"## Example\n\n```python\n(.*?)```", text, re.S).group(1)
    assert "write_tfrecords" in block and "read_tfrecords" in block
    exec(compile(block.replace("/tmp/words", str(tmp_path / "words")), "README.md", "exec"), {})
    assert (tmp_path / "words" / "_SUCCESS").exists()
    assert sorted(p.name for p in (tmp_path / "words").iterdir() if p.is_dir()) == ["number=1", "number=2", "number=8"]
