"""Slice domain XML: the production shape, validated against libvirt's own schema.

VFIO passthrough cannot run on this machine (no IOMMU groups, no GPUs), so the XML with
GPU and fabric VF hostdevs is proven here by `virt-xml-validate` (libvirt's RelaxNG
schema) and by property checks; the real-VM tests boot the same XML without hostdevs.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_domain
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError
from lxml import etree

ALLOCATION = "158ea147-0115-407f-bbd5-1850c32b9517"
SLOTS = [
    {
        "gpu_pci_address": "0000:1b:00.0",
        "fabric_vf_pci_address": "0000:1a:00.1",
        "nvme_device": "/dev/disk/by-id/nvme-eui.000000000000000100a075244a103331",
        "numa_node": 0,
    },
    {
        "gpu_pci_address": "0000:3D:00.0",
        "fabric_vf_pci_address": "0000:1a:00.2",
        "nvme_device": "/dev/disk/by-id/nvme-eui.000000000000000100a075244a10dcab",
        "numa_node": 0,
    },
]


def spec(**overrides) -> vm_domain.DomainSpec:
    values = dict(
        allocation_id=ALLOCATION,
        slots=vm_domain.parse_slots(SLOTS),
        profile=vm_domain.RuntimeProfile(vcpus=48, memory_mib=131072, hugepages=True),
        mac_address="52:54:00:3F:A2:10",
        bridge="ovsbr0",
        bridge_type="openvswitch",
        seed_iso="/var/lib/gpuaas/slices/x/seed.iso",
        console_log="/var/lib/gpuaas/slices/x/console.log",
        host_cpuset="0-23,48-71",
    )
    values.update(overrides)
    return vm_domain.DomainSpec(**values)


def validate(xml: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "domain.xml"
    path.write_text(xml)
    return subprocess.run(
        ["virt-xml-validate", str(path), "domain"], capture_output=True, text=True, check=False
    )


needs_validator = pytest.mark.skipif(
    shutil.which("virt-xml-validate") is None, reason="virt-xml-validate (libvirt-clients) missing"
)


@needs_validator
def test_production_xml_with_gpu_and_vf_hostdevs_is_valid_libvirt_xml(tmp_path: Path):
    xml = vm_domain.build_domain_xml(spec())
    proc = validate(xml, tmp_path)
    assert proc.returncode == 0, proc.stderr + xml


@needs_validator
def test_schema_validation_catches_a_broken_domain(tmp_path: Path):
    """The validator is not a rubber stamp: a hostdev without a source is rejected."""
    root = etree.fromstring(vm_domain.build_domain_xml(spec()).encode())
    hostdev = root.find("devices/hostdev")
    hostdev.remove(hostdev.find("source"))
    proc = validate(etree.tostring(root, encoding="unicode"), tmp_path)
    assert proc.returncode != 0


def test_hostdev_for_every_gpu_and_fabric_vf():
    root = etree.fromstring(vm_domain.build_domain_xml(spec()).encode())
    hostdevs = root.findall("devices/hostdev")
    assert len(hostdevs) == 4
    for hostdev in hostdevs:
        assert hostdev.get("mode") == "subsystem"
        assert hostdev.get("type") == "pci"
        assert hostdev.get("managed") == "yes"
        assert hostdev.find("driver").get("name") == "vfio"
    fingerprint = vm_domain.domain_fingerprint(etree.tostring(root, encoding="unicode"))
    assert fingerprint["hostdevs"] == [
        "0000:1b:00.0",
        "0000:1a:00.1",
        "0000:3d:00.0",
        "0000:1a:00.2",
    ]


def test_uefi_secure_boot_off_no_tpm_no_graphics_console_to_log_only():
    xml = vm_domain.build_domain_xml(spec())
    root = etree.fromstring(xml.encode())
    assert root.find("os").get("firmware") == "efi"
    features = {f.get("name"): f.get("enabled") for f in root.findall("os/firmware/feature")}
    assert features == {"secure-boot": "no", "enrolled-keys": "no"}
    for absent in ("tpm", "graphics", "video", "channel"):
        assert root.find(f"devices/{absent}") is None, absent
    assert root.find("devices/controller[@type='usb']").get("model") == "none"
    serial = root.find("devices/serial")
    assert serial.get("type") == "file"
    assert serial.find("source").get("path") == "/var/lib/gpuaas/slices/x/console.log"
    assert root.find("devices/memballoon").get("model") == "none"
    fingerprint = vm_domain.domain_fingerprint(xml)
    assert fingerprint["uefi"] and not fingerprint["secure_boot"]
    assert fingerprint["tpm"] == 0 and fingerprint["graphics"] == 0


def test_raw_disks_seed_cdrom_and_ovs_vnic_with_reserved_mac():
    fingerprint = vm_domain.domain_fingerprint(vm_domain.build_domain_xml(spec()))
    assert fingerprint["disks"] == [
        {"device": "disk", "source": SLOTS[0]["nvme_device"], "target": "vda", "bus": "virtio"},
        {"device": "disk", "source": SLOTS[1]["nvme_device"], "target": "vdb", "bus": "virtio"},
        {
            "device": "cdrom",
            "source": "/var/lib/gpuaas/slices/x/seed.iso",
            "target": "sda",
            "bus": "sata",
        },
    ]
    assert fingerprint["interfaces"] == [
        {
            "type": "bridge",
            "mac": "52:54:00:3f:a2:10",
            "bridge": "ovsbr0",
            "virtualport": "openvswitch",
            "bandwidth": {},
        }
    ]
    root = etree.fromstring(vm_domain.build_domain_xml(spec()).encode())
    assert root.find("devices/disk/source").get("dev") == SLOTS[0]["nvme_device"]
    assert root.find("devices/disk/boot").get("order") == "1"
    assert root.find("devices/disk/driver").get("type") == "raw"


def test_linux_bridge_vnic_has_no_virtualport():
    fingerprint = vm_domain.domain_fingerprint(
        vm_domain.build_domain_xml(spec(bridge="slicebr0", bridge_type="linux"))
    )
    assert fingerprint["interfaces"][0]["virtualport"] == ""
    assert fingerprint["interfaces"][0]["bridge"] == "slicebr0"


def test_profile_numa_placement_and_hugepages():
    root = etree.fromstring(vm_domain.build_domain_xml(spec()).encode())
    assert root.find("vcpu").text == "48"
    assert root.find("vcpu").get("cpuset") == "0-23,48-71"
    assert root.find("cputune/emulatorpin").get("cpuset") == "0-23,48-71"
    assert root.find("numatune/memory").attrib == {"mode": "strict", "nodeset": "0"}
    assert root.find("memoryBacking/hugepages/page").attrib == {"size": "1048576", "unit": "KiB"}
    fingerprint = vm_domain.domain_fingerprint(etree.tostring(root, encoding="unicode"))
    assert fingerprint["memory_kib"] == 131072 * 1024
    assert fingerprint["hugepage_kib"] == 1048576


def test_without_hugepages_or_numa_there_is_no_backing_or_pinning():
    plain = spec(
        profile=vm_domain.RuntimeProfile(vcpus=2, memory_mib=2048),
        slots=vm_domain.parse_slots([{**SLOTS[0], "numa_node": None}]),
        host_cpuset="",
    )
    root = etree.fromstring(vm_domain.build_domain_xml(plain).encode())
    for absent in ("memoryBacking", "numatune", "cputune"):
        assert root.find(absent) is None
    assert "cpuset" not in root.find("vcpu").attrib


def test_kvm_by_default_emulation_selects_qemu():
    kvm = etree.fromstring(vm_domain.build_domain_xml(spec()).encode())
    assert kvm.get("type") == "kvm"
    assert kvm.find("cpu").get("mode") == "host-passthrough"
    tcg = etree.fromstring(vm_domain.build_domain_xml(spec(emulation=True)).encode())
    assert tcg.get("type") == "qemu"
    assert tcg.find("cpu") is None


def test_test_hosts_can_drop_passthrough():
    fingerprint = vm_domain.domain_fingerprint(
        vm_domain.build_domain_xml(spec(pci_passthrough=False))
    )
    assert fingerprint["hostdevs"] == []


def test_deterministic_name_and_uuid_from_the_allocation():
    built = spec()
    assert built.name == "gpuaas-slice-158ea1470115407fbbd51850c32b9517"
    assert built.uuid == ALLOCATION
    assert vm_domain.build_domain_xml(built) == vm_domain.build_domain_xml(spec())
    root = etree.fromstring(vm_domain.build_domain_xml(built).encode())
    allocation = root.find(
        f"metadata/{{{vm_domain.METADATA_NS}}}slice/{{{vm_domain.METADATA_NS}}}allocation"
    )
    assert allocation.get("id") == ALLOCATION


def test_fingerprint_reads_libvirt_normalized_xml_like_ours():
    """libvirt rewrites units, adds loader/nvram and addresses: the fingerprint ignores that."""
    ours = vm_domain.build_domain_xml(spec())
    root = etree.fromstring(ours.encode())
    memory = root.find("memory")
    memory.set("unit", "KiB")
    memory.text = str(131072 * 1024)
    os_el = root.find("os")
    del os_el.attrib["firmware"]
    loader = etree.SubElement(os_el, "loader", readonly="yes", type="pflash", secure="no")
    loader.text = "/usr/share/OVMF/OVMF_CODE_4M.fd"
    nic = root.find("devices/interface")
    etree.SubElement(
        nic, "address", type="pci", domain="0x0000", bus="0x01", slot="0x00", function="0x0"
    )
    root.find("vcpu").set("cpuset", "0-23,48-71")
    assert vm_domain.domain_fingerprint(etree.tostring(root, encoding="unicode")) == (
        vm_domain.domain_fingerprint(ours)
    )


@pytest.mark.parametrize(
    ("slot", "code"),
    [
        ({**SLOTS[0], "gpu_pci_address": "1b:00.0"}, "invalid_pci_address"),
        ({**SLOTS[0], "fabric_vf_pci_address": ""}, "incomplete_slot"),
        ({**SLOTS[0], "nvme_device": None}, "incomplete_slot"),
    ],
)
def test_bad_slots_are_refused_with_a_code(slot, code):
    with pytest.raises(VmError) as caught:
        vm_domain.parse_slots([slot])
    assert caught.value.code == code


def test_bad_allocation_mac_and_profile_are_refused():
    with pytest.raises(VmError, match="not a UUID"):
        vm_common.domain_name("slice-1")
    with pytest.raises(VmError) as caught:
        vm_common.normalize_mac("01:00:5e:00:00:01")
    assert caught.value.code == "invalid_mac"
    with pytest.raises(VmError) as caught:
        vm_domain.parse_profile({"vcpus": 0, "memory_mib": 1024})
    assert caught.value.code == "invalid_profile"
    assert vm_common.domain_name(str(uuid.UUID(int=1)).upper()).endswith("0" * 31 + "1")


def test_process_start_is_read_from_proc_before_the_module_code_runs():
    """A module's started_at is when its process started, before its imports and its code:
    the slice VM provision role times its first phase from it."""
    before = time.time()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, time; time.sleep(0.5); sys.path[:0] = sys.argv[1:]\n"
            "from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common\n"
            "print(vm_common.process_started_at(), time.time())",
            *sys.path,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    started, now = map(float, child.stdout.split())
    # /proc counts in clock ticks (10 ms), and a busy host delays clock reads: 50 ms slack
    assert before - 0.05 <= started <= now - 0.5 + 0.05


def test_cpulists_round_trip():
    assert vm_domain.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert vm_domain.format_cpulist([11, 10, 8, 3, 2, 1, 0]) == "0-3,8,10-11"
    assert vm_domain.format_cpulist([]) == ""


def test_node_cpuset_reads_sysfs_and_refuses_a_missing_node(tmp_path: Path):
    for node, cpus in ((0, "0-3"), (1, "4-7")):
        (tmp_path / f"node{node}").mkdir()
        (tmp_path / f"node{node}" / "cpulist").write_text(cpus + "\n")
    assert vm_domain.node_cpuset([0, 1], str(tmp_path)) == "0-7"
    with pytest.raises(VmError) as caught:
        vm_domain.node_cpuset([2], str(tmp_path))
    assert caught.value.code == "numa_node_missing"
