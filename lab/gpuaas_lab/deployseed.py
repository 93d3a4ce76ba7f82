"""The MAAS deploy user-data, for real, on a lab host.

MAAS sends a deployed machine the project's deploy user-data
(``scripts/maas/cloud-init/gpuaas-slice-deploy.yaml.j2``), which installs the gpuaas.fleet
collection from a URL and runs its bootstrap against the host itself. Here the collection
tarball is built from this checkout and served over HTTP from the controller, where the lab
host reaches it on its bridge, and the rendered user-data goes into the host's NoCloud seed
beside the lab's own part (see ``hostlab.up(extra_user_data=...)``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from controlplane import deploy_user_data
from controlplane.deploy_user_data import DeployRequest
from controlplane.hostkeys import HostKey, generate_host_key
from gpuaas_lab import hostlab
from gpuaas_lab.hostlab import HostLabError, LabHost
from gpuaas_lab.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
# The lab image has no route to a package mirror and carries the slice packages already;
# it has no GPUs or fabric, so parity reports those without failing the deploy.
LAB_BOOTSTRAP_VARS: Mapping[str, Any] = MappingProxyType(
    {
        "slice_host_bootstrap_apt_update_cache": False,
        "gpuaas_bootstrap_parity_fail_on_failures": False,
    }
)


def build_collection(out_dir: Path) -> Path:
    """``ansible-galaxy collection build`` of this checkout, as an operator would publish it."""
    out_dir.mkdir(parents=True, exist_ok=True)
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    proc = subprocess.run(
        [str(galaxy), "collection", "build", "--force", "--output-path", str(out_dir)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise HostLabError("lab_collection_build_failed", proc.stderr.strip()[-1500:])
    return max(out_dir.glob("gpuaas-fleet-*.tar.gz"), key=lambda p: p.stat().st_mtime)


def render_deploy_user_data(
    collection_url: str,
    collection_sha256: str,
    profile: str = "slice-vm",
    bootstrap_vars: Mapping[str, Any] | None = None,
    host_key: tuple[str, HostKey] | None = None,
) -> str:
    """The template exactly as MAAS would be given it, rendered by the control plane."""
    request = DeployRequest(
        collection_url,
        collection_sha256,
        LAB_BOOTSTRAP_VARS if bootstrap_vars is None else bootstrap_vars,
    )
    return deploy_user_data.render(request, profile, host_key)


@dataclass(frozen=True)
class CollectionServer:
    """A plain HTTP server on this machine serving one directory (the collection)."""

    directory: Path
    port: int
    pid: int

    def url_for(self, host: LabHost, file: Path) -> str:
        """The file's URL as the lab host sees the controller: its bridge's gateway."""
        return f"http://{host.gateway}:{self.port}/{file.relative_to(self.directory)}"


@contextlib.contextmanager
def serve_directory(directory: Path) -> Iterator[CollectionServer]:
    """Serve ``directory`` read-only over HTTP until the block ends (stopped by its pid)."""
    port = free_port("0.0.0.0")
    argv = [sys.executable, "-m", "http.server", "--bind", "0.0.0.0"]
    proc = subprocess.Popen(
        [*argv, "--directory", str(directory), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise HostLabError("lab_http_failed", f"HTTP server on port {port} did not start")
            time.sleep(0.1)
        yield CollectionServer(directory, port, proc.pid)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def deploy_seed(
    server: CollectionServer,
    tarball: Path,
    profile: str = "slice-vm",
    host_key: tuple[str, HostKey] | None = None,
):
    """``extra_user_data`` for ``hostlab.up``: the deploy user-data pointing at ``tarball``
    on ``server`` through the new host's own bridge, seeding ``host_key`` when given (the
    SSH host key the control plane issues at deploy; pass its public half to ``hostlab.up``
    as ``seeded_host_key``)."""
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()

    def for_host(host: LabHost) -> str:
        url = server.url_for(host, tarball)
        return render_deploy_user_data(url, digest, profile, host_key=host_key)

    return for_host


def up_deployed(
    name: str, nvme: int = 2, profile: str = "slice-vm", state_dir: Path | None = None
) -> LabHost:
    """``hostlab.up`` as MAAS would deploy the host: the deploy user-data in its seed, the
    collection built from this checkout and served until its first boot has finished
    (cloud-init done, so the bootstrap has run). Its SSH host key is one the deploy
    user-data seeds, as the control plane issues it (docs/trust.md)."""
    # Before building the collection: without root that build is not what fails first.
    hostlab.require_usable()
    host_key = generate_host_key()
    with tempfile.TemporaryDirectory(prefix="gpuaas-collection-") as directory:
        tarball = build_collection(Path(directory))
        with serve_directory(Path(directory)) as server:
            return hostlab.up(
                name,
                nvme=nvme,
                extra_user_data=deploy_seed(server, tarball, profile, host_key),
                state_dir=state_dir,
                seeded_host_key=host_key[1],
            )
