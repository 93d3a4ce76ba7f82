"""Every preflight refusal, for real, on a live lab (bridge, loop disks, libvirt, mounts).

Each case changes one thing of an accepted baseline, so each refusal is caused by it and
only its check fails. The cases run through the preflight module_utils in one Python
process on the lab host; the module itself runs through ansible-playbook for the accepted
case and one refusal. Mounts are made inside the lab's mount namespace, which is the
slice host the modules see.
A second baseline turns PCI passthrough on with PCI functions this machine really has, so
a GPU or fabric VF held by another (defined, never started) domain is refused, next to
repeated GPUs or disks in one request, a libvirt socket nobody answers on, and a disk in
use as swap. A device-mapper holder is refused where the kernel has device-mapper.
Then the whole provision role is refused on the seed's j22u05 disk (parent not mounted, a
child partition mounted) and the test proves nothing was written anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import uuid
from pathlib import Path

import pytest

from gpuaas_lab.loopdev import LoopDisk
from gpuaas_lab.vmlab import REPO_ROOT

pytestmark = [pytest.mark.root, pytest.mark.slow]

OTHER_DOMAIN = "other-tenant-{}"


def lab_mount(lab, device: str, mountpoint: Path) -> None:
    mountpoint.mkdir(parents=True, exist_ok=True)
    lab.run(["mount", "-o", "noatime", device, str(mountpoint)])
    lab.run(["sh", "-c", f"echo tenant-data > {mountpoint}/data && sync"])


def define_domain(lab, name: str, devices: str, tmp_path: Path) -> None:
    """Define (never start) a minimal domain holding `devices` in the lab's libvirtd."""
    xml = tmp_path / f"{name}.xml"
    xml.write_text(
        f"<domain type='qemu'><name>{name}</name><memory unit='MiB'>64</memory>"
        f"<os><type arch='x86_64'>hvm</type></os><devices>{devices}</devices></domain>"
    )
    lab.virsh("define", str(xml))


def preflight_request(lab, guest_image, slots: list[dict], mac: str, passthrough: bool) -> dict:
    """A request every check accepts; each case changes only what it breaks."""
    return {
        "allocation_id": str(uuid.uuid4()),
        "slots": slots,
        "mac_address": mac,
        "bridge": lab.bridge,
        "bridge_type": "linux",
        "profile": {"vcpus": 1, "memory_mib": 512},
        "image": {"path": guest_image.path, "sha256": guest_image.sha256},
        "emulation": True,
        "pci_passthrough": passthrough,
        "stable_dirs": [lab.stable_dir],
    }


def define_other_domain(lab, name: str, disk: LoopDisk, tmp_path: Path) -> None:
    define_domain(
        lab,
        name,
        f"<disk type='block' device='disk'><source dev='{disk.stable_path}'/>"
        "<target dev='vda' bus='virtio'/></disk>",
        tmp_path,
    )


