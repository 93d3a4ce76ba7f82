"""`gpuaas lab host` run by a user who is not root, for real: the command's code runs with
the effective user `nobody` and answers with a clear error that names what root is needed
for, and nothing made: no state directory, no bridge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

NOBODY = 65534
DROPPED = "--- effective user nobody from here"
# Imported, and one refusal answered, as root first: a checkout need not be readable by
# others, and the refusal's path imports modules of its own.
AS_NOBODY = f"""
import os, sys
import gpuaas_cli.app, gpuaas_lab.deployseed, gpuaas_lab.hostlab
try:
    gpuaas_cli.app.main(["lab", "host", "up", "NOT A NAME"])
except SystemExit:
    pass
print("{DROPPED}", flush=True)
os.setegid({NOBODY})
os.seteuid({NOBODY})
gpuaas_cli.app.main(["lab", "host", *sys.argv[1:]])
"""


@pytest.mark.parametrize("command", [["up", "h1"], ["up", "h1", "--deploy"], ["down", "h1"]])
def test_without_root_it_refuses_and_makes_nothing(command: list[str], tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to run the command as another user")
    state = tmp_path / "lab-hosts"
    tmp_path.chmod(0o777)
    proc = subprocess.run(
        [sys.executable, "-c", AS_NOBODY, *command],
        capture_output=True,
        text=True,
        env={**os.environ, "GPUAAS_LAB_STATE_DIR": str(state), "HOME": str(tmp_path)},
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    error = json.loads(proc.stdout.split(DROPPED)[1])["error"]
    assert error["code"] == "lab_host_unavailable"
    assert "need root" in error["message"]
    assert not state.exists()
    assert not Path("/sys/class/net/glb-h1").exists()
