"""Health proofs on a real lab host (issue 48, item 6): the ``health_host`` of conftest.py,
a Debian 12 host under QEMU with two NVMe disks (its two slots' disks, by EUI) and three
empty hot-plug PCIe root ports. The health sweep flow (flows/health.py) runs in-process
and probes the live host over SSH; the real Postgres store judges each check.

The stand-ins: this machine has no GPU and no fabric, so each slot's GPU is an emulated
NVMe controller without namespaces hot-plugged through the QEMU monitor into a root port
of its own, and the slots' fabric VFs are functions 1 and 2 of a third port (function 0
stands for the PF). NVMe controllers because gpuaas.fleet.vfio_binding binds only NVIDIA
GPUs, Mellanox fabric functions and NVMe controllers (plugins/modules/vfio_binding.py): it
binds them to vfio-pci now and persistently (driverctl overrides). The lab host's kernel
puts them in IOMMU groups of the emulated Intel IOMMU from its first boot, without
``intel_iommu=on`` on its command line, so no reboot is needed. Discovery reads a recorded tree
(gpuaas_lab/hosttrees.py) naming those real addresses as the slots' GPUs and VFs, since
it would not call an NVMe controller a GPU; the probe reads only the live host
(``slice_health_root: /``): each device on the bus, on vfio-pci, in its IOMMU group, its
PCIe link and AER counters, and real nvme-cli SMART logs of the QEMU disks.

Proven:

- the stand-in GPU of a slot an allocation holds, taken off the bus by QMP ``device_del``
  while another allocation holds the other slot, fails that slot alone at the next sweep
  (``device_missing``, the node and the other slot healthy), impairs its allocation with
  one ``allocation.impaired`` outbox event and leaves the other active; released and
  wiped with a verified proof, the slot stays out of placement while its GPU is missing;
  added back with QMP ``device_add``, the device is on vfio-pci again by the host's own
  driverctl override, and two passing sweeps (PASSES_TO_RECOVER) bring the slot back,
  after which placement uses it;
- failed provisions clean themselves on the host: the provision flow refused by the
  host's preflight (the catalog's image not yet on the host) leaves both slots available,
  owing no wipe;
  with emulation allowed and a one-second readiness gate, the image is cloned onto the
  slot's NVMe disk and the domain started before the gate fails it (``disk_written``), and
  the remediate flow removes the domain, wipes the disk (signatures gone) with a verified
  proof and returns the slot; failed again with a partition of that disk mounted on the
  host, each wipe is refused and the third remediation quarantines the slot, the partition
  left mounted;
- the host powered off while two allocations hold its slots (QEMU stopped at once): the
  first two sweeps count it unreachable, the third (UNREACHABLE_TO_FAIL) fails the node,
  makes it unavailable and impairs both allocations, one event each. No slice VM runs:
  a VM inside this TCG guest would be TCG inside TCG (test_guest_route.py).

The power-off test runs last (file order); it leaves the host off, for the session's
teardown to remove.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.enums import AllocationState
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.health import IMPAIRED_EVENT, PASSES_TO_RECOVER, UNREACHABLE_TO_FAIL
from controlplane.services.inventory import NodeSpec
from flows.allocation import provision_allocation
from flows.fleet import approve_slots, discover_topology
from flows.health import health_sweep
from flows.reconcile import reconcile
from flows.remediation import remediate
from gpuaas_lab import hostlab, hosttrees
from gpuaas_lab.hostlab import console_tail
from gpuaas_lab.slicehost import LAB_SKU, lab_host_spec
from gpuaas_lab.vmguest import GuestImage, ensure_guest_image
from tests.integration.flows.test_allocation_flows import add_catalog_image
from tests.integration.hostlab.conftest import pin_lab_key, run_tasks, sh
from tests.integration.hostlab.test_storage_and_devices import REMOTE_TREE, copy_tree
from tests.integration.store_reads import wipe_proof_counts

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.labhost,
    pytest.mark.lab,
    pytest.mark.xdist_group("labhost"),
]

GPU_PORTS = (0, 1)
FABRIC_PORT = 2
# The sweep probes the live host, not the recorded tree discovery read.
LIVE = {"slice_health_root": "/"}
SETTLE_SECONDS = 300
IMAGE_DIR = "/var/lib/gpuaas/images"
# Where the quarantine proof mounts a partition of a slot's disk.
HELD = "/mnt/gpuaas-held"


@dataclasses.dataclass(frozen=True)
class StandIn:
    """A stand-in device: its QEMU id, root port, function and the guest's address of it."""

    qemu_id: str
    port: int
    function: int
    address: str

    def plug(self, host: hostlab.LabHost) -> None:
        hostlab.device_add(
            host,
            "nvme",
            self.qemu_id,
            bus=hostlab.root_port_id(self.port),
            addr=f"0.{self.function}",
            serial=f"GLSTAND{self.qemu_id.upper()}"[:20],
            # Function 0 of the fabric port carries the others (added last: device_add).
            multifunction=self.port == FABRIC_PORT,
        )


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The host made ready: its stand-ins by name, and its node signing key's public line."""

    devices: dict[str, StandIn]
    signing_key: str


