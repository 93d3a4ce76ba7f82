"""Running the storage playbooks for real and proving that refused runs changed nothing."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = REPO / ".venv" / "bin"


def ansible_environment() -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
    }


@dataclass
class PlaybookRun:
    rc: int
    document: dict
    stderr: str

    def task(self, name: str, host: str = "localhost") -> dict:
        """The host result of the last task called `name` (role prefixes ignored)."""
        found = None
        for play in self.document.get("plays", []):
            for task in play.get("tasks", []):
                if task["task"]["name"].split(" : ")[-1] == name and host in task["hosts"]:
                    found = task["hosts"][host]
        if found is None:
            raise AssertionError(f"task {name!r} did not run; stderr: {self.stderr[-2000:]}")
        return found


def run_playbook(
    playbook: str,
    extravars: dict,
    workdir: Path,
    env: dict[str, str],
    *,
    check: bool = False,
    diff: bool = False,
    wrap: list[str] | None = None,
) -> PlaybookRun:
    """ansible-playbook against localhost (optionally wrapped, e.g. in `unshare`)."""
    varsfile = workdir / f"vars-{time.monotonic_ns()}.json"
    varsfile.write_text(json.dumps(extravars))
    argv = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(REPO / "inventories" / "local.yml"),
        str(REPO / "playbooks" / playbook),
        "-e",
        f"@{varsfile}",
    ]
    argv += ["--check"] if check else []
    argv += ["--diff"] if diff else []
    proc = subprocess.run(
        [*(wrap or []), *argv], capture_output=True, text=True, env=env, cwd=REPO, timeout=600
    )
    start = proc.stdout.find("{")
    document = json.loads(proc.stdout[start:]) if start >= 0 else {}
    return PlaybookRun(proc.returncode, document, proc.stderr)


def run_module(
    name: str,
    args: dict,
    workdir: Path,
    *,
    check: bool = False,
    diff: bool = False,
    wrap: list[str] | None = None,
) -> dict:
    """Run one of the collection's modules the way Ansible does on a host (its file, an args
    file, the module's own argument spec and exit_json/fail_json), optionally wrapped (e.g.
    in a mount namespace). The module's JSON result, with `rc` added."""
    argsfile = workdir / f"args-{name}-{time.monotonic_ns()}.json"
    flags = {"_ansible_check_mode": check, "_ansible_diff": diff}
    argsfile.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {**args, **flags}}))
    module = REPO / ".collections" / "ansible_collections" / "gpuaas" / "fleet" / "plugins"
    argv = [str(VENV_BIN / "python"), str(module / "modules" / f"{name}.py"), str(argsfile)]
    env = {**os.environ, "PYTHONPATH": str(REPO / ".collections")}
    proc = subprocess.run(
        [*(wrap or []), *argv], capture_output=True, text=True, env=env, cwd=workdir, timeout=300
    )
    start = proc.stdout.find("{")
    if start < 0:
        raise AssertionError(f"{name} printed no result (rc {proc.returncode}): {proc.stderr}")
    return {**json.loads(proc.stdout[start:]), "rc": proc.returncode}


def raw_state(device: str) -> dict:
    """What `raw` means for a slice disk: no signatures, no partitions, no mounts."""
    out = subprocess.run(
        ["wipefs", "--no-act", "--json", device], capture_output=True, text=True, check=True
    ).stdout.strip()
    name = os.path.basename(device)
    return {
        "signatures": json.loads(out)["signatures"] if out else [],
        "partitions": sorted(p.name for p in Path(f"/sys/block/{name}").glob(f"{name}p*")),
        "mounted": any(
            source == device or source.startswith(f"{device}p") for source in mount_sources()
        ),
    }


def mount_sources() -> list[str]:
    return [line.split()[0] for line in Path("/proc/mounts").read_text().splitlines()]
