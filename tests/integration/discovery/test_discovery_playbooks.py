"""ansible-playbook runs slice_topology and slice_parity for real inside a test namespace.

Parity and topology blockers must follow the namespace's live state as it gains and loses
its bridge address, NAT rule and IP forwarding (and a real dnsmasq and libvirtd).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity

from tests.integration.ansible_helpers import task_result
from tests.integration.discovery.discovery_helpers import (
    GATEWAY,
    SLICE_SUBNET,
    run_playbooks,
    start_dnsmasq,
    start_session_libvirtd,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]

COLLECTIONS = Path(__file__).resolve().parents[3] / ".collections"

BOTH = ["topology_discover.yml", "parity.yml"]
DISCOVER_TASK = "Discover GPUs, fabric, NVMe, virtualization and slice network state"
FLIPPING = ("bridge", "nat", "ip_forward", "slice_isolation", "dnsmasq", "libvirt")
# The guests' containment as the network baseline converges it (its NAT left to the test).
CONTAIN = (
    "import sys; sys.path.insert(0, sys.argv[1])\n"
    "from ansible_collections.gpuaas.fleet.plugins.module_utils import network_baseline as nb\n"
    "nb.converge(nb.load_config({'bridge': 'ovsbr0', 'bridge_type': 'linux', 'nat': False}))\n"
)


def hard_codes(topology_map: dict) -> set[str]:
    return {b["code"] for b in topology_map["blockers"] if b["severity"] == "hard"}


def statuses(result: dict) -> dict[str, str]:
    return {r["check"]: r["status"] for r in result["results"]}


def test_topology_blockers_follow_the_live_namespace(slice_ns, trees, ansible_env, tmp_path):
    extravars = {"gpuaas_topology_root": str(trees["clean"]), "gpuaas_node_id": "j22u15"}

    slice_ns.add_address("ovsbr0", GATEWAY)
    slice_ns.add_masquerade(SLICE_SUBNET)
    slice_ns.set_ip_forward(True)
    rc, doc = run_playbooks(ansible_env, ["topology_discover.yml"], extravars, tmp_path, slice_ns)
    assert rc == 0
    good = task_result(doc, DISCOVER_TASK)
    assert good["changed"] is False
    network = good["topology"]["slice_network"]
    assert network["bridge_ipv4"] == GATEWAY and network["bridge_owns_gateway"]
    assert network["nat_masquerade"] and network["ip_forward"]
    assert network["nat_rule"] == f"-A POSTROUTING -s {SLICE_SUBNET} -j MASQUERADE"
    assert network["default_route_uplink"] == "eno8303"
    assert network["tmfifo_ipv4"] == "192.168.100.1/30"
    assert good["topology"]["blockers"] == []
    assert good["topology"]["summary"]["unblocked_slots"] == 8

    slice_ns.del_address("ovsbr0", GATEWAY)
    slice_ns.remove_masquerade(SLICE_SUBNET)
    slice_ns.set_ip_forward(False)
    rc, doc = run_playbooks(ansible_env, ["topology_discover.yml"], extravars, tmp_path, slice_ns)
    bad = task_result(doc, DISCOVER_TASK)
    assert hard_codes(bad["topology"]) == {
        "bridge_address_missing",
        "nat_missing",
        "ip_forward_disabled",
    }
    # Node-level network blockers do not make the slots themselves incomplete.
    assert all(s["complete"] and not s["blockers"] for s in bad["topology"]["candidate_slots"])

    slice_ns.delete_link("ovsbr0")
    rc, doc = run_playbooks(
        ansible_env,
        ["topology_discover.yml"],
        {**extravars, "gpuaas_network_mode": "private-routed"},
        tmp_path,
        slice_ns,
    )
    routed = task_result(doc, DISCOVER_TASK)
    assert hard_codes(routed["topology"]) == {"bridge_missing", "ip_forward_disabled"}
    nat = next(b for b in routed["topology"]["blockers"] if b["code"] == "nat_missing")
    assert nat["severity"] == "advisory"


def test_parity_flips_with_the_namespace_state(slice_ns, trees, ansible_env, tmp_path, daemon_dir):
    extravars = {
        "gpuaas_topology_root": str(trees["clean"]),
        "gpuaas_node_id": "j22u15",
        "gpuaas_fabric_subnet": "172.16.10.0/24",
        "slice_parity_libvirt_sockets": [str(daemon_dir / "run/libvirt/libvirt-sock")],
    }

    # A: bridge without its address, no NAT, no forwarding, no dnsmasq, no libvirt.
    rc, doc = run_playbooks(ansible_env, BOTH, extravars, tmp_path, slice_ns)
    assert rc != 0, "failed parity must fail the host"
    before = task_result(doc, "Run the slice parity checks")
    assert before["failed"] and before["msg"].startswith("slice parity failed: ")
    assert "bridge" in before["msg"]
    assert {c: statuses(before)[c] for c in FLIPPING} == dict.fromkeys(FLIPPING, "FAIL")
    assert statuses(before)["api_topology"] == "FAIL"

    # B: the full parity target.
    slice_ns.add_address("ovsbr0", GATEWAY)
    slice_ns.add_masquerade(SLICE_SUBNET)
    slice_ns.set_ip_forward(True)
    slice_ns.run([sys.executable, "-c", CONTAIN, str(COLLECTIONS)])
    dnsmasq = start_dnsmasq(slice_ns, daemon_dir)
    libvirtd, _sock = start_session_libvirtd(slice_ns, daemon_dir)
    rc, doc = run_playbooks(ansible_env, BOTH, extravars, tmp_path, slice_ns)
    assert rc == 0, task_result(doc, "Run the slice parity checks")["results"]
    after = task_result(doc, "Run the slice parity checks")
    assert statuses(after) == dict.fromkeys(parity.CHECKS, "PASS"), after["results"]
    assert after["lines"][-1] == (
        "GPUAAS_SLICE_PARITY_SUMMARY status=PASS checks=17 passed=17 failures=0 warnings=0"
    )
    assert after["failures"] == 0 and after["warning_count"] == 0
    printed = task_result(
        doc, "Print the GPUAAS_SLICE_PARITY lines of every host still in the play"
    )
    printed = printed["msg"]["localhost"]
    parsed, summary = parity.parse_lines(printed)
    assert parsed == after["results"] and summary == after["summary"]
    assert doc["stats"]["localhost"]["changed"] == 0

    # B again in check mode, as a sweep runs it: the parity module discovers the topology
    # itself (one module task, playbooks/fleet_check.yml); same answers, nothing changed.
    rc, checked = run_playbooks(
        ansible_env, ["fleet_check.yml"], extravars, tmp_path, slice_ns, check=True
    )
    assert rc == 0
    assert not any(
        task["task"]["name"].endswith(DISCOVER_TASK)
        for play in checked["plays"]
        for task in play["tasks"]
    )
    rechecked = task_result(checked, "Run the slice parity checks")
    # Same answers; only the evidence age in api_topology's detail moves with the clock.
    assert rechecked["results"][:-1] == after["results"][:-1]
    assert statuses(rechecked) == statuses(after)
    discovered = task_result(doc, DISCOVER_TASK)
    assert without_time(discovered["topology"]) == without_time(rechecked["topology"])
    assert rechecked["topology"]["node"] == "j22u15"
    assert checked["stats"]["localhost"]["changed"] == 0

    # C: everything taken away again, the IPoIB link down too.
    slice_ns.stop_daemon(dnsmasq)
    slice_ns.stop_daemon(libvirtd)
    slice_ns.del_address("ovsbr0", GATEWAY)
    slice_ns.remove_masquerade(SLICE_SUBNET)
    slice_ns.set_ip_forward(False)
    slice_ns.run(["ip", "link", "set", "ibp26s0", "down"])
    slice_ns.run(["iptables", "-D", "INPUT", "-j", "GPUAAS-SLICE-IN"])
    rc, doc = run_playbooks(
        ansible_env, BOTH, {**extravars, "slice_parity_fail_on_failures": False}, tmp_path, slice_ns
    )
    assert rc == 0
    again = task_result(doc, "Run the slice parity checks")
    fabric = ("fabric_address", "fabric_route")
    assert {c: statuses(again)[c] for c in FLIPPING + fabric} == dict.fromkeys(
        FLIPPING + fabric, "FAIL"
    )
    parsed, summary = parity.parse_lines(again["lines"])
    assert parsed == again["results"]
    # The six above, the IPoIB address and route, and api_topology.
    assert summary["failures"] == again["failures"] == 9


def ok_json(env: dict, *args: str) -> dict:
    """The gpuaas CLI as an operator runs it, --json output."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", *args, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def without_time(topology_map: dict) -> dict:
    stripped = copy.deepcopy(topology_map)
    stripped.pop("collected_at")
    return stripped


