"""The health probe on recorded host trees and recorded tool outputs: each fault is one
finding with its severity, scope and the slots it affects, and nothing else is found."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import health, sysfs
from health_helpers import RecordedTools, codes, recorded

from gpuaas_lab import healthtrees

# Slot 1 of the recorded H200 node: its GPU, VF and disk (healthtrees.slots).
GPU1 = "0000:43:00.0"
VF1 = "0000:1a:00.2"


def disk_of(tree: Path, slot: int) -> tuple[str, str]:
    """(stable path, kernel name) of a slot's disk."""
    stable = healthtrees.slots(tree)[slot]["nvme_device"]
    return stable, os.path.basename(os.path.realpath(tree / stable.lstrip("/")))


def test_a_node_in_service_passes_with_every_device_checked(probe, healthy_tree):
    tools = RecordedTools()
    report = probe(tools=tools)
    assert report["findings"] == []
    assert report["passed"] is True
    assert report["schema"] == "gpuaas.health/v1"
    assert report["node"] == "j22u15"
    assert report["collected_at"] == "2026-12-01T18:00:00Z"
    # Eight slots, each with its own GPU, VF and disk.
    assert report["devices_checked"] == 24
    smart = [argv for argv in tools.calls if argv[0] == "nvme"]
    assert len(smart) == 8
    assert all(argv[1] == "smart-log" and argv[-2:] == ("-o", "json") for argv in smart)


def test_pci_entries_are_symlinks_and_are_read_through(healthy_tree):
    """Seed story: a probe that skipped symlinks saw no GPU at all."""
    entry = healthy_tree / "sys/bus/pci/devices" / GPU1
    assert entry.is_symlink()
    host = sysfs.HostRoot(str(healthy_tree))
    assert health.pci_present(host, GPU1)
    assert health.root_port_of(host, GPU1) == (
        "0000:42:01.0",
        "/sys/devices/pci0000:42/0000:42:01.0",
    )


def test_a_gpu_gone_from_the_bus_fails_only_its_slot(probe, healthy_tree):
    healthtrees.remove_device(healthy_tree, GPU1)
    report = probe()
    assert codes(report) == [("device_missing", "critical", "device", [1])]
    assert report["findings"][0]["device"] == GPU1
    assert report["passed"] is False


def test_a_dangling_bus_entry_is_a_missing_device(probe, healthy_tree):
    """The entry left behind, its target gone: read through, it leads nowhere."""
    healthtrees.remove_device(healthy_tree, GPU1)
    (healthy_tree / "sys/bus/pci/devices" / GPU1).symlink_to("../../../devices/gone")
    assert codes(probe()) == [("device_missing", "critical", "device", [1])]


def test_a_gpu_on_the_host_driver_is_critical_with_what_it_is_bound_to(probe, healthy_tree):
    healthtrees.bind(healthy_tree, GPU1, "nvidia")
    healthtrees.bind(healthy_tree, VF1, None)
    report = probe()
    assert codes(report) == [
        ("driver_mismatch", "critical", "device", [1]),
        ("driver_mismatch", "critical", "device", [1]),
    ]
    observed = {f["device"]: (f["observed"], f["expected"]) for f in report["findings"]}
    assert observed == {GPU1: ("nvidia", "vfio-pci"), VF1: (None, "vfio-pci")}


def test_a_device_outside_any_iommu_group_is_critical(probe, healthy_tree):
    (healthtrees.pci_dir(healthy_tree, GPU1) / "iommu_group").unlink()
    assert codes(probe()) == [("iommu_group_missing", "critical", "device", [1])]


def test_a_narrowed_link_warns_and_a_gpu_s_idle_speed_does_not(probe, healthy_tree):
    healthtrees.set_link(healthy_tree, GPU1, "2.5 GT/s PCIe", 16, healthtrees.GEN5, 16)
    healthtrees.set_link(healthy_tree, VF1, healthtrees.GEN4, 8, healthtrees.GEN5, 16)
    report = probe()
    assert codes(report) == [
        ("pcie_link_width_degraded", "warning", "device", [1]),
        ("pcie_link_speed_degraded", "warning", "device", [1]),
    ]
    assert [(f["device"], f["observed"], f["expected"]) for f in report["findings"]] == [
        (VF1, "x8", "x16"),
        (VF1, "16 GT/s", "32 GT/s"),
    ]
    assert report["passed"] is True