def bus_behind(host: hostlab.LabHost, port: int) -> str:
    """The bus the firmware gave root port ``port`` (its secondary bus, 0000:BB)."""
    address = hostlab.root_port_address(port)
    return sh(host, f"ls /sys/bus/pci/devices/{address}/pci_bus").strip()


def listed(host: hostlab.LabHost, address: str) -> bool:
    return sh(host, f"test -e /sys/bus/pci/devices/{address} && echo yes || true").strip() == "yes"


def driver_of(host: hostlab.LabHost, address: str) -> str:
    return sh(host, f"basename $(readlink /sys/bus/pci/devices/{address}/driver) || true").strip()


def settle(host: hostlab.LabHost, what: str, done) -> None:
    """Wait for the guest to finish what hot-plug started (its handler runs on its own)."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while not done():
        if time.monotonic() > deadline:
            pytest.fail(f"{host.name}: {what} did not happen; console:\n{console_tail(host)}")
        time.sleep(2)


@pytest.fixture(scope="module")
def prepared(health_host: hostlab.LabHost, tmp_path_factory) -> Prepared:
    """The stand-ins plugged in and bound to vfio-pci by the collection's module, the slice
    network baseline and the node's signing key made (what approval and a verified wipe
    need)."""
    host = health_host
    devices = {}
    for port in GPU_PORTS:
        devices[f"gpu{port}"] = StandIn(f"gpu{port}", port, 0, f"{bus_behind(host, port)}:00.0")
    fabric_bus = bus_behind(host, FABRIC_PORT)
    for function in (1, 2):
        name = f"vf{function - 1}"
        devices[name] = StandIn(name, FABRIC_PORT, function, f"{fabric_bus}:00.{function}")
    devices["pf"] = StandIn("pf", FABRIC_PORT, 0, f"{fabric_bus}:00.0")
    for device in devices.values():
        device.plug(host)
    for device in devices.values():
        settle(host, f"{device.address} listed", lambda d=device: listed(host, d.address))
    passthrough = [d.address for name, d in devices.items() if name != "pf"]
    run = run_tasks(
        host,
        [
            {
                "name": "Bind the stand-ins to vfio-pci",
                "gpuaas.fleet.vfio_binding": {"nvme_controllers": passthrough, "bind_now": True},
            },
            {
                "name": "Bring up the slice network baseline",
                "ansible.builtin.include_role": {"name": "gpuaas.fleet.slice_network_baseline"},
            },
            {"name": "Ensure the evidence signing key", "gpuaas.fleet.node_signing_key": {}},
        ],
        tmp_path_factory.mktemp("prepare"),
    )
    assert run.rc == 0, run.failures()
    for address in passthrough:
        assert driver_of(host, address) == "vfio-pci", address
        assert sh(host, f"readlink /sys/bus/pci/devices/{address}/iommu_group").strip()
    signing_key = run.task("Ensure the evidence signing key", host.name)["public_key"]
    return Prepared(devices, signing_key)


def node_spec(host: hostlab.LabHost, **host_vars: object) -> NodeSpec:
    """The host as a slice node reached over SSH, with ``host_vars`` beside its own."""
    connection = host.host_vars()
    connection.pop("ansible_ssh_private_key_file")
    return NodeSpec(
        host.name,
        "lab",
        node_family=LAB_SKU.node_family,
        maas_tags=("gpuaas-profile-slice-vm",),
        gpu_count=len(GPU_PORTS),
        slice_subnet="10.100.0.0/24",
        management_address=connection.pop("ansible_host"),
        host_vars={**connection, "gpuaas_topology_root": REMOTE_TREE, **host_vars},
    )


@pytest.fixture
def cp(
    health_host: hostlab.LabHost,
    prepared: Prepared,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    database_url: str,
    prefect_harness,
) -> ControlPlane:
    """The health host as a slice node of a new store: two slots approved, each with a
    stand-in GPU and VF and one of the host's NVMe disks."""
    host = health_host
    spec = dataclasses.replace(
        lab_host_spec(host.name, [disk["eui64"] for disk in host.nvme]),
        gpus=tuple(hosttrees.Gpu(prepared.devices[f"gpu{port}"].address, 0) for port in GPU_PORTS),
        fabric=(hosttrees.FabricPort(prepared.devices["pf"].address, 0, "mlx5_0", vf_count=2),),
    )
    copy_tree(host, hosttrees.write_tree(spec, tmp_path / "tree"))
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setenv("ANSIBLE_PRIVATE_KEY_FILE", host.ssh_private_key)
    cp = ControlPlane.from_environment()
    cp.define_sku(LAB_SKU)
    cp.register_node(node_spec(host))
    pin_lab_key(cp, host)
    cp.pin_reported_signing_key(host.name, prepared.signing_key, "test")
    discover_topology(hostnames=[host.name])
    assert approve_slots(host.name)["approved"] == [0, 1]
    return cp


