"""The project's own metadata builds without warnings (what `make setup` prints)."""

from __future__ import annotations

import subprocess
import sys
from email.parser import Parser
from pathlib import Path

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
    """galaxy.yml says GPL-3.0-or-later: so does every Python file the collection ships."""
    galaxy = (REPO_ROOT / "galaxy.yml").read_text()
    assert "GPL-3.0-or-later" in galaxy
    header = "# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)"
    files = sorted((REPO_ROOT / "plugins").rglob("*.py"))
    without = [
        str(f.relative_to(REPO_ROOT))
        for f in files
        if f.name != "__init__.py" and header not in f.read_text().splitlines()[:5]
    ]
    assert files and without == []
