"""Where the flows find the gpuaas.fleet collection (flows/collection.py): this checkout as
scripts/setup.sh exposes it, the paths GPUAAS_COLLECTIONS_PATH names, or Ansible's own
collection search; nowhere, a sentence saying where it looked."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.errors import GpuaasError
from flows.collection import COLLECTIONS_PATH_ENV, find_collection
from flows.runner import playbook_path, runner_environment
from tests.conftest import REPO_ROOT


def installed(collections_path: Path) -> Path:
    """A collection as ansible-galaxy leaves it: playbooks and its ansible.cfg."""
    root = collections_path / "ansible_collections" / "gpuaas" / "fleet"
    (root / "playbooks").mkdir(parents=True)
    (root / "playbooks" / "parity.yml").write_text("[]\n")
    (root / "ansible.cfg").write_text("[defaults]\n")
    return root


def test_in_a_checkout_the_collection_is_the_checkout(monkeypatch):
    monkeypatch.delenv(COLLECTIONS_PATH_ENV, raising=False)
    collection = find_collection()
    assert collection.root == REPO_ROOT
    assert collection.collections_path == REPO_ROOT / ".collections"
    environment = runner_environment(collection)
    assert environment["ANSIBLE_CONFIG"] == str(REPO_ROOT / "ansible.cfg")
    assert environment["ANSIBLE_COLLECTIONS_PATH"] == str(REPO_ROOT / ".collections")
    assert playbook_path("parity.yml") == REPO_ROOT / "playbooks" / "parity.yml"


def test_the_named_paths_come_first_and_alone(tmp_path, monkeypatch):
    root = installed(tmp_path / "second")
    (tmp_path / "first").mkdir()
    monkeypatch.setenv(COLLECTIONS_PATH_ENV, f"{tmp_path / 'first'}:{tmp_path / 'second'}")
    collection = find_collection()
    assert (collection.root, collection.collections_path) == (root, tmp_path / "second")
    assert runner_environment()["ANSIBLE_CONFIG"] == str(root / "ansible.cfg")
    assert playbook_path("parity.yml") == root / "playbooks" / "parity.yml"
    with pytest.raises(FileNotFoundError, match="looked up in " + str(root / "playbooks")):
        playbook_path("absent.yml")

    monkeypatch.setenv(COLLECTIONS_PATH_ENV, str(tmp_path / "first"))
    with pytest.raises(GpuaasError) as refused:
        find_collection()
    assert refused.value.code == "collection_not_found"
    assert f"{COLLECTIONS_PATH_ENV} ({tmp_path / 'first'})" in refused.value.message
    assert refused.value.details == {"searched": [str(tmp_path / "first")]}


def test_without_a_checkout_ansibles_own_search_finds_it(tmp_path):
    """A fresh process, as a flow run is, where the flows sit outside any checkout."""
    root = installed(tmp_path / "collections")
    script = (
        "import sys\nfrom pathlib import Path\nimport flows.collection as c\n"
        "c.CHECKOUT_COLLECTIONS = Path(sys.argv[1])\n"
        "try:\n    print(c.find_collection().root)\n"
        "except Exception as e:\n    print(e.code, e.details['searched'][0])\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PYTHONPATH": str(REPO_ROOT),
    }
    for collections_path, answer in (
        (tmp_path / "collections", str(root)),
        (tmp_path / "elsewhere", f"collection_not_found {tmp_path / 'elsewhere'}"),
    ):
        found = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "no-checkout")],
            env={**env, "ANSIBLE_COLLECTIONS_PATH": str(collections_path)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
        assert found.stdout.strip() == answer, found.stderr
