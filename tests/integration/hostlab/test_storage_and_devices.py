"""Disks and devices of a real host over SSH with become, on the ``fresh`` lab host of
conftest.py (four emulated NVMe controllers, a virtio OS disk): disk_wipe against real NVMe
controllers, md and LVM and mounts and open handles the host really has, the OS disk;
storage_transition followed by a cold boot with the controllers reseated in other PCI slots
(kernel names reshuffled); vfio_binding of a spare NVMe controller across that boot; the
topology of the live kernel before and after; and the reconcile flow wiping a released
slot's disk on the host, its proof settled in the store.

Runs after test_lab_host.py (file order within the xdist group), which needs the host as it
booted: this module changes its kernel arguments, disks and network.
"""

from __future__ import annotations

import json
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.evidence_signing import public_line
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import AllocationState
from controlplane.errors import InvalidInput
from controlplane.scheduler.placement import PlacementRequest
from controlplane.services.inventory import NodeSpec
from flows.fleet import approve_slots, discover_topology
from flows.reconcile import reconcile
from gpuaas_lab import hostlab, hosttrees
from gpuaas_lab.hostlab import console_tail
from gpuaas_lab.slicehost import LAB_SKU, lab_host_spec
from tests.integration.ansible_helpers import PlaybookRun
from tests.integration.hostlab.conftest import pin_lab_key, run_tasks, sh
from tests.integration.wipe_proofs import node_key

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.labhost,
    pytest.mark.lab,
    pytest.mark.xdist_group("labhost"),
]

APPROVAL = "INFRA-1842: lab host disks"
MD_ARRAY = "/dev/md/glmirror"
VOLUME_GROUP = "gltenant"


def wipe(name: str, device: str, **options) -> dict:
    return {
        "name": name,
        "gpuaas.fleet.disk_wipe": {
            "device": device,
            "approval": APPROVAL,
            "sample_count": 8,
            **options,
        },
        "ignore_errors": True,
    }


def kernel(host: hostlab.LabHost, by_id: str) -> str:
    return sh(host, f"readlink -f {by_id}").strip()


def refusal_codes(run: PlaybookRun, task: str, host: str) -> set[str]:
    result = run.task(task, host)
    assert result.get("failed") and not result.get("changed"), result
    return {r["code"] for r in result["refused"]}


def proof_of(run: PlaybookRun, task: str, host: str) -> dict:
    result = run.task(task, host)
    assert not result.get("failed"), result.get("msg")
    proof = result["proof"]
    assert proof["verified"] is True and not proof["signatures_after"], proof
    assert all(m["written"] and m["gone"] for m in proof["markers"]), proof["markers"]
    assert all(s["all_zero"] for s in proof["samples"]), proof["samples"]
    return proof