def active_allocation(cp: ControlPlane) -> tuple[uuid.UUID, int]:
    """A one-GPU lab slice placed and active: its id and its slot."""
    placed = cp.place(PlacementRequest(LAB_SKU.slug, 1))
    assert placed.placed, placed
    allocation = uuid.UUID(str(placed.allocation_id))
    cp.transition(allocation, AllocationState.PROVISIONING, "test")
    cp.transition(allocation, AllocationState.ACTIVE, "test")
    [claim] = cp.show_allocation(allocation).claims
    return allocation, claim.slot_index


def sweep(host: hostlab.LabHost) -> dict:
    """One health sweep of the host: its verdict row."""
    state = health_sweep(hostnames=[host.name], extravars=LIVE, return_state=True)
    assert state.is_completed(), state.message
    [row] = state.result()
    return row


def slot_states(cp: ControlPlane, hostname: str) -> dict[int, str]:
    return {slot.slot_index: slot.health_state for slot in cp.list_slots(hostname)}


def impaired_events(engine) -> list[tuple[str, dict]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT aggregate_id, payload FROM outbox WHERE event_type = :event ORDER BY id"),
            {"event": IMPAIRED_EVENT},
        ).all()
    return [(str(aggregate), payload) for aggregate, payload in rows]


def test_a_stand_in_gpu_unplugged_fails_only_its_slot_and_comes_back_when_plugged_in(
    health_host: hostlab.LabHost, prepared: Prepared, cp: ControlPlane, engine
) -> None:
    host = health_host
    first = sweep(host)
    assert (first["check"], first["node state"], first["findings"]) == ("recorded", "healthy", 0)
    assert slot_states(cp, host.name) == {0: "healthy", 1: "healthy"}

    tenant, slot = active_allocation(cp)
    neighbour, other = active_allocation(cp)
    assert {slot, other} == {0, 1}
    [gpu] = [s.gpu_pci_address for s in cp.list_slots(host.name) if s.slot_index == slot]
    [device] = [d for d in prepared.devices.values() if d.address == gpu]
    hostlab.device_del(host, device.qemu_id)
    assert not listed(host, gpu)

    unplugged = sweep(host)
    assert unplugged["failed slots"] == [slot], unplugged
    assert unplugged["node state"] == "healthy" and unplugged["critical"] == 1, unplugged
    assert unplugged["impaired allocations"] == 1
    assert slot_states(cp, host.name) == {slot: "failed", other: "healthy"}
    [failed] = [s for s in cp.list_slots(host.name) if s.slot_index == slot]
    assert "device_missing" in failed.health_detail and gpu in failed.health_detail
    impaired = cp.show_allocation(tenant)
    assert impaired.state == "impaired" and "device_missing" in impaired.impaired_reason
    assert cp.show_allocation(neighbour).state == "active"
    [(allocation_id, payload)] = impaired_events(engine)
    assert allocation_id == str(tenant) and payload["slots"] == [slot], payload

    # The tenant, told, releases it; the slot's disk is wiped with a verified proof, yet
    # the slot stays out of placement while its GPU is off the bus.
    cp.release(tenant, "test")
    wiped = reconcile(grace_seconds=0, compare_with_hosts=False)
    [row] = [r for r in wiped["slots"] if r["node"] == host.name]
    assert row["now"] == "available", row
    [failed] = [s for s in cp.list_slots(host.name) if s.slot_index == slot]
    assert (failed.status, failed.health_state, failed.wipe_required) == (
        "available",
        "failed",
        False,
    )
    refused = cp.place(PlacementRequest(LAB_SKU.slug, 1))
    assert not refused.placed, refused

    device.plug(host)
    settle(host, f"{gpu} listed again", lambda: listed(host, gpu))
    # The host's own persistent override (driverctl, written by vfio_binding) rebinds it.
    settle(host, f"{gpu} back on vfio-pci", lambda: driver_of(host, gpu) == "vfio-pci")

    passes = [sweep(host) for _ in range(PASSES_TO_RECOVER)]
    assert [row["findings"] for row in passes] == [0] * PASSES_TO_RECOVER
    assert [row["recovered slots"] for row in passes] == [[]] * (PASSES_TO_RECOVER - 1) + [[slot]]
    assert slot_states(cp, host.name) == {slot: "healthy", other: "healthy"}
    assert active_allocation(cp)[1] == slot
    assert len(impaired_events(engine)) == 1