def test_every_preflight_refusal(linux_lab, guest_image, tmp_path: Path):
    lab = linux_lab
    loops = lab.loops
    raw = lab.disk()
    raw2 = lab.disk()
    mounted = lab.disk()
    loops.mkfs(mounted.device)
    child = loops.disk(partitions=["share"])
    loops.mkfs(child.partitions[0])
    not_raw = loops.disk(partitions=["old-tenant"])
    busy = lab.disk()
    loops.hold_open(busy.device)
    in_domain = lab.disk()
    regular = Path(lab.stable_dir) / f"nvme-eui.file{uuid.uuid4().hex[:8]}"
    (tmp_path / "plain-file").write_bytes(b"\0" * 4096)
    regular.symlink_to(tmp_path / "plain-file")
    lab.ns.add_dummy("notabridge0")
    other = OTHER_DOMAIN.format(uuid.uuid4().hex[:6])
    define_other_domain(lab, other, in_domain, tmp_path)
    mounts = [tmp_path / "mnt-whole", tmp_path / "mnt-share"]
    lab_mount(lab, mounted.device, mounts[0])
    lab_mount(lab, child.partitions[0], mounts[1])
    try:
        base = preflight_request(
            lab, guest_image, [slot(raw.stable_path)], "52:54:00:5a:00:20", passthrough=False
        )
        cases = {
            "accepted": ({}, None),
            "bridge_missing": ({"bridge": "nosuchbr0"}, ("bridge", "bridge_missing")),
            "not_a_bridge": ({"bridge": "notabridge0"}, ("bridge", "not_a_bridge")),
            "ovs_not_running": (
                {"bridge_type": "openvswitch"},
                ("bridge", "ovs_unavailable"),
            ),
            "kvm_missing": (
                {"emulation": False, "kvm_device": str(tmp_path / "kvm")},
                ("kvm", "kvm_missing"),
            ),
            "hugepages": (
                {"profile": {"vcpus": 1, "memory_mib": 1024, "hugepages": True}},
                ("hugepages", "hugepages_insufficient"),
            ),
            "numa_node_missing": (
                {"slots": [slot(raw.stable_path, numa_node=63)]},
                ("numa", "numa_node_missing"),
            ),
            "duplicate_fabric_vf": (
                {
                    "slots": [
                        slot(raw.stable_path),
                        slot(raw2.stable_path, gpu_pci_address="0000:3d:00.0"),
                    ]
                },
                ("allocation", "duplicate_device"),
            ),
            "pci_device_missing": ({"pci_passthrough": True}, ("pci", "pci_device_missing")),
            "not_stable_identity": (
                {"slots": [slot(raw.device)]},
                ("disk", "not_stable_identity"),
            ),
            "not_block_device": ({"slots": [slot(str(regular))]}, ("disk", "not_block_device")),
            "mounted": ({"slots": [slot(mounted.stable_path)]}, ("disk", "mounted")),
            "child_mounted": ({"slots": [slot(child.stable_path)]}, ("disk", "child_mounted")),
            "device_busy": ({"slots": [slot(busy.stable_path)]}, ("disk", "device_busy")),
            "disk_in_use_by_domain": (
                {"slots": [slot(in_domain.stable_path)]},
                ("disk", "disk_in_use_by_domain"),
            ),
            "disk_not_raw": ({"slots": [slot(not_raw.stable_path)]}, ("disk", "disk_not_raw")),
            "image_digest_mismatch": (
                {"image": {"path": guest_image.path, "sha256": "0" * 64}},
                ("image", "image_digest_mismatch"),
            ),
            "image_missing": (
                {"image": {"path": str(tmp_path / "gone.raw"), "sha256": guest_image.sha256}},
                ("image", "image_missing"),
            ),
        }
        outcomes = preflight_in_lab(
            lab, {name: {**base, **change} for name, (change, _) in cases.items()}, tmp_path
        )
        for name, (_change, expected) in cases.items():
            outcome = outcomes[name]
            failed = [c for c in outcome["checks"] if not c["ok"]]
            if expected is None:
                assert outcome["ok"] and not failed, failed
                continue
            check, code = expected
            assert outcome["failure"]["code"] == code, (name, outcome["failure"])
            assert outcome["failure"]["phase"] == "preflight"
            assert [c["check"] for c in failed] == [check], (name, failed)
        # The module itself, through ansible-playbook: accepted, and refused with evidence.
        playbook = tmp_path / "preflight_module.yml"
        tasks = [
            {
                "name": f"case {name}",
                "gpuaas.fleet.slice_vm_preflight": {**base, **cases[name][0]},
                "ignore_errors": True,
            }
            for name in ("accepted", "child_mounted")
        ]
        playbook.write_text(
            json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}])
        )
        run = lab.playbook(str(playbook), {})
        assert run.changed == 0
        accepted = run.task_result("case accepted")
        assert not accepted.get("failed") and accepted["ok"] and accepted["failure"] is None
        refused = run.task_result("case child_mounted")
        assert refused["failed"] and refused["failure"]["code"] == "child_mounted"
        assert refused["domain_name"] == "gpuaas-slice-" + uuid.UUID(base["allocation_id"]).hex
        # Refusals are read-only: no domain of ours, no reservation, data still there.
        assert lab.virsh("list", "--all", "--name").stdout.split() == [other]
        for mountpoint in mounts:
            assert lab.run(["cat", str(mountpoint / "data")]).stdout == "tenant-data\n"
    finally:
        for mountpoint in mounts:
            lab.run(["umount", str(mountpoint)], check=False)
        lab.virsh("undefine", other, check=False)
        lab.ns.delete_link("notabridge0")
        os.unlink(regular)


def present_pci_addresses(count: int) -> list[str]:
    """`count` PCI functions this machine really has (they stand in for GPUs and VFs)."""
    addresses = sorted(os.listdir("/sys/bus/pci/devices"))
    if len(addresses) < count:
        pytest.skip(f"needs {count} PCI functions in /sys/bus/pci/devices, found {addresses}")
    return addresses[:count]


