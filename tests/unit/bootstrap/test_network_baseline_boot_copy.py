"""The network baseline's boot script runs from a private copy of some module_utils: the
copy must hold everything the baseline imports, however the imports change."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]
MODULE_UTILS = REPO / "plugins" / "module_utils"
IMPORT = re.compile(
    r"from ansible_collections\.gpuaas\.fleet\.plugins\.module_utils"
    r"(?:\.(\w+) import| import \(([\w,\s]+)\)| import ([\w, ]+))"
)


def imported(name: str) -> set[str]:
    found = set()
    for single, grouped, listed in IMPORT.findall((MODULE_UTILS / f"{name}.py").read_text()):
        names = single or grouped or listed
        found |= {n.strip() for n in names.split(",") if n.strip()}
    return found


def closure(name: str) -> set[str]:
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(imported(current))
    return seen


def test_boot_copy_holds_every_module_the_baseline_imports():
    role_vars = yaml.safe_load(
        (REPO / "roles" / "slice_network_baseline" / "vars" / "main.yml").read_text()
    )
    copied = {Path(f).stem for f in role_vars["slice_network_baseline_boot_modules"]}
    assert closure("network_baseline") == copied
