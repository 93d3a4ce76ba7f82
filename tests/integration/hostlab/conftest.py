"""Real Debian hosts under QEMU for the whole test session (one per xdist worker that
needs them), booted only if a selected test uses them, all at once, each fixture waiting
only for its own host: ``fresh``, booted with only the lab's user-data, ``sriov``, whose
second NVMe controller is an SR-IOV PF (real VFs for the bootstrap), ``health_host``, with
empty hot-plug PCIe root ports for stand-in devices (test_health_on_a_lab_host.py, which
powers it off at the end, so no other test uses it), and ``deployed``,
booted with the project's MAAS deploy user-data as well, which bootstraps it on first boot
(the longest wait of the suite: its tests run last, so the others run meanwhile). They are
removed at the end whatever happened, with the HTTP server that served the collection to
the deployed one.

Every test here says its tier (tests/tiers.py): ``smoke`` (test_deploy_smoke.py, in make
test) or ``lab`` (make test-lab).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import HostKeySource
from controlplane.hostkeys import generate_host_key
from controlplane.services.inventory import NodeSpec
from gpuaas_lab import deployseed, hostlab
from tests.integration.ansible_helpers import PlaybookRun, run_playbook

# test_storage_and_devices.py uses four controllers of the fresh host: a mirror, a volume
# group, a share disk and the spare passed to vfio-pci. test_vfs_across_cold_boots.py uses
# the sriov host's second controller, an SR-IOV PF of three VFs at most.
# test_health_on_a_lab_host.py: the health host's two controllers are its slots' disks,
# its root ports hold the slots' stand-in GPUs (one port each) and fabric functions.
NVME = {"fresh": 4, "deployed": 2, "sriov": 2, "health_host": 2}
SRIOV_MAX_VFS = {"sriov": {1: 3}}
ROOT_PORTS = {"health_host": 3}
SLICE_SUBNET = "10.100.0.0/24"


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
def lab_hosts(request, state_dir: Path) -> Iterator[dict[str, hostlab.LabHost]]:
    """The hosts the session's selected tests use, started and not waited for (see
    ``ready``)."""
    wanted = [
        role for role in NVME if any(role in item.fixturenames for item in request.session.items)
    ]
    suffix = uuid.uuid4().hex[:6]
    names = {role: f"{role[0]}{suffix}" for role in wanted}
    hosts: dict[str, hostlab.LabHost] = {}
    try:
        for role, name in names.items():
            seed, seeded = None, None
            if role == "deployed":
                # Its SSH host key comes with its deploy user-data, as the control plane
                # issues it (docs/trust.md, "Host keys issued at deploy").
                server, tarball = request.getfixturevalue("collection_server")
                deploy_key = generate_host_key()
                seed = deployseed.deploy_seed(server, tarball, host_key=deploy_key)
                seeded = deploy_key[1]
            hosts[role] = hostlab.up(
                name,
                nvme=NVME[role],
                extra_user_data=seed,
                state_dir=state_dir,
                wait=False,
                seeded_host_key=seeded,
                sriov_max_vfs=SRIOV_MAX_VFS.get(role),
                root_ports=ROOT_PORTS.get(role, 0),
            )
        yield hosts
    finally:
        for name in names.values():
            if (state_dir / name).exists():
                hostlab.down(name, state_dir=state_dir)


def ready(host: hostlab.LabHost) -> hostlab.LabHost:
    """The host once SSH answers and cloud-init is done (waited for once)."""
    if host.boot_seconds is None:
        host.boot_seconds = host.wait_until_ready()
    return host


@pytest.fixture(scope="session")
def fresh(lab_hosts) -> hostlab.LabHost:
    return ready(lab_hosts["fresh"])


@pytest.fixture(scope="session")
def deployed(lab_hosts) -> hostlab.LabHost:
    return ready(lab_hosts["deployed"])


@pytest.fixture(scope="session")
def sriov(lab_hosts) -> hostlab.LabHost:
    return ready(lab_hosts["sriov"])


@pytest.fixture(scope="session")
def health_host(lab_hosts) -> hostlab.LabHost:
    return ready(lab_hosts["health_host"])


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of the deployed host after all others (a stable sort keeps the rest in order)."""
    items.sort(key=lambda item: "deployed" in getattr(item, "fixturenames", ()))


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


def ssh_key(host: hostlab.LabHost) -> dict[str, str]:
    """The lab key for the flows' extra variables: the store refuses key paths in host
    variables, and the runner passes secret-looking variables in a private file."""
    return {"ansible_ssh_private_key_file": host.ssh_private_key}


def pin_lab_key(
    cp: ControlPlane, host: hostlab.LabHost, source: HostKeySource = HostKeySource.OPERATOR
) -> None:
    """The host key the host was seeded with, pinned as an operator pins a checked key or,
    for a deploy's, as ``issue_deploy_user_data`` pins the key it issues (the store of a
    test begins after the hosts boot)."""
    cp.pin_host_keys(host.name, [host.host_public_key], source, "lab", "seeded at first boot")


@pytest.fixture
def control_plane(lab_hosts, tmp_path, database_url, monkeypatch, prefect_harness):
    """The store, with the session's lab hosts registered as slice nodes reached over SSH
    and their host keys pinned (their addresses and keys are known before they finish
    booting)."""
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    cp = ControlPlane.from_environment()
    for host in lab_hosts.values():
        connection = host.host_vars()
        connection.pop("ansible_ssh_private_key_file")
        cp.register_node(
            NodeSpec(
                host.name,
                "region-lab-1",
                maas_tags=("gpuaas-profile-slice-vm",),
                gpu_count=0,
                slice_subnet=SLICE_SUBNET,
                management_address=connection.pop("ansible_host"),
                host_vars=connection,
            )
        )
        pin_lab_key(
            cp,
            host,
            HostKeySource.DEPLOY if host is lab_hosts.get("deployed") else HostKeySource.OPERATOR,
        )
    return cp


def node_task_outputs(engine, kind: str, hostname: str) -> list[dict]:
    with engine.connect() as conn:
        return [
            row.output
            for row in conn.execute(
                text(
                    "SELECT t.output FROM node_tasks t JOIN nodes n ON n.id = t.node_id"
                    " WHERE t.kind = :kind AND n.hostname = :hostname ORDER BY t.created_at"
                ),
                {"kind": kind, "hostname": hostname},
            )
        ]


def parity_results(output: dict) -> dict[str, dict]:
    return {r["check"]: r for r in (output["result"] or {})["results"]}
