"""Running the collection for real from tests: ansible-playbook with the JSON callback, or
one module the way Ansible runs it on a host. The one home of this for every test suite."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
LOCAL_INVENTORY = REPO / "inventories" / "local.yml"


def ansible_environment(**overrides: str) -> dict[str, str]:
    """The venv on PATH, the repository's ansible.cfg and collection, the JSON callback."""
    return {
        **os.environ,
        "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(REPO / ".collections"),
        "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
        "ANSIBLE_NOCOLOR": "1",
        **overrides,
    }


def merge_json_documents(text: str) -> dict | None:
    """The json callback prints one document per playbook file; join their plays and stats."""
    decoder = json.JSONDecoder()
    merged: dict | None = None
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return merged
        try:
            document, position = decoder.raw_decode(text, position)
        except ValueError:
            return merged
        if merged is None:
            merged = document
        else:
            merged["plays"].extend(document["plays"])
            for host, counts in document["stats"].items():
                totals = merged["stats"].setdefault(host, dict.fromkeys(counts, 0))
                for key, value in counts.items():
                    totals[key] = totals.get(key, 0) + value


def task_result(document: dict, task_name: str, host: str = "localhost") -> dict:
    """The last result of a task (matched by name suffix, roles prefix theirs) for a host."""
    found = [
        task["hosts"][host]
        for play in document.get("plays", [])
        for task in play["tasks"]
        if task["task"]["name"].endswith(task_name) and host in task["hosts"]
    ]
    assert found, f"task {task_name!r} did not run for {host}"
    return found[-1]


@dataclass(frozen=True)
class PlaybookRun:
    rc: int
    document: dict
    stderr: str

    def task(self, name: str, host: str = "localhost") -> dict:
        """The host result of the last task called `name` (role prefixes ignored)."""
        found = [
            task["hosts"][host]
            for play in self.document.get("plays", [])
            for task in play["tasks"]
            if task["task"]["name"].split(" : ")[-1] == name and host in task["hosts"]
        ]
        if not found:
            raise AssertionError(f"task {name!r} did not run; stderr: {self.stderr[-2000:]}")
        return found[-1]

    def failures(self) -> str:
        """Each failed or unreachable task with its message, for an assertion's message."""
        lines = [
            f"{task['task']['name']} on {host}: "
            + str(result.get("msg") or result.get("stderr") or result)[:1500]
            for play in self.document.get("plays", [])
            for task in play["tasks"]
            for host, result in task["hosts"].items()
            if result.get("failed") or result.get("unreachable")
        ]
        return "\n".join(lines) or self.stderr[-3000:]


def run_playbook(
    playbooks: str | list[str],
    extravars: dict,
    workdir: Path,
    env: dict[str, str] | None = None,
    *,
    inventory: Path = LOCAL_INVENTORY,
    check: bool = False,
    diff: bool = False,
    wrap: list[str] | None = None,
    timeout: float = 600,
) -> PlaybookRun:
    """ansible-playbook (optionally wrapped, e.g. in a namespace); playbooks are names under
    playbooks/ or paths. Fails the test when ansible-playbook printed no JSON at all."""
    varsfile = workdir / f"vars-{time.monotonic_ns()}.json"
    varsfile.write_text(json.dumps(extravars))
    names = [playbooks] if isinstance(playbooks, str) else playbooks
    argv = [
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        *(str(REPO / "playbooks" / p) if "/" not in p else p for p in names),
        "-e",
        f"@{varsfile}",
    ]
    argv += ["--check"] if check else []
    argv += ["--diff"] if diff else []
    proc = subprocess.run(
        [*(wrap or []), *argv],
        capture_output=True,
        text=True,
        env=env or ansible_environment(),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )
    document = merge_json_documents(proc.stdout)
    if document is None:
        pytest.fail(
            f"ansible-playbook printed no JSON (rc {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
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