def staged_guest_image() -> GuestImage:
    """The lab's guest image as the catalog knows it: where it is kept on the host."""
    return dataclasses.replace(ensure_guest_image(), path=f"{IMAGE_DIR}/lab-guest.raw")


def copy_guest_image(host: hostlab.LabHost) -> None:
    """The lab's guest image copied to the host, where the catalog says it is."""
    with open(ensure_guest_image().path, "rb") as source:
        subprocess.run(
            host.ssh_argv(
                "sudo", "-n", "sh", "-c", f"mkdir -p {IMAGE_DIR} && cat > {IMAGE_DIR}/lab-guest.raw"
            ),
            stdin=source,
            capture_output=True,
            check=True,
            timeout=600,
        )


def domains_on(host: hostlab.LabHost) -> list[str]:
    return sorted(sh(host, "virsh -c qemu:///system list --all --name").split())


def provision(cp: ControlPlane, public_key: str):
    """A one-GPU lab slice asked of the provision flow: its final state and allocation."""
    before = {a.id for a in cp.list_allocations()}
    state = provision_allocation(
        LAB_SKU.slug,
        1,
        "lab-guest",
        [{"name": "gpuuser", "ssh_authorized_keys": [public_key]}],
        return_state=True,
    )
    [allocation] = [a for a in cp.list_allocations() if a.id not in before]
    return state, allocation


