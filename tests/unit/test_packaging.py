"""The project's own metadata builds without warnings (what `make setup` prints)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from importlib.metadata import distribution
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_metadata_builds_without_deprecation_warnings(tmp_path):
    build = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from setuptools import build_meta; "
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))",
            str(tmp_path),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    assert "Deprecat" not in build.stderr, build.stderr
    info = tmp_path / build.stdout.strip().splitlines()[-1] / "METADATA"
    metadata = Parser().parsestr(info.read_text())
    assert metadata["License-Expression"] == "GPL-3.0-or-later"


def test_every_collection_file_carries_the_collections_licence():
    """galaxy.yml says GPL-3.0-or-later: so does every Python file the collection ships,
    and every role's meta/main.yml (Galaxy shows a role's own licence)."""
    galaxy = yaml.safe_load((REPO_ROOT / "galaxy.yml").read_text())
    assert galaxy["license"] == ["GPL-3.0-or-later"]
    header = "# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)"
    files = sorted((REPO_ROOT / "plugins").rglob("*.py"))
    without = [
        str(f.relative_to(REPO_ROOT))
        for f in files
        if f.name != "__init__.py" and header not in f.read_text().splitlines()[:5]
    ]
    assert files and without == []
    roles = sorted(path for path in (REPO_ROOT / "roles").iterdir() if path.is_dir())
    licences = {
        role.name: yaml.safe_load((role / "meta" / "main.yml").read_text())["galaxy_info"]
        for role in roles
    }
    disagreeing = {
        name: info.get("license")
        for name, info in licences.items()
        if info.get("license") != "GPL-3.0-or-later"
    }
    assert roles
    assert disagreeing == {}


def test_the_release_artifacts_hold_what_a_controller_runs_and_nothing_else(tmp_path):
    """scripts/build-artifacts.sh: the wheel with controlplane's package data, the lock, and
    the collection with its playbooks, roles, plugins and ansible.cfg (the settings the
    flows run it with), none of the checkout's other parts; the checkout is left as it was."""
    before = build_outputs()
    built = subprocess.run(
        [str(REPO_ROOT / "scripts" / "build-artifacts.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [wheel] = tmp_path.glob("gpuaas_fleet-*.whl")
    [tarball] = tmp_path.glob("gpuaas-fleet-*.tar.gz")
    assert (tmp_path / "requirements.lock").read_text() == (
        REPO_ROOT / "requirements.lock"
    ).read_text()
    digests = (tmp_path / "SHA256SUMS").read_text()
    assert all(name in digests for name in (wheel.name, tarball.name, "requirements.lock"))

    with zipfile.ZipFile(wheel) as archive:
        packaged = set(archive.namelist())
    data = {
        str(path.relative_to(REPO_ROOT))
        for pattern in ("sql/*.sql", "migrations/**/*.py", "migrations/script.py.mako", "*.yml")
        for path in (REPO_ROOT / "controlplane").glob(pattern)
        if "__pycache__" not in path.parts
    }
    assert data and data <= packaged, data - packaged
    assert {
        "flows/runner.py",
        "flows/collection.py",
        "gpuaas_cli/app.py",
        "gpuaas_cli/commands/common.py",
    } <= packaged
    assert {name.split("/")[0] for name in packaged} == {
        "controlplane",
        "flows",
        "gpuaas_cli",
        wheel.name.removesuffix("-py3-none-any.whl") + ".dist-info",
    }

    with tarfile.open(tarball) as archive:
        names = archive.getnames()
    tops = {name.split("/")[0] for name in names}
    assert tops == {
        "COPYING",
        "FILES.json",
        "MANIFEST.json",
        "README.md",
        "ansible.cfg",
        "changelogs",
        "inventories",
        "meta",
        "playbooks",
        "plugins",
        "roles",
    }
    playbooks = {p.name for p in (REPO_ROOT / "playbooks").glob("*.yml")}
    assert playbooks <= {Path(n).name for n in names if n.startswith("playbooks/")}
    assert "plugins/inventory/controlplane.py" in names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    assert build_outputs() == before


def build_outputs() -> set[str]:
    """What a build in the checkout would leave: entries of its root and of build/."""
    return {p.name for p in REPO_ROOT.iterdir()} | {
        f"build/{p.name}" for p in (REPO_ROOT / "build").glob("*")
    }


def pins(name: str) -> dict[str, str]:
    lines = (REPO_ROOT / name).read_text().split()
    return {canonicalize_name(line.split("==")[0]): line for line in lines}


def package_list(name: str) -> set[str]:
    text = (REPO_ROOT / "scripts" / name).read_text()
    return {line.split("#")[0].strip() for line in text.splitlines()} - {""}


def runtime_closure(*roots: str) -> set[str]:
    """The installed distributions the roots need without extras (markers evaluated here)."""
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in needed:
            continue
        needed.add(name)
        for line in distribution(name).requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return needed


def test_the_demo_layer_holds_what_the_product_and_the_lab_need():
    """make demo installs requirements.lock and scripts/system-packages.txt only: everything
    the project and the lab package need at run time is pinned there, the test layer adds
    only what nothing outside the tests needs, and no pin or package is in both layers."""
    demo, test = pins("requirements.lock"), pins("requirements-test.lock")
    assert all("==" in line for line in [*demo.values(), *test.values()])
    assert demo.keys() & test.keys() == set()
    needed = runtime_closure("gpuaas-fleet", "gpuaas-fleet-lab")
    assert needed & test.keys() == set()
    assert package_list("system-packages.txt") & package_list("system-packages-test.txt") == set()
