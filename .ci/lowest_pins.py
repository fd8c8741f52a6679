"""Pins of the lowest versions pyproject.toml allows: each ``name>=X`` of the dependencies and of the
extras named on the command line becomes ``name==X.*`` (the oldest release line it promises).

    python .ci/lowest_pins.py sb3 > lowest.txt && pip install -c lowest.txt ".[sb3,test-base]"
"""

import re
import sys
import tomllib
from pathlib import Path

project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
requirements = list(project["dependencies"])
for extra in sys.argv[1:]:
    requirements += [r for r in project["optional-dependencies"][extra] if not r.startswith("shmvec")]
for requirement in requirements:
    m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[^\]]*\])?\s*>=\s*([0-9.]+)\s*(;.*)?", requirement.strip())
    if m:
        print(f"{m.group(1)}=={m.group(3)}.*")