def test_wipe_refuses_what_the_host_uses_and_erases_what_the_tenant_left(
    fresh: hostlab.LabHost, tmp_path: Path
) -> None:
    mirror_a, mirror_b, lvm_disk, share_disk = (d["by_id"] for d in fresh.nvme)
    # What a host really has on its disks: an active RAID1 mirror over two NVMe disks, an
    # active LVM logical volume, a mounted partition; each holds a known line of data.
    sh(
        fresh,
        f"yes | mdadm --create {MD_ARRAY} --level=1 --raid-devices=2 --metadata=1.2"
        f" --assume-clean --run {mirror_a} {mirror_b}"
        f" && pvcreate -ff -y {lvm_disk} && vgcreate {VOLUME_GROUP} {lvm_disk}"
        f" && lvcreate -y -L 64M -n data {VOLUME_GROUP}"
        f" && sgdisk --zap-all --new=1:0:+256M {share_disk}"
        f" && udevadm wait --settle --timeout=120 {share_disk}-part1"
        f" && mkfs.ext4 -q {share_disk}-part1 && mkdir -p /mnt/glshare"
        f" && mount {share_disk}-part1 /mnt/glshare"
        " && echo tenant-data > /mnt/glshare/keep"
        f" && echo mirror-data | dd of={MD_ARRAY} conv=fsync status=none"
        f" && echo volume-data | dd of=/dev/{VOLUME_GROUP}/data conv=fsync status=none",
    )
    in_use = run_tasks(
        fresh,
        [
            wipe("Wipe an active md member", mirror_a),
            wipe("Wipe a disk under an active LVM volume", lvm_disk),
            wipe("Wipe a disk with a mounted partition", share_disk),
            wipe("Wipe the OS disk", hostlab.OS_DISK_BY_ID),
        ],
        tmp_path,
    )
    assert "md_member" in refusal_codes(in_use, "Wipe an active md member", fresh.name)
    assert "dm_holder" in refusal_codes(
        in_use, "Wipe a disk under an active LVM volume", fresh.name
    )
    assert "child_mounted" in refusal_codes(
        in_use, "Wipe a disk with a mounted partition", fresh.name
    )
    assert {"os_disk", "system_mount"} <= refusal_codes(in_use, "Wipe the OS disk", fresh.name)
    # Refused means untouched: every array, volume, file and the host itself as before.
    assert sh(fresh, f"head -c 11 {MD_ARRAY}") == "mirror-data"
    assert sh(fresh, f"head -c 11 /dev/{VOLUME_GROUP}/data") == "volume-data"
    assert sh(fresh, "cat /mnt/glshare/keep").strip() == "tenant-data"
    assert "active" in sh(fresh, f"mdadm --detail {MD_ARRAY}")
    assert sh(fresh, "systemctl is-system-running || true").strip() == "running"

    # The tenant is gone: the mirror stopped, the volume group deactivated, the partition
    # unmounted; a process still holds the share disk open.
    sh(
        fresh,
        f"mdadm --stop {MD_ARRAY} && vgchange -an {VOLUME_GROUP} && umount /mnt/glshare"
        f" && systemd-run --unit=glholder sh -c 'exec sleep 900 < {share_disk}'"
        " && sleep 1",
    )
    try:
        left = run_tasks(
            fresh,
            [
                wipe("Wipe a disk a process holds open", share_disk),
                wipe("Wipe an inactive md member with the controller's format", mirror_a),
                wipe("Wipe the other inactive md member", mirror_b, method="blkdiscard"),
                wipe("Wipe an inactive LVM physical volume", lvm_disk),
            ],
            tmp_path,
        )
    finally:
        sh(fresh, "systemctl stop glholder || true")
    busy = left.task("Wipe a disk a process holds open", fresh.name)
    assert {r["code"] for r in busy["refused"]} == {"device_busy"}, busy["refused"]
    assert "sleep" in busy["msg"] + json.dumps(busy["refused"])
    assert sh(fresh, f"blkid -o value -s TYPE {share_disk}-part1").strip() == "ext4"

    formatted = proof_of(
        left, "Wipe an inactive md member with the controller's format", fresh.name
    )
    assert "linux_raid_member" in {s["type"] for s in formatted["signatures_before"]}
    # QEMU's controller supports Format NVM (OACS bit 1) with no FNA bits: Identify
    # Controller chooses a user data erase of this namespace, sent to the controller device.
    [attempt] = formatted["attempts"]
    assert (attempt["method"], attempt["ok"], formatted["method"]) == (
        "nvme_format",
        True,
        "nvme_format",
    ), formatted["attempts"]
    assert attempt["secure_erase"] == {"ses": 1, "lbaf": 0, "why": "user data erase (FNA=0x0)"}
    assert re.search(r"nvme format /dev/nvme\d+ --namespace-id=1 --ses=1 ", attempt["command"])
    assert [c.split()[1] for c in formatted["commands"][:3]] == ["id-ctrl", "id-ns", "format"]
    discarded = proof_of(left, "Wipe the other inactive md member", fresh.name)
    assert discarded["method"] == "blkdiscard", discarded["attempts"]
    volume = proof_of(left, "Wipe an inactive LVM physical volume", fresh.name)
    assert "LVM2_member" in {s["type"] for s in volume["signatures_before"]}
    for disk in (mirror_a, mirror_b, lvm_disk):
        assert sh(fresh, f"wipefs --noheadings {disk}").strip() == ""
    assert VOLUME_GROUP not in sh(fresh, "vgs --noheadings -o vg_name")
    assert MD_ARRAY not in sh(fresh, "ls /dev/md 2>/dev/null || true")


