"""Helpers for the discovery integration tests: playbooks in a namespace, daemons, probes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuaas_lab.netns import NetNamespace
from tests.integration.ansible_helpers import REPO, VENV_BIN, run_playbook

SLICE_SUBNET = "10.100.0.0/24"
GATEWAY = "10.100.0.1/24"


def run_playbooks(
    env: dict[str, str],
    playbooks: list[str],
    extravars: dict,
    workdir: Path,
    netns: NetNamespace | None = None,
    check: bool = False,
) -> tuple[int, dict]:
    """ansible-playbook (inside `netns` when given); returns (rc, json callback document)."""
    wrap = netns.exec_prefix() if netns is not None else None
    run = run_playbook(playbooks, extravars, workdir, env, check=check, wrap=wrap, timeout=300)
    return run.rc, run.document


def start_dnsmasq(
    ns: NetNamespace,
    workdir: Path,
    dhcp_range: str = "10.100.0.10,10.100.0.17,12h",
    extra: tuple[str, ...] = (),
):
    """A real dnsmasq serving `dhcp_range` on ovsbr0 inside the namespace."""
    tag = f"dnsmasq-{time.monotonic_ns()}"
    return ns.start_daemon(
        [
            "dnsmasq",
            "--keep-in-foreground",
            "--conf-file=/dev/null",
            "--port=0",
            "--bind-interfaces",
            "--interface=ovsbr0",
            "--except-interface=lo",
            f"--dhcp-range={dhcp_range}",
            f"--dhcp-leasefile={workdir / (tag + '.leases')}",
            f"--pid-file={workdir / (tag + '.pid')}",
            "--user=root",
            *extra,
        ],
        log_path=workdir / f"{tag}.log",
    )


# Runs parity checks (or discovery) in the caller's network namespace and prints JSON.
PROBE = """
import json, sys
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs, topology
request = json.loads(sys.argv[1])
if request["what"] == "topology":
    print(json.dumps(topology.discover(**request["options"])))
else:
    options = request["options"]
    if "pidfile_dirs" in options:
        options["pidfile_dirs"] = tuple(options["pidfile_dirs"])
    context = parity.ParityContext(host=sysfs.HostRoot(request["root"]), **options)
    print(json.dumps(parity.run_checks(context, request["checks"])))
"""


def _probe(ns: NetNamespace, request: dict, env: dict[str, str] | None) -> object:
    proc = subprocess.run(
        [*ns.exec_prefix(), sys.executable, "-c", PROBE, json.dumps(request)],
        env={
            **(env or {}),
            "PATH": f"{VENV_BIN}:/usr/sbin:/usr/bin:/sbin:/bin",
            "PYTHONPATH": f"{REPO / '.collections'}:{REPO}",
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def parity_in(
    ns: NetNamespace, root: Path, checks: list[str], env: dict[str, str] | None = None, **options
) -> dict[str, dict]:
    """check -> result of parity.run_checks run inside the namespace (a real process)."""
    request = {"what": "parity", "root": str(root), "checks": checks, "options": options}
    return {r["check"]: r for r in _probe(ns, request, env)}


def topology_in(ns: NetNamespace, root: Path, env: dict[str, str] | None = None, **options) -> dict:
    """topology.discover of `root` with live network evidence from inside the namespace."""
    options = {"root": str(root), "collected_at": "2026-04-24T10:00:00Z", **options}
    return _probe(ns, {"what": "topology", "options": options}, env)


def start_session_libvirtd(ns: NetNamespace, workdir: Path):
    """A real libvirtd in session mode as nobody, its sockets under `workdir` only.

    Session mode keeps it away from the system daemon's /run/libvirt state that other
    tests (VM lifecycle) may be using. Returns (daemon, socket path).
    """
    env = [
        f"HOME={workdir}",
        f"XDG_RUNTIME_DIR={workdir}/run",
        f"XDG_CONFIG_HOME={workdir}/config",
        f"XDG_CACHE_HOME={workdir}/cache",
    ]
    daemon = ns.start_daemon(
        [
            "setpriv",
            "--reuid=nobody",
            "--regid=nogroup",
            "--clear-groups",
            "--",
            "env",
            *env,
            "libvirtd",
        ],
        log_path=None,
    )
    sock = workdir / "run/libvirt/libvirt-sock"
    deadline = time.monotonic() + 20
    while not sock.exists():
        if time.monotonic() > deadline or not daemon.alive():
            pytest.fail("session libvirtd did not create its socket")
        time.sleep(0.1)
    return daemon, sock