def test_discovery_output_imports_unchanged_into_the_control_plane(
    slice_ns, trees, ansible_env, tmp_path, cli_env
):
    slice_ns.add_address("ovsbr0", GATEWAY)
    slice_ns.add_masquerade(SLICE_SUBNET)
    slice_ns.set_ip_forward(True)
    out_dir = tmp_path / "maps"
    rc, doc = run_playbooks(
        ansible_env,
        ["topology_discover.yml"],
        {"gpuaas_topology_root": str(trees["clean"]), "gpuaas_topology_dir": str(out_dir)},
        tmp_path,
        slice_ns,
    )
    assert rc == 0
    written = json.loads((out_dir / "localhost.json").read_text())
    returned = task_result(doc, DISCOVER_TASK)
    assert written == returned["topology"]

    ok_json(cli_env, "node", "register", "localhost", "--region", "r1", "--tag",
            "gpuaas-profile-slice-vm", "--subnet", SLICE_SUBNET)  # fmt: skip
    imported = ok_json(
        cli_env, "slots", "import", "--node", "localhost", "--from", str(out_dir / "localhost.json")
    )
    assert imported["approvable"] == list(range(8)), imported["not_approvable"]
    approved = ok_json(cli_env, "slots", "approve", "--node", "localhost")
    assert approved["approved"] == list(range(8))
