"""The CLI's human tables read at a glance in a 120-column terminal."""

from __future__ import annotations

import io
import json
from importlib import resources

from rich.console import Console

from gpuaas_cli import render


def fleet_slots(detail: str) -> list[dict]:
    rows = []
    for host in ("j22u15", "j22u16"):
        doc = json.loads(
            resources.files("gpuaas_lab.demo_data").joinpath(f"{host}.json").read_text()
        )
        for c in doc["candidate_slots"]:
            rows.append(
                {
                    "node": host,
                    "slot_index": c["slot_index"],
                    "status": "cleanup_blocked",
                    "health_state": "degraded",
                    "health_detail": detail,
                    "gpu_pci_address": c["gpu_pci_address"],
                    "numa_node": c["numa_node"],
                    "nvme_device": c["nvme_device"],
                    "mac_address": c["mac_address"],
                    "private_ip": c["private_ip"],
                    "fabric_vf_pci_address": c["fabric_vf_pci_address"],
                }
            )
    return rows


def rendered(slots: list[dict]) -> list[str]:
    console = Console(width=120, file=io.StringIO(), record=True)
    render.render_slots(slots, console)
    return [line for line in console.export_text().splitlines() if line.strip()]


def test_slots_table_is_one_line_per_slot_at_120_columns():
    slots = fleet_slots("candidate: awaiting approval")
    lines = rendered(slots)
    body = lines[3:]
    assert len(body) == len(slots), "\n".join(lines)
    for slot, line in zip(slots, body, strict=True):
        assert line.startswith(slot["node"]) and slot["private_ip"] in line
        assert slot["gpu_pci_address"].removeprefix("0000:") in line
        assert slot["nvme_device"][-8:] in line


def test_a_long_detail_folds_in_its_own_column():
    slots = fleet_slots(
        "not approvable: mounted_child_partition, fabric_device_shared, disk_has_filesystems"
    )
    lines = rendered(slots[:1])
    detail_at = lines[1].index("detail")
    assert len(lines) > 4
    for continuation in lines[4:]:
        assert continuation[:detail_at].strip() == ""
    assert "disk_has_filesystems" in " ".join(lines)
