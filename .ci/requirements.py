"""Print what ``pip install '.[EXTRA]'`` installs besides this package, one requirement a line.

The floors' venv installs these first: that install leaves the working tree alone (an install of the
package itself rebuilds its native module in place), so CI runs it beside ``make test``.

    python .ci/requirements.py test > requirements.txt
"""

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
SELF = re.compile(rf"{project['name']}\[([\w,-]+)\]$")


def requirements(extras: list[str]) -> list[str]:
    found = list(project["dependencies"])
    for extra in extras:
        for requirement in project["optional-dependencies"][extra]:
            itself = SELF.match(requirement)
            found += requirements(itself.group(1).split(",")) if itself else [requirement]
    return list(dict.fromkeys(found))


if __name__ == "__main__":
    print("\n".join(requirements(sys.argv[1:])))
