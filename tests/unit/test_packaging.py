"""The project's own metadata builds without warnings (what `make setup` prints)."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import yaml

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
    assert {"flows/runner.py", "flows/collection.py", "gpuaas_cli/app.py"} <= packaged
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
