"""Controllers made from the release artifacts, and machines for them on one host.

``install_controller`` follows docs/operations.md ("Adding a controller from the release
artifacts"): scripts/build-artifacts.sh builds the wheel, the lock and the collection
tarball; a fresh venv gets the wheel with the lock and ``ansible-galaxy`` installs the
collection. Nothing of the checkout is used after the build.

A ``ControllerMachine`` is a network namespace of its own with an address on a site's
management bridge (the lab fleet's, gpuaas_lab.sshfleet): its worker reaches the Prefect
server, PostgreSQL and the hosts over that bridge, as a separate machine would, and
``lose`` ends it for good (every process in it or started from it, then the namespace).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flows.serve import CLIENT_AUTH_ENV, WORK_POOL, WORKER_ENVIRONMENT
from gpuaas_lab.processes import kill_tree

INSTALL_TIMEOUT = 1800
# What a service manager gives a worker, and pip's own settings for the install.
KEPT_ENVIRONMENT = ("HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Controller:
    """The venv and the collections directory made from the artifacts."""

    base: Path
    venv: Path
    collections: Path

    @property
    def collection(self) -> Path:
        return self.collections / "ansible_collections" / "gpuaas" / "fleet"


def bare_environment(venv: Path) -> dict[str, str]:
    kept = {
        key: value
        for key, value in os.environ.items()
        if key in KEPT_ENVIRONMENT or key.startswith(("LC_", "PIP_"))
    }
    return {**kept, "PATH": f"{venv / 'bin'}:{SYSTEM_PATH}"}


def run(argv: list[Any], env: dict[str, str], cwd: Path) -> None:
    done = subprocess.run(
        [str(arg) for arg in argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:4]}: {done.stdout[-2000:]}{done.stderr[-3000:]}")


def install_controller(checkout: Path, base: Path) -> Controller:
    """Build the artifacts from ``checkout``, then install a controller in ``base`` from
    them alone."""
    artifacts = base / "artifacts"
    run([checkout / "scripts" / "build-artifacts.sh", artifacts], dict(os.environ), base)
    [wheel] = artifacts.glob("gpuaas_fleet-*.whl")
    [tarball] = artifacts.glob("gpuaas-fleet-*.tar.gz")
    made = Controller(base, base / "venv", base / "collections")
    env = bare_environment(made.venv)
    run([Path(sys.executable).resolve(), "-m", "venv", made.venv], env, base)
    pip = [made.venv / "bin" / "python", "-m", "pip", "install", "-q"]
    run([*pip, "-r", artifacts / "requirements.lock", wheel], env, base)
    galaxy = made.venv / "bin" / "ansible-galaxy"
    run([galaxy, "collection", "install", tarball, "-p", made.collections], env, base)
    return made


def worker_environment(
    controller: Controller,
    home: Path,
    api_url: str,
    store_url: str,
    auth_string: str | None = None,
) -> dict[str, str]:
    """What the worker's service unit gives it (docs/operations.md): its own state under
    ``home``, the site's server (and its auth string, when it asks for one) and store, the
    installed collection."""
    return {
        **bare_environment(controller.venv),
        **WORKER_ENVIRONMENT,
        **({CLIENT_AUTH_ENV: auth_string} if auth_string is not None else {}),
        "PREFECT_API_URL": api_url,
        "PREFECT_HOME": str(home / "prefect"),
        "GPUAAS_DATABASE_URL": store_url,
        "GPUAAS_RUNS_DIR": str(home / "runs"),
        "GPUAAS_KNOWN_HOSTS_FILE": str(home / "known_hosts"),
        "ANSIBLE_COLLECTIONS_PATH": str(controller.collections),
    }


def start_worker(
    controller: Controller,
    name: str,
    env: dict[str, str],
    home: Path,
    prefix: list[str] | None = None,
    limit: int | None = None,
) -> subprocess.Popen:
    """The controller's Prefect worker, started in an empty working directory under
    ``home`` through ``prefix`` (a namespace to enter), its output in ``home/worker.log``."""
    workdir = home / "workdir"
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [*(prefix or []), str(controller.venv / "bin" / "prefect"), "worker", "start"]
    argv += ["--pool", WORK_POOL, "--name", name]
    if limit is not None:
        argv += ["--limit", str(limit)]
    with open(home / "worker.log", "ab") as log:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@dataclass
class ControllerMachine:
    """A network namespace with one address on ``bridge`` (in the root namespace)."""

    name: str
    namespace: str
    address: str
    prefixlen: int
    bridge: str
    veth: str
    home: Path
    worker: subprocess.Popen | None = None
    created: bool = field(default=False, init=False)

    def create(self) -> ControllerMachine:
        subprocess.run(["ip", "netns", "add", self.namespace], check=True)
        self.created = True
        inside = ["ip", "-n", self.namespace]
        peer = ["peer", "name", "eth0", "netns", self.namespace]
        for argv in (
            ["ip", "link", "add", self.veth, "type", "veth", *peer],
            ["ip", "link", "set", self.veth, "master", self.bridge, "up"],
            [*inside, "link", "set", "lo", "up"],
            [*inside, "addr", "add", f"{self.address}/{self.prefixlen}", "dev", "eth0"],
            [*inside, "link", "set", "eth0", "up"],
        ):
            subprocess.run(argv, capture_output=True, text=True, check=True)
        self.home.mkdir(parents=True, exist_ok=True)
        return self

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace]

    def start_worker(
        self,
        controller: Controller,
        api_url: str,
        store_url: str,
        limit: int | None = None,
        auth_string: str | None = None,
    ) -> subprocess.Popen:
        env = worker_environment(controller, self.home, api_url, store_url, auth_string)
        self.worker = start_worker(controller, self.name, env, self.home, self.prefix, limit)
        return self.worker

    def pids(self) -> list[int]:
        listed = subprocess.run(
            ["ip", "netns", "pids", self.namespace], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in listed.stdout.split() if pid.isdigit()]

    def lose(self) -> list[int]:
        """The machine gone for good: every process started from its worker (wherever it
        runs now) and every process in its namespace killed at once, then the namespace
        and its link removed. Returns the pids killed."""
        killed: list[int] = []
        if self.worker is not None:
            killed += kill_tree(self.worker.pid)
        if self.created:
            for pid in self.pids():
                killed += kill_tree(pid)
        if self.worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.worker.wait(timeout=30)
        self.close()
        return killed

    def stop_worker(self) -> None:
        """As a service manager stops it: SIGTERM to its process group, then SIGKILL."""
        if self.worker is None or self.worker.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.worker.pid, signal.SIGTERM)
        try:
            self.worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            kill_tree(self.worker.pid)
            self.worker.wait()

    def close(self) -> None:
        self.stop_worker()
        if self.created:
            for pid in self.pids():
                kill_tree(pid)
            subprocess.run(["ip", "link", "del", self.veth], capture_output=True, check=False)
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, check=False)
            self.created = False


def controller_machines(
    count: int, tag: str, bridge: str, subnet: str, base: Path
) -> list[ControllerMachine]:
    """``count`` machines (not yet created) taking the last addresses of ``subnet``, the
    end the lab fleet leaves free (its hosts count up from the start)."""
    network = ipaddress.ip_network(subnet)
    last = int(network.broadcast_address) - 1
    return [
        ControllerMachine(
            name=f"controller-{index}",
            namespace=f"gctl-{tag}-{index}",
            address=str(ipaddress.ip_address(last - index)),
            prefixlen=network.prefixlen,
            bridge=bridge,
            veth=f"gc{tag[:8]}{index}",
            home=base / f"controller-{index}",
        )
        for index in range(count)
    ]