def test_aer_fatal_and_nonfatal_are_critical_correctable_warns_above_its_threshold(
    probe, healthy_tree
):
    healthtrees.write_aer(
        healthtrees.pci_dir(healthy_tree, GPU1),
        {"aer_dev_fatal": {"CmpltTO": 1}, "aer_dev_correctable": {"BadTLP": 150, "RxErr": 1}},
    )
    healthtrees.write_aer(
        healthtrees.pci_dir(healthy_tree, VF1), {"aer_dev_nonfatal": {"UnxCmplt": 2}}
    )
    report = probe()
    assert codes(report) == [
        ("aer_fatal", "critical", "device", [1]),
        ("aer_correctable", "warning", "device", [1]),
        ("aer_nonfatal", "critical", "device", [1]),
    ]
    assert "CmpltTO=1" in report["findings"][0]["detail"]
    assert report["findings"][1]["observed"] == 151
    assert codes(probe(thresholds=health.Thresholds(aer_correctable=200)))[1:] == [
        ("aer_nonfatal", "critical", "device", [1])
    ]


def test_a_fatal_error_on_a_root_port_fails_the_node(probe, healthy_tree):
    healthtrees.write_aer(
        healthtrees.root_port_dir(healthy_tree, GPU1), {"aer_dev_fatal": {"DLP": 1}}
    )
    report = probe()
    assert codes(report) == [("root_port_aer_fatal", "critical", "node", [])]
    assert report["findings"][0]["device"] == "0000:42:01.0"
    assert GPU1 in report["findings"][0]["detail"]


def test_nvme_critical_warning_is_critical_and_media_errors_warn(probe, healthy_tree):
    stable, kernel = disk_of(healthy_tree, 2)
    tools = RecordedTools(smart_logs={kernel: (0, "nvme-smart-log-failing.json")})
    report = probe(tools=tools)
    assert codes(report) == [
        ("nvme_critical_warning", "critical", "device", [2]),
        ("nvme_media_errors", "warning", "device", [2]),
    ]
    assert {f["device"] for f in report["findings"]} == {stable}
    assert report["findings"][0]["detail"].endswith("critical_warning 0x04")
    relaxed = probe(tools=tools, thresholds=health.Thresholds(nvme_media_errors=20))
    assert codes(relaxed) == [("nvme_critical_warning", "critical", "device", [2])]


def test_newer_nvme_cli_json_with_objects_and_strings_is_read(probe, healthy_tree):
    _stable, kernel = disk_of(healthy_tree, 0)
    tools = RecordedTools(smart_logs={kernel: (0, "nvme-smart-log-media-errors.json")})
    report = probe(tools=tools)
    assert codes(report) == [("nvme_media_errors", "warning", "device", [0])]
    assert report["findings"][0]["observed"] == 5


def test_a_disk_whose_stable_path_leads_nowhere_is_missing(probe, healthy_tree):
    stable, _kernel = disk_of(healthy_tree, 3)
    (healthy_tree / stable.lstrip("/")).unlink()
    report = probe()
    assert codes(report) == [("device_missing", "critical", "device", [3])]
    assert report["findings"][0]["device"] == stable


def test_an_unreadable_smart_log_warns_and_a_missing_nvme_cli_is_said_once(probe, healthy_tree):
    _stable, kernel = disk_of(healthy_tree, 4)
    failing = RecordedTools(smart_logs={kernel: (1, "NVMe status: Invalid Field in Command")})
    assert codes(probe(tools=failing)) == [("nvme_smart_log_unreadable", "warning", "device", [4])]
    assert codes(probe(tools=RecordedTools(nvme_installed=False))) == [
        ("tool_missing", "warning", "node", [])
    ]


def test_a_disk_s_pcie_errors_count_against_its_slot(probe, healthy_tree):
    disk = healthtrees.nvme_pci_address(
        healthy_tree, healthtrees.slots(healthy_tree)[5]["nvme_device"]
    )
    healthtrees.write_aer(healthtrees.pci_dir(healthy_tree, disk), {"aer_dev_fatal": {"TLP": 1}})
    assert codes(probe()) == [("aer_fatal", "critical", "device", [5])]


def test_edac_uncorrectable_is_critical_for_the_node_corrected_warn_above_threshold(
    probe, healthy_tree
):
    healthtrees.set_edac(healthy_tree, 0, 60, 0)
    healthtrees.set_edac(healthy_tree, 1, 50, 1)
    report = probe()
    assert codes(report) == [
        ("edac_uncorrectable", "critical", "node", []),
        ("edac_correctable", "warning", "node", []),
    ]
    assert report["findings"][0]["observed"] == {"mc1": 1}
    assert report["findings"][1]["observed"] == {"mc0": 60, "mc1": 50}


def test_too_few_free_hugepages_for_the_skus_warns_for_the_node(probe, healthy_tree):
    healthtrees.set_hugepages(healthy_tree, 100, 0)
    assert probe(hugepages_needed={"1g": 100})["findings"] == []
    report = probe(hugepages_needed={"1g": 128, "2m": 0})
    assert codes(report) == [("hugepages_short", "warning", "node", [])]
    assert (report["findings"][0]["observed"], report["findings"][0]["expected"]) == (100, 128)