def test_failed_provisions_on_a_lab_host_clean_themselves_or_end_quarantined(
    health_host: hostlab.LabHost, cp: ControlPlane, engine
) -> None:
    host = health_host
    image = staged_guest_image()
    add_catalog_image(engine, "lab-guest", image.sha256, image.path, [LAB_SKU.slug])
    public_key = host.host_public_key

    # The catalog's image is not on the host yet: the provision's preflight refuses before
    # writing anything, and the slots are placeable again at once, owing no wipe.
    refused, allocation = provision(cp, public_key)
    assert refused.is_failed()
    reason = cp.show_allocation(uuid.UUID(allocation.id)).failure_reason
    assert "does not exist in the node cache" in reason and image.path in reason, reason
    with engine.connect() as conn:
        progress = conn.execute(
            text("SELECT provision_progress FROM allocations WHERE id = :a"), {"a": allocation.id}
        ).scalar_one()
    assert progress == "nothing_on_host"
    assert {(s.status, s.wipe_required) for s in cp.list_slots(host.name)} == {("available", False)}
    assert cp.remediation_pending() == []
    copy_guest_image(host)

    # Emulation selected (this TCG guest's /dev/kvm is SVM emulated by TCG; a VM in it
    # never boots in time either way) and a readiness gate of one second: the image is
    # cloned onto the slot's NVMe disk and the domain started, then the gate fails the
    # provision. No passthrough: QEMU under TCG inside this TCG host
    # (test_guest_route.py).
    cp.register_node(
        node_spec(
            host,
            slice_vm_provision_emulation=True,
            slice_vm_provision_pci_passthrough=False,
            slice_vm_provision_readiness_timeout=1,
            slice_vm_release_shutdown_timeout=5,
        )
    )
    failed, allocation = provision(cp, public_key)
    assert failed.is_failed()
    domain = "gpuaas-slice-" + uuid.UUID(allocation.id).hex
    assert domain in domains_on(host)
    [slot] = [s for s in cp.list_slots(host.name) if s.status == "cleanup_blocked"]
    assert slot.wipe_required
    assert [p.progress for p in cp.remediation_pending()] == ["disk_written"]
    written = sh(host, f"wipefs -n {slot.nvme_device} | wc -l").strip()
    assert written != "0", "the clone left no signature on the slot disk"

    remediated = remediate()
    assert (remediated["allocations"], remediated["returned"], remediated["quarantined"]) == (
        1,
        1,
        0,
    ), remediated
    [row] = remediated["slots"]
    assert (row["slot"], row["now"]) == (slot.slot_index, "available"), row
    assert domain not in domains_on(host)
    assert sh(host, f"wipefs -n {slot.nvme_device}").strip() == ""
    with engine.connect() as conn:
        proofs = wipe_proof_counts(conn)
        assert audit(conn) == []
    assert proofs == (1, 1)
    assert {(s.status, s.wipe_required) for s in cp.list_slots(host.name)} == {("available", False)}

    # Failed again, then a partition of the slot's disk mounted on the host: each wipe is
    # refused, and the third remediation quarantines the slot for a person.
    failed, allocation = provision(cp, public_key)
    assert failed.is_failed()
    [slot] = [s for s in cp.list_slots(host.name) if s.status == "cleanup_blocked"]
    part = f"{slot.nvme_device}-part1"
    sh(
        host,
        f"sgdisk --zap-all {slot.nvme_device} >/dev/null && sgdisk -n 1:0:+64M"
        f" {slot.nvme_device} >/dev/null && udevadm settle && mkfs.ext4 -q -F {part}"
        f" && mkdir -p {HELD} && mount {part} {HELD}",
    )
    try:
        for attempt in (1, 2, 3):
            result = remediate()
            [row] = result["slots"]
            assert (row["now"], row["attempts"]) == ("cleanup_blocked", attempt), row
        [held] = [s for s in cp.list_slots(host.name) if s.slot_index == slot.slot_index]
        assert row["quarantined"] and result["quarantined"] == 1, result
        assert (held.status, held.health_state) == ("cleanup_blocked", "failed")
        assert held.health_detail.startswith("quarantined: "), held.health_detail
        assert cp.remediation_pending() == []
        assert sh(host, f"findmnt -n -o TARGET {part}").strip() == HELD
        with engine.connect() as conn:
            assert audit(conn) == []
    finally:
        sh(host, f"umount {HELD} || true")


def test_a_powered_off_host_fails_after_three_sweeps_and_its_tenants_are_told(
    health_host: hostlab.LabHost, cp: ControlPlane, engine
) -> None:
    host = health_host
    tenants = {active_allocation(cp)[0] for _ in GPU_PORTS}
    assert sweep(host)["node state"] == "healthy"

    hostlab.power_off(host)
    assert not host.running()
    rows = [sweep(host) for _ in range(UNREACHABLE_TO_FAIL)]
    assert [row["check"] for row in rows] == ["unreachable"] * UNREACHABLE_TO_FAIL
    assert [row["node state"] for row in rows[:-1]] == ["healthy"] * (UNREACHABLE_TO_FAIL - 1)
    assert rows[-1]["node state"] == "failed" and rows[-1]["impaired allocations"] == 2
    node = cp.show_node(host.name).node
    assert node.admin_state == "unavailable", node
    assert "unreachable" in (node.admin_state_reason or ""), node
    for tenant in tenants:
        shown = cp.show_allocation(tenant)
        assert shown.state == "impaired" and "unreachable" in shown.impaired_reason, shown
    assert {allocation for allocation, _payload in impaired_events(engine)} == {
        str(t) for t in tenants
    }
    assert len(impaired_events(engine)) == 2
