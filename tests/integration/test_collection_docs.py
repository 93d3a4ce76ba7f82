"""The collection resolves as gpuaas.fleet for ansible-doc, as operators look it up."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def ansible_doc(*args: str) -> dict:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")}
    proc = subprocess.run(
        ["ansible-doc", "--json", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_every_module_is_listed_and_documented():
    on_disk = {
        f"gpuaas.fleet.{p.stem}"
        for p in (REPO / "plugins" / "modules").glob("*.py")
        if p.stem != "__init__"
    }
    listed = ansible_doc("-l", "gpuaas.fleet")
    assert set(listed) == on_disk
    docs = ansible_doc(*sorted(on_disk))
    assert set(docs) == on_disk
    for name, doc in docs.items():
        assert doc["doc"]["short_description"], name
        assert doc["doc"]["options"] is not None, name
        assert doc["examples"].strip(), name
        assert doc["return"], name


def test_inventory_plugin_is_listed():
    listed = ansible_doc("-t", "inventory", "-l", "gpuaas.fleet")
    assert list(listed) == ["gpuaas.fleet.controlplane"]