def test_a_device_shared_by_two_slots_is_checked_once_and_names_both(probe, healthy_tree):
    slots = healthtrees.slots(healthy_tree)[:2]
    slots[1] = {**slots[1], "fabric_vf_pci_address": slots[0]["fabric_vf_pci_address"]}
    healthtrees.bind(healthy_tree, slots[0]["fabric_vf_pci_address"], "mlx5_core")
    report = probe(slots=slots)
    assert report["devices_checked"] == 5
    assert codes(report) == [("driver_mismatch", "critical", "device", [0, 1])]


def test_nvidia_smi_ecc_and_pending_pages_and_dcgm_health_per_gpu(probe, healthy_tree):
    tools = RecordedTools(
        nvidia_smi=(0, recorded("nvidia-smi-q-x.xml"), ""),
        dcgmi=(0, recorded("dcgmi-health-c-j.json"), ""),
    )
    report = probe(tools=tools)
    assert codes(report) == [
        ("gpu_ecc_uncorrectable", "critical", "device", [1]),
        ("gpu_remapped_rows_pending", "warning", "device", [1]),
        ("gpu_xid", "critical", "device", [1]),
    ]
    xid = report["findings"][2]
    assert xid["device"] == GPU1
    assert xid["observed"] == {"health": "failure", "xids": [48]}
    assert "double-bit ECC error" in xid["detail"]


def test_nvidia_findings_on_a_gpu_of_no_slot_are_not_the_probe_s(probe, healthy_tree):
    slots = [s for s in healthtrees.slots(healthy_tree) if s["gpu_pci_address"] != GPU1]
    tools = RecordedTools(
        nvidia_smi=(0, recorded("nvidia-smi-q-x.xml"), ""),
        dcgmi=(0, recorded("dcgmi-health-c-j.json"), ""),
    )
    assert probe(tools=tools, slots=slots)["findings"] == []


def test_older_nvidia_smi_double_bit_and_retired_pages(probe, healthy_tree):
    tools = RecordedTools(nvidia_smi=(0, recorded("nvidia-smi-q-x-a100.xml"), ""))
    assert codes(probe(tools=tools)) == [
        ("gpu_ecc_uncorrectable", "critical", "device", [2]),
        ("gpu_retired_pages_pending", "warning", "device", [2]),
    ]


def test_nvidia_tools_without_gpus_or_absent_report_nothing(probe, healthy_tree):
    vfio_only = RecordedTools(nvidia_smi=(6, "", "No devices were found"))
    assert probe(tools=vfio_only)["findings"] == []
    assert probe(tools=RecordedTools())["findings"] == []
    broken = RecordedTools(nvidia_smi=(0, "<nvidia_smi_log><gpu", ""))
    assert codes(probe(tools=broken)) == [("nvidia_tool_failed", "warning", "node", [])]
    calls = RecordedTools(nvidia_smi=(0, recorded("nvidia-smi-q-x.xml"), ""))
    probe(tools=calls, nvidia_tools=False)
    assert not [argv for argv in calls.calls if argv[0] != "nvme"]


def test_addresses_in_nvidia_smi_form_are_normalized():
    assert health.normalize_address("00000000:1B:00.0") == "0000:1b:00.0"
    assert health.normalize_address("0000:1B:00.0") == "0000:1b:00.0"
    assert health.normalize_address(None) is None


@pytest.mark.parametrize(
    ("slots", "options", "message"),
    [
        ([{"gpu_pci_address": GPU1}], {}, "has no slot_index"),
        ([{"slot_index": 0}, {"slot_index": 0}], {}, "slot_index 0 is given twice"),
        ([{"slot_index": 0, "gpu_pci_address": "43:00.0"}], {}, "is not a PCI address"),
        ([], {"thresholds": health.Thresholds(aer_correctable=-1)}, "aer_correctable"),
        ([], {"hugepages_needed": {"4k": 1}}, "hugepages size '4k'"),
    ],
)
def test_bad_input_is_refused_before_anything_is_read(probe, slots, options, message):
    tools = RecordedTools()
    with pytest.raises(health.HealthError, match=message):
        probe(slots=slots, tools=tools, **options)
    assert tools.calls == []


def test_a_node_without_slots_checks_only_the_node(probe, healthy_tree):
    healthtrees.set_edac(healthy_tree, 0, 0, 3)
    report = probe(slots=[])
    assert report["devices_checked"] == 0
    assert codes(report) == [("edac_uncorrectable", "critical", "node", [])]
