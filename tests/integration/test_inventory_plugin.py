"""The gpuaas.fleet.controlplane dynamic inventory, as operators and flows use it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from controlplane.api import ControlPlane
from controlplane.enums import AdminState, HostKeySource
from controlplane.errors import InvalidInput
from controlplane.hostkeys import control_path, parse_public_key
from controlplane.services.inventory import NodeSpec, SkuSpec
from gpuaas_lab.demo import recorded_map
from tests.unit.test_hostkeys import keygen

REPO = Path(__file__).resolve().parents[2]


def ansible(tool: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / tool), *args],
        env={**env, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg")},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )


def plain(value):
    """ansible-core 2.19 tags strings from inventory plugins as untrusted in its JSON."""
    if isinstance(value, dict):
        if set(value) == {"__ansible_unsafe"}:
            return value["__ansible_unsafe"]
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


def test_inventory_groups_nodes_and_carries_host_vars(engine, cli_env):
    cp = ControlPlane(engine)
    cp.register_node(
        NodeSpec(
            "j22u15",
            "region-maas-1",
            maas_tags=("gpuaas-profile-slice-vm",),
            slice_subnet="10.100.0.0/24",
            management_address="10.177.36.197",
            host_vars={"ansible_user": "hpcadmin"},
        )
    )
    cp.register_node(NodeSpec("j22u17", "region-maas-2", maas_tags=("gpuaas-profile-baremetal",)))
    cp.set_admin_state("j22u17", AdminState.UNAVAILABLE, "parity: nat")
    proc = ansible("ansible-inventory", "-i", "inventories/controlplane.yml", "--list", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    data = plain(json.loads(proc.stdout))
    host = data["_meta"]["hostvars"]["j22u15"]
    assert host["ansible_host"] == "10.177.36.197"
    assert host["ansible_user"] == "hpcadmin"
    assert host["gpuaas_slice_subnet"] == "10.100.0.0/24"
    assert host["gpuaas_node_id"] == "j22u15"
    assert host["gpuaas_node_uuid"] == cp.list_nodes("region-maas-1")[0].id
    assert data["region_region_maas_1"]["hosts"] == ["j22u15"]
    assert data["intent_baremetal"]["hosts"] == ["j22u17"]
    assert data["posture_unavailable"]["hosts"] == ["j22u17"]
    assert data["posture_fully_available"]["hosts"] == ["j22u15"]


def test_inventory_filters_and_reports_an_unreachable_store(engine, cli_env, tmp_path):
    cp = ControlPlane(engine)
    for host in ("a1", "a2"):
        cp.register_node(NodeSpec(host, "r1", maas_tags=("gpuaas-profile-slice-vm",)))
    source = tmp_path / "controlplane.yml"
    source.write_text(json.dumps({"plugin": "gpuaas.fleet.controlplane", "hostnames": ["a2"]}))
    proc = ansible("ansible-inventory", "-i", str(source), "--list", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    assert list(json.loads(proc.stdout)["_meta"]["hostvars"]) == ["a2"]
    broken = {**cli_env, "GPUAAS_DATABASE_URL": f"postgresql://x@/none?host={tmp_path}"}
    failed = ansible(
        "ansible-inventory", "-i", "inventories/controlplane.yml", "--list", env=broken
    )
    assert "cannot read nodes from the control plane" in failed.stderr + failed.stdout
    assert os.path.exists(REPO / "inventories" / "controlplane.yml")


def test_inventory_gives_bootstrap_and_parity_what_they_need(engine, cli_env):
    """Profile, approved reservations and VFIO devices, and the newest topology's time."""
    cp = ControlPlane(engine)
    slice_tags = ("gpuaas-profile-slice-vm",)
    cp.register_node(NodeSpec("j22u15", "r1", maas_tags=slice_tags, slice_subnet="10.100.0.0/24"))
    cp.register_node(NodeSpec("j22u16", "r1", maas_tags=slice_tags, slice_subnet="10.100.0.0/24"))
    cp.register_node(NodeSpec("j22u17", "r1", maas_tags=("gpuaas-profile-baremetal",)))
    cp.register_node(NodeSpec("j22u18", "r1"))
    document = recorded_map("j22u15")
    cp.import_topology("j22u15", document, "test")
    newer = {**document, "collected_at": "2026-11-21T08:30:00Z"}
    cp.import_topology("j22u15", newer, "test")
    cp.approve_slots("j22u15", [0, 1, 2], "test")
    proc = ansible("ansible-inventory", "-i", "inventories/controlplane.yml", "--list", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    hostvars = plain(json.loads(proc.stdout))["_meta"]["hostvars"]

    host = hostvars["j22u15"]
    assert host["gpuaas_profile"] == "slice-vm"
    assert host["gpuaas_topology_collected_at"] == "2026-11-21T08:30:00+00:00"
    assert host["gpuaas_topology_blockers"] == []
    slots = {s["slot_index"]: s for s in document["candidate_slots"]}
    assert host["gpuaas_slot_reservations"] == [
        {"mac": slots[i]["mac_address"], "ip": slots[i]["private_ip"], "name": f"j22u15-slot{i}"}
        for i in (0, 1, 2)
    ]
    assert host["gpuaas_vfio_devices"] == sorted(
        address
        for i in (0, 1, 2)
        for address in (slots[i]["gpu_pci_address"], slots[i]["fabric_vf_pci_address"])
    )

    assert hostvars["j22u16"]["gpuaas_slot_reservations"] == []
    assert hostvars["j22u16"]["gpuaas_vfio_devices"] == []
    assert hostvars["j22u16"]["gpuaas_topology_collected_at"] is None
    assert hostvars["j22u17"]["gpuaas_profile"] == "baremetal"
    assert "gpuaas_profile" not in hostvars["j22u18"]
    assert hostvars["j22u18"]["gpuaas_profile_intent"] == "unknown"

    cp.disable_slot("j22u15", 1, "bad riser", "test")
    again = ansible(
        "ansible-inventory", "-i", "inventories/controlplane.yml", "--host", "j22u15", env=cli_env
    )
    reservations = plain(json.loads(again.stdout))["gpuaas_slot_reservations"]
    assert [r["name"] for r in reservations] == ["j22u15-slot0", "j22u15-slot2"]


def hugepage_sku(slug: str, memory_gib_per_gpu: int, **changes) -> SkuSpec:
    spec = {
        "display_name": slug,
        "capacity_shape": "gpu_slice",
        "node_family": "h200-sxm",
        "gpu_model": "H200",
        "allowed_gpu_counts": (1, 2),
        "memory_gib_per_gpu": memory_gib_per_gpu,
        "requires_hugepages": True,
    }
    return SkuSpec(slug=slug, **{**spec, **changes})


def test_inventory_says_how_many_hugepages_the_available_slots_need(engine, cli_env):
    """Each available slot needs the most memory per GPU of the family's enabled hugepage
    slice SKUs, in 1 GiB pages; a slot in use, disabled SKUs, other shapes and other
    families count for nothing."""
    cp = ControlPlane(engine)
    slice_tags = ("gpuaas-profile-slice-vm",)
    cp.register_node(NodeSpec("j22u15", "r1", maas_tags=slice_tags, slice_subnet="10.100.0.0/24"))
    cp.register_node(
        NodeSpec(
            "j22u16",
            "r1",
            node_family="b200-sxm",
            maas_tags=slice_tags,
            slice_subnet="10.100.0.0/24",
        )
    )
    cp.import_topology("j22u15", recorded_map("j22u15"), "test")
    cp.approve_slots("j22u15", [0, 1, 2], "test")
    cp.define_sku(hugepage_sku("h200-hp-96", 96))
    cp.define_sku(hugepage_sku("h200-hp-64", 64))
    cp.define_sku(hugepage_sku("b200-hp-180", 180, node_family="b200-sxm"))
    cp.define_sku(hugepage_sku("h200-bm-hp", 256, capacity_shape="baremetal"))

    def needed() -> dict[str, int]:
        proc = ansible(
            "ansible-inventory", "-i", "inventories/controlplane.yml", "--list", env=cli_env
        )
        assert proc.returncode == 0, proc.stderr
        hostvars = plain(json.loads(proc.stdout))["_meta"]["hostvars"]
        return {host: hostvars[host]["gpuaas_hugepages_1g_needed"] for host in hostvars}

    assert needed() == {"j22u15": 3 * 96, "j22u16": 0}
    cp.define_sku(hugepage_sku("h200-hp-200", 200))
    cp.disable_slot("j22u15", 1, "bad riser", "test")
    assert needed() == {"j22u15": 2 * 200, "j22u16": 0}
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE skus SET enabled = false WHERE slug = 'h200-hp-200'")
    assert needed() == {"j22u15": 2 * 96, "j22u16": 0}


def test_ssh_hosts_accept_only_their_pinned_keys(engine, cli_env, tmp_path):
    cp = ControlPlane(engine)
    cp.register_node(
        NodeSpec(
            "j22u15",
            "r1",
            management_address="10.177.36.197",
            host_vars={"ansible_ssh_common_args": "-o ConnectTimeout=5"},
        )
    )
    cp.register_node(NodeSpec("j22u16", "r1", host_vars={"ansible_connection": "local"}))
    key = keygen(tmp_path, "ed25519")
    cp.pin_host_keys("j22u15", [key], HostKeySource.OPERATOR, "test", "commissioned")
    proc = ansible("ansible-inventory", "-i", "inventories/controlplane.yml", "--list", env=cli_env)
    assert proc.returncode == 0, proc.stderr
    hostvars = plain(json.loads(proc.stdout))["_meta"]["hostvars"]
    assert "ansible_ssh_common_args" not in hostvars["j22u16"]
    # What OpenSSH makes of the arguments Ansible passes (first value of an option wins).
    effective = subprocess.run(
        ["ssh", "-G", *shlex.split(hostvars["j22u15"]["ansible_ssh_common_args"]), "10.1.2.3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    settings = dict(line.split(" ", 1) for line in effective.splitlines())
    known_hosts = os.environ["GPUAAS_KNOWN_HOSTS_FILE"]
    assert settings["stricthostkeychecking"] == "true"
    assert settings["hostkeyalias"] == "j22u15"
    assert settings["userknownhostsfile"] == known_hosts
    assert settings["globalknownhostsfile"] == "/dev/null"
    assert settings["connecttimeout"] == "5"
    # Outranks the ANSIBLE_HOST_KEY_CHECKING=False that ansible-runner sets.
    assert hostvars["j22u15"]["ansible_host_key_checking"] is True
    # A master connection opened under other pins is never reused for this host.
    assert hostvars["j22u15"]["ansible_control_path"] == control_path(
        "j22u15", [parse_public_key(key)]
    )
    found = subprocess.run(
        ["ssh-keygen", "-F", "j22u15", "-f", known_hosts], capture_output=True, text=True
    )
    assert found.returncode == 0 and key.split()[1] in found.stdout


def test_host_vars_that_would_bypass_the_pinned_keys_are_refused(engine):
    cp = ControlPlane(engine)
    for host_vars in (
        {"ansible_ssh_common_args": "-o StrictHostKeyChecking=no"},
        {"ansible_ssh_extra_args": "-o UserKnownHostsFile=/dev/null"},
        {"ansible_host_key_checking": False},
        {"ansible_control_path": "/tmp/shared-master"},
    ):
        with pytest.raises(InvalidInput) as error:
            cp.register_node(NodeSpec("j22u15", "r1", host_vars=host_vars))
        assert error.value.code == "host_key_checking_in_host_vars"
    assert cp.list_nodes() == []


def test_a_host_list_on_the_command_line_is_an_inventory():
    """`-i 10.0.0.5,` is the usual way to run a playbook against one host: the shipped
    ansible.cfg parses it (host_list), where it used to warn, match no host and exit 0."""
    listed = ansible(
        "ansible-playbook",
        "-i",
        "10.0.0.5,",
        "playbooks/bootstrap.yml",
        "--list-hosts",
        env=dict(os.environ),
    )
    assert listed.returncode == 0, listed.stderr
    assert "Unable to parse" not in listed.stderr
    first_play = listed.stdout.split("play #2")[0]
    assert "hosts (1):" in first_play and "10.0.0.5" in first_play, listed.stdout