def nvme_map(run: PlaybookRun, host: str) -> dict[str, dict]:
    """The live topology's NVMe disks by controller serial."""
    topology = run.task("Discover the topology", host)["topology"]
    assert not any(d["os_disk"] for d in topology["nvme_devices"])
    return {d["serial"]: d for d in topology["nvme_devices"]}


def driver_of(host: hostlab.LabHost, address: str) -> str:
    return sh(host, f"basename $(readlink /sys/bus/pci/devices/{address}/driver) || true").strip()


def test_storage_transition_and_vfio_binding_across_a_reboot_with_the_disks_reseated(
    fresh: hostlab.LabHost, tmp_path: Path
) -> None:
    share = fresh.nvme[2]
    spare = fresh.nvme[1]
    disk = share["by_id"]
    root_controller = sh(
        fresh, f"readlink -f /sys/class/block/$(basename $(readlink -f {hostlab.OS_DISK_BY_ID}))"
    ).split("/")[-4]
    # A share disk as GPU hosts have them before slice mode: two partitions mounted at
    # boot from /etc/fstab, one by file system UUID and one by its by-id partition link.
    sh(
        fresh,
        f"sgdisk --zap-all --new=1:0:+128M --new=2:0:+128M {disk}"
        # Wait for the links, not only the queue (docs/slice-host.md, "Lab hosts under load").
        f" && udevadm wait --settle --timeout=120 {disk}-part1 {disk}-part2"
        f" && mkfs.ext4 -q {disk}-part1 && mkfs.ext4 -q {disk}-part2"
        " && mkdir -p /srv/share1 /srv/share2"
        f' && echo "UUID=$(blkid -o value -s UUID {disk}-part1) /srv/share1 ext4 defaults 0 2"'
        " >> /etc/fstab"
        f" && echo '{disk}-part2 /srv/share2 ext4 defaults 0 2' >> /etc/fstab"
        " && mount /srv/share1 && mount /srv/share2 && echo share > /srv/share1/data",
    )
    fstab_before = sh(fresh, "cat /etc/fstab")
    topology_task = {
        "name": "Discover the topology",
        "gpuaas.fleet.slice_topology": {"node": fresh.name},
    }
    transition = {
        "name": "Transition the share disk",
        "gpuaas.fleet.storage_transition": {
            "devices": [disk],
            "approved_devices": [disk],
            "approval": APPROVAL,
            "apply": True,
        },
    }
    before = run_tasks(
        fresh,
        [
            topology_task,
            {
                "name": "Bind the controller behind the root file system",
                "gpuaas.fleet.vfio_binding": {"nvme_controllers": [root_controller]},
                "ignore_errors": True,
            },
            {
                "name": "Stage the IOMMU kernel arguments",
                "gpuaas.fleet.kernel_cmdline": {"cpu_vendor": "intel"},
            },
            {
                "name": "Bind the spare controller to vfio-pci at boot",
                "gpuaas.fleet.vfio_binding": {"nvme_controllers": [spare["pci_address"]]},
            },
            transition,
        ],
        tmp_path,
    )
    assert before.rc == 0, before.failures()
    mapped = nvme_map(before, fresh.name)
    shared = mapped[share["serial"]]
    assert shared["has_mounted_children"] and set(shared["mountpoints"]) >= {
        "/srv/share1",
        "/srv/share2",
    }, shared
    refused = before.task("Bind the controller behind the root file system", fresh.name)
    assert refused["failed"] and root_controller in refused["msg"], refused
    assert "system mount" in refused["msg"] and "/" in refused["msg"], refused["msg"]
    assert sh(fresh, "ls /etc/driverctl.d/ 2>/dev/null || true").split() == [
        f"pci-{spare['pci_address']}"
    ]
    bound = before.task("Bind the spare controller to vfio-pci at boot", fresh.name)
    assert bound["reboot_required"] and bound["rebind_required"] == [spare["pci_address"]]
    applied = before.task("Transition the share disk", fresh.name)
    assert applied["changed"], applied
    fstab = sh(fresh, "cat /etc/fstab")
    disabled = [line for line in fstab.splitlines() if "/srv/share" in line]
    assert len(disabled) == 2 and all(
        line.startswith("# gpuaas-slice-storage-disabled") for line in disabled
    )
    assert [line for line in fstab.splitlines() if "/srv/share" not in line] == [
        line for line in fstab_before.splitlines() if "/srv/share" not in line
    ]
    assert sh(fresh, f"wipefs --noheadings {disk}; lsblk -no NAME {disk} | wc -l").split() == ["1"]
    assert json.loads(sh(fresh, f"cat {applied['manifest_path']}"))["approval"] == APPROVAL
    assert sh(fresh, "findmnt -n /srv/share1 /srv/share2 || true").strip() == ""

    # A cold boot with the controllers reseated: every disk but the spare changes PCI slot,
    # so the kernel enumerates (and names) them in another order.
    slots = [d["slot"] for d in fresh.nvme]
    reseated = [slots[2], slots[1], slots[3], slots[0]]
    old_addresses = {d["serial"]: d["pci_address"] for d in fresh.nvme}
    hostlab.power_cycle(fresh, nvme_slots=reseated)
    fresh.wait_until_ready()
    state = sh(fresh, "systemctl is-system-running --wait || true").strip()
    assert state == "running", sh(fresh, "systemctl --failed --no-legend") + console_tail(fresh)
    assert sh(fresh, "findmnt -n /srv/share1 /srv/share2 || true").strip() == ""
    cmdline = sh(fresh, "cat /proc/cmdline").split()
    assert "intel_iommu=on" in cmdline and "iommu=pt" in cmdline, cmdline
    assert driver_of(fresh, spare["pci_address"]) == "vfio-pci"
    group = sh(
        fresh, f"basename $(readlink /sys/bus/pci/devices/{spare['pci_address']}/iommu_group)"
    )
    assert group.strip().isdigit()

    after = run_tasks(
        fresh,
        [
            topology_task,
            {**transition, "name": "Transition the share disk again"},
            {
                "name": "Report the binding",
                "gpuaas.fleet.vfio_binding": {"nvme_controllers": [spare["pci_address"]]},
            },
        ],
        tmp_path,
    )
    assert after.rc == 0, after.failures()
    remapped = nvme_map(after, fresh.name)
    # The spare controller is on vfio-pci: the host no longer sees its disk.
    assert spare["serial"] not in remapped
    for serial, disk_before in mapped.items():
        if serial == spare["serial"]:
            continue
        disk_after = remapped[serial]
        assert disk_after["stable_path"] == disk_before["stable_path"], (disk_before, disk_after)
        assert disk_after["pci_address"] != old_addresses[serial]
    moved = {
        s: (mapped[s]["kernel_name"], remapped[s]["kernel_name"])
        for s in remapped
        if mapped[s]["kernel_name"] != remapped[s]["kernel_name"]
    }
    assert moved, "the reseated controllers kept their kernel names"
    assert not remapped[share["serial"]]["partitions"] and not remapped[share["serial"]]["mounted"]
    assert after.task("Transition the share disk again", fresh.name)["changed"] is False
    report = after.task("Report the binding", fresh.name)
    assert report["changed"] is False and report["reboot_required"] is False
    assert report["devices"][0]["iommu_group"] == int(group)

    # Handing the controller back: the override goes, nvme takes it again, the disk returns.
    released = run_tasks(
        fresh,
        [
            {
                "name": "Release the spare controller",
                "gpuaas.fleet.vfio_binding": {"nvme_controllers": [], "bind_now": True},
            }
        ],
        tmp_path,
    )
    assert released.rc == 0, released.failures()
    result = released.task("Release the spare controller", fresh.name)
    assert result["released_now"] == [spare["pci_address"]]
    assert driver_of(fresh, spare["pci_address"]) == "nvme"
    assert kernel(fresh, spare["by_id"]).startswith("/dev/nvme")