def define_hostdev_domain(lab, name: str, addresses: list[str], tmp_path: Path) -> None:
    """Another tenant's domain holding `addresses` as PCI hostdevs, defined and never
    started; managed='no' so that even a start could not take them from the host."""
    hostdevs = "".join(
        "<hostdev mode='subsystem' type='pci' managed='no'><source>"
        f"<address domain='0x{a[0:4]}' bus='0x{a[5:7]}' slot='0x{a[8:10]}' function='0x{a[11]}'/>"
        "</source></hostdev>"
        for a in addresses
    )
    define_domain(lab, name, hostdevs, tmp_path)


def stale_libvirt_socket(path: Path) -> str:
    """A libvirt socket nobody listens on, as a stopped or crashed daemon leaves it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(path))
    return f"qemu:///system?socket={path}"


def test_refusals_of_held_or_repeated_devices_and_a_stopped_daemon(
    linux_lab, guest_image, tmp_path: Path
):
    """The checks the first test cannot reach: PCI passthrough is on (with PCI functions
    this machine has) so the "in use by another domain" check runs, plus repeated GPUs or
    disks within one request, the libvirt daemon gone, a disk used as swap or held by a
    device-mapper device."""
    lab = linux_lab
    gpu, vf, gpu2, vf2, held_gpu, held_vf = present_pci_addresses(6)
    raw = lab.disk()
    raw2 = lab.disk()
    swap = lab.disk()
    other = OTHER_DOMAIN.format(uuid.uuid4().hex[:6])
    define_hostdev_domain(lab, other, [held_gpu, held_vf], tmp_path)
    stopped_daemon = stale_libvirt_socket(tmp_path / "libvirt-sock")
    lab.loops.swapon(swap.device)
    try:

        def pci_slot(nvme_device: str, **overrides) -> dict:
            return slot(
                nvme_device, **{"gpu_pci_address": gpu, "fabric_vf_pci_address": vf, **overrides}
            )

        base = preflight_request(
            lab, guest_image, [pci_slot(raw.stable_path)], "52:54:00:5a:00:21", passthrough=True
        )
        cases = {
            "accepted": ({}, None),
            "gpu_in_use_by_domain": (
                {"slots": [pci_slot(raw.stable_path, gpu_pci_address=held_gpu)]},
                ("pci", "pci_in_use_by_domain"),
            ),
            "vf_in_use_by_domain": (
                {"slots": [pci_slot(raw.stable_path, fabric_vf_pci_address=held_vf)]},
                ("pci", "pci_in_use_by_domain"),
            ),
            "duplicate_gpu": (
                {"slots": [pci_slot(raw.stable_path), slot(raw2.stable_path, gpu, vf2)]},
                ("allocation", "duplicate_device"),
            ),
            "duplicate_disk": (
                {"slots": [pci_slot(raw.stable_path), slot(raw.stable_path, gpu2, vf2)]},
                ("allocation", "duplicate_device"),
            ),
            "libvirt_unavailable": (
                {"libvirt_uri": stopped_daemon},
                ("libvirt", "libvirt_unavailable"),
            ),
            "swap": ({"slots": [pci_slot(swap.stable_path)]}, ("disk", "swap")),
        }
        outcomes = preflight_in_lab(
            lab, {name: {**base, **change} for name, (change, _) in cases.items()}, tmp_path
        )
        for name, (_change, expected) in cases.items():
            outcome = outcomes[name]
            failed = [c for c in outcome["checks"] if not c["ok"]]
            if expected is None:
                assert outcome["ok"] and not failed, failed
                continue
            check, code = expected
            assert outcome["failure"]["code"] == code, (name, outcome["failure"])
            assert [c["check"] for c in failed] == [check], (name, failed)
        messages = {
            name: outcomes[name]["failure"]["message"] for name in cases if name != "accepted"
        }
        assert messages["gpu_in_use_by_domain"] == f"{held_gpu} is passed through to domain {other}"
        assert messages["vf_in_use_by_domain"] == f"{held_vf} is passed through to domain {other}"
        assert messages["duplicate_gpu"] == f"GPU {gpu} is listed for more than one slot"
        assert (
            messages["duplicate_disk"] == f"disk {raw.stable_path} is listed for more than one slot"
        )
        assert stopped_daemon in messages["libvirt_unavailable"]
        # the daemon is needed for the PCI and disk checks: they are not run without it
        assert {c["check"] for c in outcomes["libvirt_unavailable"]["checks"]} == {
            "allocation",
            "kvm",
            "bridge",
            "numa",
            "hugepages",
            "libvirt",
            "image",
        }
        assert swap.device in messages["swap"], messages["swap"]

        playbook = tmp_path / "preflight_pci.yml"
        task = {
            "name": "case gpu_in_use_by_domain",
            "gpuaas.fleet.slice_vm_preflight": {**base, **cases["gpu_in_use_by_domain"][0]},
            "ignore_errors": True,
        }
        playbook.write_text(
            json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}])
        )
        refused = lab.playbook(str(playbook), {}).task_result("case gpu_in_use_by_domain")
        assert refused["failed"] and refused["failure"]["code"] == "pci_in_use_by_domain"
        assert refused["failure"]["check"] == "pci" and refused["failed_checks"] == ["pci"]
        assert refused["msg"] == f"preflight pci: {messages['gpu_in_use_by_domain']}"
        assert lab.virsh("list", "--all", "--name").stdout.split() == [other]
    finally:
        lab.run(["swapoff", swap.device], check=False)
        lab.virsh("undefine", other, check=False)


def device_mapper_unavailable_reason() -> str | None:
    with open("/proc/misc", encoding="ascii") as misc:
        if "device-mapper" not in misc.read().split():
            return "no device-mapper in this kernel (/proc/misc has no device-mapper)"
    if shutil.which("dmsetup") is None:
        return "dmsetup is not installed"
    return None


def test_disk_held_by_a_device_mapper_device_is_refused(linux_lab, guest_image, tmp_path):
    """A dm device stacked on the slot disk (an LVM volume on a host) is a holder."""
    reason = device_mapper_unavailable_reason()
    if reason:
        pytest.skip(reason)
    lab = linux_lab
    stacked = lab.disk()
    dm_name = f"gpuaas-test-{uuid.uuid4().hex[:8]}"
    lab.run(
        [
            "dmsetup",
            "create",
            dm_name,
            "--noudevsync",
            "--table",
            f"0 {stacked.size_bytes // 512} linear {stacked.device} 0",
        ]
    )
    try:
        params = preflight_request(
            lab, guest_image, [slot(stacked.stable_path)], "52:54:00:5a:00:22", passthrough=False
        )
        outcome = preflight_in_lab(lab, {"dm_holder": params}, tmp_path)["dm_holder"]
        assert outcome["failure"]["code"] == "dm_holder", outcome["failure"]
        assert [c["check"] for c in outcome["checks"] if not c["ok"]] == ["disk"]
        assert f"/dev/{stacked.kernel_name} is held by a dm device" in outcome["failure"]["message"]
    finally:
        lab.run(["dmsetup", "remove", "--noudevsync", dm_name], check=False)


def preflight_in_lab(lab, cases: dict, tmp_path: Path) -> dict:
    """Run the preflight module_utils for each case in one Python process on the lab host
    (its network and mount namespaces), as the module would: one interpreter start instead
    of one ansible task per case."""
    defaults = {"kvm_device": "/dev/kvm", "libvirt_uri": "qemu:///system"}
    path = tmp_path / "preflight_cases.json"
    path.write_text(json.dumps({name: {**defaults, **params} for name, params in cases.items()}))
    script = (
        "import json, sys\n"
        "from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_preflight\n"
        "cases = json.load(open(sys.argv[1]))\n"
        "print(json.dumps({n: vm_preflight.run_preflight(p) for n, p in cases.items()}))\n"
    )
    proc = lab.run(
        ["env", f"PYTHONPATH={REPO_ROOT / '.collections'}", sys.executable, "-c", script, str(path)]
    )
    return json.loads(proc.stdout)


def slot(
    nvme_device: str,
    gpu_pci_address: str = "0000:1b:00.0",
    fabric_vf_pci_address: str = "0000:1a:00.1",
    **overrides,
) -> dict:
    return {
        "gpu_pci_address": gpu_pci_address,
        "fabric_vf_pci_address": fabric_vf_pci_address,
        "nvme_device": nvme_device,
        "numa_node": 0,
        **overrides,
    }


def test_provision_refused_on_a_mounted_child_partition_writes_nothing(
    linux_allocation, tmp_path: Path
):
    """The parent disk is not mounted, its partition is (as on lab host j22u05)."""
    allocation = linux_allocation
    lab = allocation.lab
    disk = lab.loops.disk(partitions=["share2"])
    lab.loops.mkfs(disk.partitions[0])
    mountpoint = tmp_path / "share2"
    lab_mount(lab, disk.partitions[0], mountpoint)
    try:
        before = lab.loops.fingerprint(disk)
        allocation.disk = disk
        run = lab.playbook("vm_provision.yml", allocation.provision_vars())
        assert run.rc != 0
        evidence = run.custom_stats["gpuaas_slice_provision"]
        assert evidence["status"] == "failed"
        assert evidence["failure"]["phase"] == "preflight"
        assert evidence["failure"]["code"] == "child_mounted"
        assert evidence["cleanup_blocked"] is False
        disk_check = next(c for c in evidence["preflight_checks"] if c["check"] == "disk")
        assert "share2" in disk_check["detail"] or disk.partitions[0] in disk_check["detail"]
        assert lab.loops.fingerprint(disk) == before
        assert lab.run(["cat", str(mountpoint / "data")]).stdout == "tenant-data\n"
        assert not allocation.state_dir.exists()
        assert not allocation.relay_key.exists()
        assert allocation.mac_address not in lab.dnsmasq_hostsfile.read_text()
        assert allocation.domain not in lab.virsh("list", "--all", "--name").stdout
    finally:
        lab.run(["umount", str(mountpoint)], check=False)


def test_a_clone_refused_after_every_check_passed_fails_in_the_image_phase(linux_allocation):
    """The preflight and the clone are one module task: a disk too small for the image passes
    every check, then the clone refuses it. The failure names the image phase (the clone may
    write, so cleanup is owed) with the checks and both phases' timings, and nothing past the
    clone ran."""
    allocation = linux_allocation
    lab = allocation.lab
    image_mib = allocation.image.size_bytes // (1 << 20)
    allocation.disk = lab.disk(size_mib=max(1, image_mib // 2))
    before = lab.loops.fingerprint(allocation.disk)
    run = lab.playbook("vm_provision.yml", allocation.provision_vars())
    assert run.rc != 0
    evidence = run.custom_stats["gpuaas_slice_provision"]
    assert evidence["status"] == "failed"
    assert (evidence["failure"]["phase"], evidence["failure"]["code"]) == (
        "image",
        "image_larger_than_disk",
    )
    assert (evidence["cleanup_blocked"], evidence["progress"]) == (True, "disk_written")
    assert evidence["preflight_checks"] and all(c["ok"] for c in evidence["preflight_checks"])
    assert set(evidence["timings"]) == {"preflight", "image", "total"}
    assert lab.loops.fingerprint(allocation.disk) == before
    assert allocation.mac_address not in lab.dnsmasq_hostsfile.read_text()
    assert allocation.domain not in lab.virsh("list", "--all", "--name").stdout


def test_check_mode_provision_reports_and_writes_nothing(linux_allocation):
    allocation = linux_allocation
    lab = allocation.lab
    hosts_before = lab.dnsmasq_hostsfile.read_text()
    fingerprint = lab.loops.fingerprint(allocation.disk)
    run = lab.playbook("vm_provision.yml", allocation.provision_vars(), check_mode=True)
    assert run.rc == 0, run.failures()
    evidence = run.custom_stats["gpuaas_slice_provision"]
    assert evidence["status"] == "checked"
    assert evidence["changed_phases"] == ["image", "seed", "dhcp", "domain"]
    domain_task = run.task_result("define and start the domain")
    assert domain_task["actions"] == ["define", "start"]
    assert domain_task["seed"]["changed"] and domain_task["reservation"]["changed"]
    # One diff per part, in the order they ran: the seed's, the reservation's, the domain's.
    seed_diff, reservation_diff, domain_diff = domain_task["diff"]
    assert seed_diff["after_header"] == str(allocation.state_dir / "seed.iso")
    assert reservation_diff["after_header"] == str(lab.dnsmasq_hostsfile)
    assert reservation_diff["after"].endswith(
        f"{allocation.mac_address},{allocation.private_ip},{allocation.domain}\n"
    )
    assert domain_diff["after"]["state"] == "running"
    assert lab.dnsmasq_hostsfile.read_text() == hosts_before
    assert lab.loops.fingerprint(allocation.disk) == fingerprint
    assert not allocation.state_dir.exists() and not allocation.relay_key.exists()
    assert allocation.domain not in lab.virsh("list", "--all", "--name").stdout
