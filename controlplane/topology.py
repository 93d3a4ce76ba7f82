"""The ``gpuaas.topology/v1`` candidate map, as the node plane reports it.

Parsing is strict about structure (a broken map is bad input) and lenient about
content (an incomplete candidate is still a candidate; approval judges it). Every key of
the contract is required: a map with no candidates says so with an empty list, so a
truncated map is never read as "this host has no slots".
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from controlplane.errors import InvalidInput

SCHEMA = "gpuaas.topology/v1"
# The contract's keys and the JSON type each must have.
REQUIRED_KEYS: dict[str, type] = {
    "node": str,
    "collected_at": str,
    "host": dict,
    "gpus": list,
    "fabric_devices": list,
    "nvme_devices": list,
    "slice_network": dict,
    "candidate_slots": list,
    "blockers": list,
}
# The fabric devices' link layer as sysfs spells it -> the store's (enums.LinkLayer).
LINK_LAYERS = {"InfiniBand": "infiniband", "Ethernet": "ethernet"}
JSON_TYPE_NAMES = {str: "a string", dict: "an object", list: "a list"}
# A device path as udev names it: absolute, no whitespace, quotes or shell syntax.
DEVICE_PATH = re.compile(r"^/dev(/[A-Za-z0-9_.:+@=,-]+)+$")


@dataclass(frozen=True)
class Partition:
    name: str
    mountpoint: str | None
    fstype: str | None


@dataclass(frozen=True)
class NvmeDevice:
    stable_path: str | None
    kernel_name: str | None
    size_bytes: int | None
    numa_node: int | None
    os_disk: bool
    mounted: bool
    signatures: tuple[str, ...]
    partitions: tuple[Partition, ...]

    @property
    def mounted_partitions(self) -> tuple[Partition, ...]:
        return tuple(p for p in self.partitions if p.mountpoint)

    @property
    def filesystems(self) -> tuple[str, ...]:
        """Signatures on the disk itself and filesystem types on its partitions."""
        found = list(self.signatures)
        found.extend(p.fstype for p in self.partitions if p.fstype)
        return tuple(found)


@dataclass(frozen=True)
class CandidateSlot:
    slot_index: int
    gpu_pci_address: str | None
    nvme_device: str | None
    numa_node: int | None
    fabric_claim_mode: str | None
    fabric_vf_pci_address: str | None
    fabric_device: str | None
    mac_address: str | None
    private_ip: str | None
    complete: bool
    missing: tuple[str, ...]
    raw: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)


@dataclass(frozen=True)
class Blocker:
    code: str
    detail: str
    slot_index: int | None = None
    device: str | None = None
    severity: str = "hard"


@dataclass(frozen=True)
class TopologyMap:
    node: str
    collected_at: dt.datetime
    nvme_devices: tuple[NvmeDevice, ...]
    candidate_slots: tuple[CandidateSlot, ...]
    blockers: tuple[Blocker, ...]
    slice_network: dict[str, Any]
    document: dict[str, Any] = field(compare=False, repr=False)
    # The host's 1 GiB hugepage pool (None: the map does not say), a placement input.
    hugepages_1g: int | None = None
    # The link layer of the candidate slots' fabric VFs (None: none found, or both).
    fabric_link_layer: str | None = None

    def disk(self, stable_path: str | None) -> NvmeDevice | None:
        for device in self.nvme_devices:
            if stable_path is not None and device.stable_path == stable_path:
                return device
        return None

    def with_macs(self, macs: Mapping[int, str]) -> TopologyMap:
        """This map with each slot in ``macs`` holding that MAC instead of its own."""
        return replace(
            self,
            candidate_slots=tuple(
                replace(s, mac_address=macs[s.slot_index]) if s.slot_index in macs else s
                for s in self.candidate_slots
            ),
        )


def _expect(condition: bool, field_name: str, message: str) -> None:
    if not condition:
        raise InvalidInput("topology_malformed", message, {"field": field_name})


def _optional_str(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value in (None, ""):
        return None
    _expect(isinstance(value, str), f"{where}.{key}", f"{where}.{key} must be a string")
    return value


def _optional_int(item: dict[str, Any], key: str, where: str) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    _expect(
        isinstance(value, int) and not isinstance(value, bool),
        f"{where}.{key}",
        f"{where}.{key} must be an integer",
    )
    return value


def _hugepages_1g(host: dict[str, Any]) -> int | None:
    """The 1 GiB pool: its total when the map has it, else what was free (maps written
    before discovery reported the total, collected before any VM ran)."""
    key = (
        "hugepages_1g_total" if host.get("hugepages_1g_total") is not None else "hugepages_1g_free"
    )
    pages = _optional_int(host, key, "host")
    _expect(pages is None or pages >= 0, f"host.{key}", f"host.{key} must not be negative")
    return pages


def _fabric_link_layer(devices: list[Any], slots: list[CandidateSlot]) -> str | None:
    """``infiniband`` or ``ethernet`` when every slot's fabric VF has that link layer in
    the map's fabric devices (its own, else its PF's); None otherwise (a SKU that names a
    fabric skips the node)."""
    by_address = {str(d.get("pci_address")): d for d in devices if isinstance(d, dict)}

    def layer(address: str | None) -> str | None:
        device = by_address.get(address or "", {})
        found = LINK_LAYERS.get(str(device.get("link_layer")))
        if found is None and device.get("physfn"):
            return layer(str(device["physfn"])) if device["physfn"] != address else None
        return found

    found = {layer(s.fabric_vf_pci_address) for s in slots if s.fabric_vf_pci_address}
    return found.pop() if len(found) == 1 else None


def _optional_device_path(item: dict[str, Any], key: str, where: str) -> str | None:
    value = _optional_str(item, key, where)
    if value is None:
        return None
    _expect(
        DEVICE_PATH.match(value) is not None and "/../" not in f"{value}/",
        f"{where}.{key}",
        f"{where}.{key} {value!r} is not a stable device path (an absolute /dev path without "
        "spaces, quotes or other shell characters)",
    )
    return value


def _list_of_dicts(doc: dict[str, Any], key: str) -> list[dict[str, Any]]:
    value = doc[key]
    for i, item in enumerate(value):
        _expect(isinstance(item, dict), f"{key}[{i}]", f"{key}[{i}] must be an object")
    return value


def parse_collected_at(value: Any) -> dt.datetime:
    _expect(isinstance(value, str), "collected_at", "collected_at must be an ISO 8601 string")
    try:
        stamp = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError as exc:
        raise InvalidInput(
            "topology_malformed",
            f"collected_at is not ISO 8601: {value!r}",
            {"field": "collected_at"},
        ) from exc
    _expect(stamp.tzinfo is not None, "collected_at", "collected_at must carry a time zone")
    return stamp


def parse(document: Any) -> TopologyMap:
    """Parse a candidate map, raising ``InvalidInput`` for anything structurally wrong."""
    _expect(isinstance(document, dict), "", "the topology map must be a JSON object")
    if document.get("schema") != SCHEMA:
        raise InvalidInput(
            "topology_schema",
            f"unsupported topology schema {document.get('schema')!r}; expected {SCHEMA!r}",
            {"schema": document.get("schema")},
        )
    for key, kind in REQUIRED_KEYS.items():
        _expect(key in document, key, f"the topology map has no {key!r} (a required key)")
        _expect(
            isinstance(document[key], kind),
            key,
            f"{key} must be {JSON_TYPE_NAMES[kind]}",
        )
    node = document["node"]
    _expect(bool(node), "node", "node must be a non-empty string")

    disks = []
    for i, item in enumerate(_list_of_dicts(document, "nvme_devices")):
        where = f"nvme_devices[{i}]"
        partitions = []
        for j, part in enumerate(item.get("partitions") or []):
            _expect(
                isinstance(part, dict), f"{where}.partitions[{j}]", "partition must be an object"
            )
            partitions.append(
                Partition(
                    name=str(part.get("name", "")),
                    mountpoint=_optional_str(part, "mountpoint", f"{where}.partitions[{j}]"),
                    fstype=_optional_str(part, "fstype", f"{where}.partitions[{j}]"),
                )
            )
        signatures = item.get("signatures") or []
        _expect(isinstance(signatures, list), f"{where}.signatures", "signatures must be a list")
        disks.append(
            NvmeDevice(
                stable_path=_optional_device_path(item, "stable_path", where),
                kernel_name=_optional_str(item, "kernel_name", where),
                size_bytes=_optional_int(item, "size_bytes", where),
                numa_node=_optional_int(item, "numa_node", where),
                os_disk=bool(item.get("os_disk", False)),
                mounted=bool(item.get("mounted", False)),
                signatures=tuple(str(s) for s in signatures),
                partitions=tuple(partitions),
            )
        )

    slots = []
    for i, item in enumerate(_list_of_dicts(document, "candidate_slots")):
        where = f"candidate_slots[{i}]"
        index = _optional_int(item, "slot_index", where)
        _expect(
            index is not None and index >= 0, f"{where}.slot_index", f"{where} needs slot_index"
        )
        missing = item.get("missing") or []
        _expect(isinstance(missing, list), f"{where}.missing", "missing must be a list")
        slots.append(
            CandidateSlot(
                slot_index=index,
                gpu_pci_address=_optional_str(item, "gpu_pci_address", where),
                nvme_device=_optional_device_path(item, "nvme_device", where),
                numa_node=_optional_int(item, "numa_node", where),
                fabric_claim_mode=_optional_str(item, "fabric_claim_mode", where),
                fabric_vf_pci_address=_optional_str(item, "fabric_vf_pci_address", where),
                fabric_device=_optional_str(item, "fabric_device", where),
                mac_address=_optional_str(item, "mac_address", where),
                private_ip=_optional_str(item, "private_ip", where),
                complete=bool(item.get("complete", False)),
                missing=tuple(str(m) for m in missing),
                raw=item,
            )
        )
    indexes = [s.slot_index for s in slots]
    duplicates = sorted({i for i in indexes if indexes.count(i) > 1})
    if duplicates:
        raise InvalidInput(
            "topology_malformed",
            f"slot_index repeated in candidate_slots: {duplicates}",
            {"field": "candidate_slots", "slot_indexes": duplicates},
        )

    blockers = []
    for i, item in enumerate(_list_of_dicts(document, "blockers")):
        code = item.get("code")
        _expect(isinstance(code, str) and bool(code), f"blockers[{i}].code", "blocker needs a code")
        blockers.append(
            Blocker(
                code=code,
                detail=str(item.get("detail", "")),
                slot_index=_optional_int(item, "slot_index", f"blockers[{i}]"),
                device=_optional_str(item, "device", f"blockers[{i}]"),
                severity=str(item.get("severity", "hard")),
            )
        )

    network = document["slice_network"]
    return TopologyMap(
        node=node,
        collected_at=parse_collected_at(document["collected_at"]),
        nvme_devices=tuple(disks),
        candidate_slots=tuple(sorted(slots, key=lambda s: s.slot_index)),
        blockers=tuple(blockers),
        slice_network=network,
        document=document,
        hugepages_1g=_hugepages_1g(document["host"]),
        fabric_link_layer=_fabric_link_layer(document["fabric_devices"], slots),
    )