# A recorded tree on the lab host for discovery: one GPU and one fabric VF (this machine
# has neither) and one data disk carrying the EUI-64 of the host's real NVMe disk, so the
# slot's disk is that real disk, wiped over SSH.
REMOTE_TREE = "/var/lib/gpuaas-lab/topology-tree"


def copy_tree(host: hostlab.LabHost, tree: Path) -> None:
    archive = subprocess.run(
        ["tar", "-C", str(tree), "-cf", "-", "."], capture_output=True, check=True
    ).stdout
    subprocess.run(
        host.ssh_argv(
            "sudo",
            "-n",
            "sh",
            "-c",
            f"rm -rf {REMOTE_TREE} && mkdir -p {REMOTE_TREE} && tar -C {REMOTE_TREE} -xf -",
        ),
        input=archive,
        capture_output=True,
        check=True,
        timeout=120,
    )


def test_reconcile_wipes_a_released_slot_disk_of_the_lab_host_and_the_store_keeps_the_proof(
    fresh: hostlab.LabHost,
    tmp_path: Path,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    prefect_harness,
    engine,
) -> None:
    disk = fresh.nvme[0]
    copy_tree(
        fresh, hosttrees.write_tree(lab_host_spec(fresh.name, [disk["eui64"]]), tmp_path / "tree")
    )
    # Approval needs the slice network a bootstrapped host has (bridge, NAT, forwarding);
    # the fresh host was never bootstrapped.
    # The evidence signing key the host bootstrap creates (docs/trust.md).
    baseline = run_tasks(
        fresh,
        [
            {
                "name": "Bring up the slice network baseline",
                "ansible.builtin.include_role": {"name": "gpuaas.fleet.slice_network_baseline"},
            },
            {"name": "Ensure the evidence signing key", "gpuaas.fleet.node_signing_key": {}},
        ],
        tmp_path,
    )
    assert baseline.rc == 0, baseline.failures()
    signing_key = baseline.task("Ensure the evidence signing key", fresh.name)["public_key"]
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    # The controller's SSH key, as an operator configures Ansible on it (the store keeps
    # no key paths).
    monkeypatch.setenv("ANSIBLE_PRIVATE_KEY_FILE", fresh.ssh_private_key)
    cp = ControlPlane.from_environment()
    cp.define_sku(LAB_SKU)
    connection = fresh.host_vars()
    connection.pop("ansible_ssh_private_key_file")
    cp.register_node(
        NodeSpec(
            fresh.name,
            "lab",
            node_family=LAB_SKU.node_family,
            maas_tags=("gpuaas-profile-slice-vm",),
            gpu_count=1,
            slice_subnet="10.100.0.0/24",
            management_address=connection.pop("ansible_host"),
            host_vars={**connection, "gpuaas_topology_root": REMOTE_TREE},
        )
    )
    pin_lab_key(cp, fresh)
    # Another node's signing key pinned: what the host signs is not believed.
    cp.pin_signing_key(fresh.name, public_line(node_key("intruder")), "test", "wrong key")
    discover_topology(hostnames=[fresh.name])
    assert approve_slots(fresh.name)["approved"] == [0]
    [slot] = cp.list_slots(fresh.name)
    assert slot.nvme_device == f"/dev/disk/by-id/nvme-eui.{disk['eui64']}"

    placed = cp.place(PlacementRequest(LAB_SKU.slug, 1))
    assert placed.placed, placed
    allocation = uuid.UUID(str(placed.allocation_id))
    cp.transition(allocation, AllocationState.PROVISIONING, "test")
    cp.transition(allocation, AllocationState.ACTIVE, "test")
    sh(fresh, f"echo tenant-data | dd of={slot.nvme_device} conv=fsync status=none")
    cp.release(allocation, "test")
    assert cp.list_slots(fresh.name)[0].status == "cleanup"

    untrusted = reconcile(grace_seconds=0, compare_with_hosts=False)
    [row] = [r for r in untrusted["slots"] if r["node"] == fresh.name]
    assert row["now"] == "cleanup_blocked", row
    [slot] = cp.list_slots(fresh.name)
    assert "does not verify with" in slot.health_detail, slot.health_detail

    # The key the host really holds, pinned as its bootstrap reports it (after the operator
    # forgets the wrong one); the slot goes back to cleanup.
    cp.forget_signing_key(fresh.name, "test", "pinned the wrong key")
    cp.pin_reported_signing_key(fresh.name, signing_key, "test")
    cp.repair_slot(fresh.name, slot.slot_index, "wipe again under the right key", "test")

    # The host's own signed proof of that wipe, now under the right key, is not believed
    # again: recorded once, its nonce is spent; presented as another disk's, its signature
    # fails; pointed at another device of the host, it is refused outright.
    [untrusted_proof] = wipe_proofs(engine, fresh.name)
    replayed = cp.record_wipe_proof(fresh.name, slot.slot_index, untrusted_proof, "test")
    assert (replayed.status, replayed.verified) == ("cleanup_blocked", False), replayed
    assert "already used by evidence" in replayed.distrust, replayed.distrust
    cp.repair_slot(fresh.name, slot.slot_index, "try the proof as another disk's", "test")
    other = fresh.nvme[1]
    statement = {**untrusted_proof["attestation"]["statement"], "disk": {"serial": other["serial"]}}
    as_other = {
        **untrusted_proof,
        "attestation": {**untrusted_proof["attestation"], "statement": statement},
    }
    retargeted = cp.record_wipe_proof(fresh.name, slot.slot_index, as_other, "test")
    assert (retargeted.status, retargeted.verified) == ("cleanup_blocked", False), retargeted
    assert "does not verify with" in retargeted.distrust, retargeted.distrust
    elsewhere = {**untrusted_proof, "device": other["by_id"]}
    with pytest.raises(InvalidInput) as refused:
        cp.record_wipe_proof(fresh.name, slot.slot_index, elsewhere, "test")
    assert refused.value.code == "proof_device_mismatch"
    assert cp.list_slots(fresh.name)[0].status == "cleanup_blocked"

    # The honest path: the next wipe, signed for its own nonce, returns the slot.
    cp.repair_slot(fresh.name, slot.slot_index, "wipe again, honestly", "test")
    result = reconcile(grace_seconds=0, compare_with_hosts=False)

    [row] = [r for r in result["slots"] if r["node"] == fresh.name]
    assert row["now"] == "available", row
    [slot] = cp.list_slots(fresh.name)
    assert slot.status == "available" and slot.health_state == "healthy", slot
    [proof] = wipe_proofs(engine, fresh.name, passed=True)
    assert len(wipe_proofs(engine, fresh.name, passed=False)) == 3
    assert proof["verified"] is True and proof["device"] == slot.nvme_device
    statement = proof["attestation"]["statement"]
    assert statement["node"] == fresh.name and statement["disk"].get("serial"), statement
    assert proof["method"] == "nvme_format" and proof["approval"].startswith("reconcile")
    assert sh(fresh, f"head -c 11 {slot.nvme_device} | od -An -c").split() == ["\\0"] * 11

    # That proof, replayed after the next tenant's release, is refused and the slot stays
    # in cleanup, waiting for a wipe of its own.
    placed = cp.place(PlacementRequest(LAB_SKU.slug, 1))
    assert placed.placed, placed
    allocation = uuid.UUID(str(placed.allocation_id))
    cp.transition(allocation, AllocationState.PROVISIONING, "test")
    cp.transition(allocation, AllocationState.ACTIVE, "test")
    cp.release(allocation, "test")
    with pytest.raises(InvalidInput) as replay:
        cp.record_wipe_proof(fresh.name, slot.slot_index, proof, "test")
    assert replay.value.code == "proof_predates_release"
    assert cp.list_slots(fresh.name)[0].status == "cleanup"


def wipe_proofs(engine, hostname: str, passed: bool | None = None) -> list[dict]:
    """The node's wipe proofs on record as the host sent them (the store's verdict, its
    ``trust`` field, taken off), oldest first; those that passed, or did not."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT e.passed, e.payload FROM evidence e JOIN nodes n ON n.id = e.node_id"
                " WHERE e.kind = 'wipe_proof' AND n.hostname = :hostname ORDER BY e.id"
            ),
            {"hostname": hostname},
        ).all()
    return [
        {key: value for key, value in payload.items() if key != "trust"}
        for ok, payload in rows
        if passed is None or ok is passed
    ]
