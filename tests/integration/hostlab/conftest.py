"""Two real Debian hosts under QEMU for the whole test session (one per xdist worker that
needs them; booting one takes one to two minutes under TCG): ``fresh``, booted with only
the lab's user-data, and ``deployed``, booted with the project's MAAS deploy user-data as
well, which bootstraps it on first boot. They boot side by side and are removed at the end
whatever happened, with the HTTP server that served the collection to the deployed one.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuaas_lab import deployseed, hostlab
from tests.integration.ansible_helpers import PlaybookRun, run_playbook

# test_storage_and_devices.py uses four controllers of the fresh host: a mirror, a volume
# group, a share disk and the spare passed to vfio-pci.
NVME = {"fresh": 4, "deployed": 2}


@pytest.fixture(scope="session")
def state_dir(tmp_path_factory) -> Path:
    reason = hostlab.unavailable_reason()
    if reason:
        pytest.skip(reason)
    return tmp_path_factory.mktemp("lab-hosts")


@pytest.fixture(scope="session")
def collection_server(tmp_path_factory) -> Iterator[tuple[deployseed.CollectionServer, Path]]:
    directory = tmp_path_factory.mktemp("collection")
    tarball = deployseed.build_collection(directory)
    with deployseed.serve_directory(directory) as server:
        yield server, tarball


@pytest.fixture(scope="session")
def lab_hosts(state_dir: Path, collection_server) -> Iterator[dict[str, hostlab.LabHost]]:
    server, tarball = collection_server
    suffix = uuid.uuid4().hex[:6]
    names = {"fresh": f"f{suffix}", "deployed": f"d{suffix}"}
    seeds = {"fresh": None, "deployed": deployseed.deploy_seed(server, tarball)}
    hosts: dict[str, hostlab.LabHost] = {}
    try:
        for role, name in names.items():
            hosts[role] = hostlab.up(
                name, nvme=NVME[role], extra_user_data=seeds[role], state_dir=state_dir, wait=False
            )
        for host in hosts.values():
            host.boot_seconds = host.wait_until_ready()
        yield hosts
    finally:
        for name in names.values():
            if (state_dir / name).exists():
                hostlab.down(name, state_dir=state_dir)


@pytest.fixture(scope="session")
def fresh(lab_hosts) -> hostlab.LabHost:
    return lab_hosts["fresh"]


@pytest.fixture(scope="session")
def deployed(lab_hosts) -> hostlab.LabHost:
    return lab_hosts["deployed"]


def sh(host: hostlab.LabHost, command: str) -> str:
    """``command`` as root on the host, its standard output."""
    return host.ssh("sudo", "-n", "sh", "-c", command).stdout


def run_tasks(
    host: hostlab.LabHost, tasks: list[dict], workdir: Path, timeout: float = 900
) -> PlaybookRun:
    """One play of ``tasks`` against the host over SSH (no fact gathering)."""
    playbook = workdir / f"tasks-{uuid.uuid4().hex[:8]}.yml"
    playbook.write_text(
        json.dumps(
            [{"name": "Lab host tasks", "hosts": "all", "gather_facts": False, "tasks": tasks}]
        )
    )
    inventory = inventory_of([host], workdir / f"{host.name}.ini")
    return run_playbook(str(playbook), {}, workdir, inventory=inventory, timeout=timeout)


def inventory_of(hosts: list[hostlab.LabHost], path: Path) -> Path:
    """An INI inventory of the hosts' ready lines, as `gpuaas lab host up` prints them."""
    path.write_text("".join(host.inventory_line() + "\n" for host in hosts))
    return path
