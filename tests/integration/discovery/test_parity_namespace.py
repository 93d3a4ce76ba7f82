"""Each behaviour parity check flips PASS/FAIL/WARN with a real network namespace's state.

The checks run in a real process inside the namespace the test builds (slice_ns: uplink,
IPoIB stand-in ibp26s0 with 172.16.10.5/24, tmfifo, an unaddressed Linux bridge ovsbr0),
against real links, routes, daemons and sockets. Each case is one a presence-only check
passed: an address outside the site subnet, a down or route-less IPoIB link, a link
named like the bridge that is no bridge, a UDP port 67 socket that dnsmasq does not hold,
a historical baseline service still running.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuaas_lab.netns import NetNamespace
from tests.integration.discovery.discovery_helpers import (
    GATEWAY,
    parity_in,
    start_dnsmasq,
    topology_in,
)

pytestmark = pytest.mark.root

HISTORICAL = "gpuaas-slice-host-net-baseline"
OVS_SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")


def status(results: dict, check: str) -> tuple[str, str]:
    return results[check]["status"], results[check]["detail"]


def hard_codes(topology_map: dict) -> set[str]:
    return {b["code"] for b in topology_map["blockers"] if b["severity"] == "hard"}


def test_fabric_address_must_be_up_in_the_site_subnet_and_routed(slice_ns, trees):
    root = trees["clean"]
    site = {"fabric_subnet": "172.16.0.0/16"}
    assert status(parity_in(slice_ns, root, ["fabric_address"], **site), "fabric_address") == (
        "PASS",
        "ibp26s0=172.16.10.5/24, route 172.16.10.0/24",
    )

    elsewhere = parity_in(slice_ns, root, ["fabric_address"], fabric_subnet="10.200.0.0/16")
    assert status(elsewhere, "fabric_address") == (
        "FAIL",
        "no ibp* address in 10.200.0.0/16 (has: ibp26s0=172.16.10.5/24)",
    )

    slice_ns.run(["ip", "link", "set", "ibp26s0", "down"])
    down = parity_in(slice_ns, root, ["fabric_address", "fabric_route"], **site)
    assert status(down, "fabric_address") == ("FAIL", "ibp26s0 owns 172.16.10.5/24 but is down")
    assert down["fabric_route"]["status"] == "FAIL"
    slice_ns.link_up("ibp26s0")

    # A host address without a connected route: owned, but nothing routes the fabric.
    slice_ns.del_address("ibp26s0", "172.16.10.5/24")
    slice_ns.add_address("ibp26s0", "172.16.10.5/32")
    unrouted = parity_in(slice_ns, root, ["fabric_address"], **site)
    assert status(unrouted, "fabric_address") == (
        "FAIL",
        "ibp26s0 owns 172.16.10.5/32 but has no route that reaches it",
    )
    slice_ns.add_route("172.16.0.0/16", "ibp26s0")
    routed = parity_in(slice_ns, root, ["fabric_address", "fabric_route"], **site)
    assert status(routed, "fabric_address") == (
        "PASS",
        "ibp26s0=172.16.10.5/32, route 172.16.0.0/16",
    )
    assert routed["fabric_route"]["status"] == "PASS"


def test_ipoib_netplan_must_address_the_site_subnet(slice_ns, trees):
    # The file check reads the tree; the namespace only proves the two agree here.
    root = trees["clean"]
    good = parity_in(slice_ns, root, ["ipoib_netplan"], fabric_subnet="172.16.0.0/16")
    assert good["ipoib_netplan"]["status"] == "PASS"
    other = parity_in(slice_ns, root, ["ipoib_netplan"], fabric_subnet="10.200.0.0/16")
    assert other["ipoib_netplan"]["status"] == "FAIL"
    assert "outside the fabric subnet 10.200.0.0/16" in other["ipoib_netplan"]["detail"]


def test_bridge_must_be_an_up_bridge_owning_the_gateway(slice_ns, trees):
    root = trees["clean"]
    slice_ns.add_address("ovsbr0", GATEWAY)
    assert status(parity_in(slice_ns, root, ["bridge"]), "bridge") == (
        "PASS",
        "ovsbr0 (bridge) is up and owns 10.100.0.1/24",
    )

    slice_ns.run(["ip", "link", "set", "ovsbr0", "down"])
    assert status(parity_in(slice_ns, root, ["bridge"]), "bridge") == (
        "FAIL",
        "ovsbr0 (bridge) is down",
    )
    discovered = topology_in(slice_ns, root)
    assert discovered["slice_network"]["bridge_up"] is False
    assert "bridge_down" in hard_codes(discovered)

    # Same name, same address, up, but not a bridge: VMs could never attach to it.
    slice_ns.delete_link("ovsbr0")
    slice_ns.add_dummy("ovsbr0", GATEWAY)
    kind = (
        "dummy"
        if "dummy" in slice_ns.run(["ip", "-d", "link", "show", "ovsbr0"]).stdout
        else "veth"
    )
    impostor = parity_in(slice_ns, root, ["bridge"])
    assert status(impostor, "bridge") == (
        "FAIL",
        f"ovsbr0 is a {kind} link, not a Linux or Open vSwitch bridge",
    )
    discovered = topology_in(slice_ns, root)
    assert discovered["slice_network"]["bridge_present"] is False
    assert "bridge_missing" in hard_codes(discovered)


def start_openvswitch(ns: NetNamespace, rundir: Path) -> dict[str, str]:
    """ovsdb-server and ovs-vswitchd in the namespace, state under `rundir` (OVS_RUNDIR)."""
    env = {"OVS_RUNDIR": str(rundir), "OVS_DBDIR": str(rundir), "OVS_LOGDIR": str(rundir)}
    prefix = ["env", *(f"{k}={v}" for k, v in env.items())]
    subprocess.run(["ovsdb-tool", "create", str(rundir / "conf.db"), str(OVS_SCHEMA)], check=True)
    sock = rundir / "db.sock"
    ns.start_daemon(
        [*prefix, "ovsdb-server", str(rundir / "conf.db"), f"--remote=punix:{sock}"],
        log_path=rundir / "ovsdb-server.out",
    )
    deadline = time.monotonic() + 20
    while not sock.exists():
        if time.monotonic() > deadline:
            pytest.fail("ovsdb-server did not create its socket")
        time.sleep(0.05)
    ns.run([*prefix, "ovs-vsctl", "--no-wait", "init"])
    ns.start_daemon([*prefix, "ovs-vswitchd", f"unix:{sock}"], log_path=rundir / "ovs-vswitchd.out")
    return env


@pytest.mark.slow
def test_userspace_open_vswitch_bridge_is_a_bridge(slice_ns, trees, daemon_dir):
    # The only OVS datapath here: to the kernel the bridge is a tap device; OVS says more.
    if not OVS_SCHEMA.exists():
        pytest.skip("Open vSwitch is not installed")
    root = trees["clean"]
    slice_ns.delete_link("ovsbr0")
    slice_ns.run(["ip", "tuntap", "add", "ovsbr0", "mode", "tap"])
    slice_ns.add_address("ovsbr0", GATEWAY)
    slice_ns.link_up("ovsbr0")
    # A tap of that name that no OVS knows is no bridge.
    assert status(parity_in(slice_ns, root, ["bridge"]), "bridge") == (
        "FAIL",
        "ovsbr0 is a tun link, not a Linux or Open vSwitch bridge",
    )
    slice_ns.delete_link("ovsbr0")

    env = start_openvswitch(slice_ns, daemon_dir)
    slice_ns.run(
        ["env", *(f"{k}={v}" for k, v in env.items()), "ovs-vsctl", "--timeout=20", "add-br",
         "ovsbr0", "--", "set", "bridge", "ovsbr0", "datapath_type=netdev"]
    )  # fmt: skip
    slice_ns.add_address("ovsbr0", GATEWAY)
    slice_ns.link_up("ovsbr0")
    assert status(parity_in(slice_ns, root, ["bridge"], env=env), "bridge") == (
        "PASS",
        "ovsbr0 (openvswitch) is up and owns 10.100.0.1/24",
    )
    discovered = topology_in(slice_ns, root, env=env)
    assert discovered["slice_network"]["bridge_kind"] == "openvswitch"
    assert not {"bridge_missing", "bridge_down"} & hard_codes(discovered)


def hold_udp_port(ns: NetNamespace, port: int):
    """A plain Python process (not dnsmasq) bound to UDP `port` inside the namespace."""
    code = (
        "import socket, sys, time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        f"s.bind(('0.0.0.0', {port}))\n"
        "print('bound', flush=True)\n"
        "time.sleep(600)\n"
    )
    holder = ns.start_daemon([sys.executable, "-c", code])
    deadline = time.monotonic() + 20
    while True:
        listening = ns.run(["cat", "/proc/net/udp"]).stdout
        if f":{port:04X} " in listening:
            return holder
        if time.monotonic() > deadline or not holder.alive():
            pytest.fail(f"the port {port} holder did not bind")
        time.sleep(0.05)


@pytest.mark.slow
def test_dhcp_needs_dnsmasq_itself_on_port_67_serving_the_gpu_subnet(slice_ns, trees, daemon_dir):
    root = trees["clean"]
    slice_ns.add_address("ovsbr0", GATEWAY)

    # dnsmasq with the GPU subnet's range, but its DHCP socket on another port, while some
    # other process owns UDP 67: a presence check saw "dnsmasq + port 67" and passed.
    elsewhere = start_dnsmasq(slice_ns, daemon_dir, extra=("--dhcp-alternate-port=1067,1068",))
    holder = hold_udp_port(slice_ns, 67)
    result = parity_in(slice_ns, root, ["dnsmasq"])["dnsmasq"]
    assert result["status"] == "FAIL"
    assert result["detail"] == (
        f"dnsmasq has a dhcp-range in 10.100.0.0/24 but pid {elsewhere.pid} holds no UDP port "
        "67 socket; port 67 is held by another process"
    )
    slice_ns.stop_daemon(holder)
    slice_ns.stop_daemon(elsewhere)

    # dnsmasq on port 67 for another subnet only.
    other = start_dnsmasq(slice_ns, daemon_dir, dhcp_range="10.100.0.10,10.100.0.17,12h")
    result = parity_in(slice_ns, root, ["dnsmasq"], slice_subnet="10.200.0.0/24")["dnsmasq"]
    assert status({"dnsmasq": result}, "dnsmasq") == (
        "FAIL",
        f"dnsmasq pid {other.pid} has no dhcp-range in 10.200.0.0/24",
    )

    # The same dnsmasq for the GPU subnet it serves: its own socket on 67.
    result = parity_in(slice_ns, root, ["dnsmasq"])["dnsmasq"]
    assert status({"dnsmasq": result}, "dnsmasq") == (
        "PASS",
        f"pid {other.pid} serves 10.100.0.0/24 (dhcp-range 10.100.0.10,10.100.0.17,12h)",
    )
    slice_ns.stop_daemon(other)
    assert parity_in(slice_ns, root, ["dnsmasq"])["dnsmasq"]["status"] == "FAIL"


def wait_for_comm(pid: int, name: str, timeout: float = 30.0) -> None:
    """Until `ip netns exec` (and bash) have exec'd the daemon, its pid has their name: on a
    busy machine the check ran first and saw no historical service."""
    comm = Path(f"/proc/{pid}/comm")
    deadline = time.monotonic() + timeout
    while comm.read_text().strip() != name:
        assert time.monotonic() < deadline, f"pid {pid} is still {comm.read_text().strip()!r}"
        time.sleep(0.05)


def test_historical_service_running_without_systemd_is_reported(slice_ns, trees, daemon_dir):
    root = trees["clean"]  # the current unit is installed, the historical one is not
    pidfiles = {"pidfile_dirs": [str(daemon_dir)], "manager": "direct"}
    check = ["historical_network_service"]
    assert parity_in(slice_ns, root, check, **pidfiles)[check[0]]["status"] == "PASS"

    # The historical script still running (a oneshot that never finished, or a loop).
    script = daemon_dir / HISTORICAL
    script.write_text("#!/bin/sh\nsleep 600\n")
    script.chmod(0o755)
    running = slice_ns.start_daemon([str(script)])
    wait_for_comm(running.pid, HISTORICAL[:15])
    result = parity_in(slice_ns, root, check, **pidfiles)[check[0]]
    assert status({"r": result}, "r") == (
        "WARN",
        f"historical {HISTORICAL} is running (pid {running.pid}); "
        "gpuaas-slice-network-baseline.service is installed",
    )
    assert result["remediation"].startswith(f"stop and disable {HISTORICAL}")
    slice_ns.stop_daemon(running)
    assert parity_in(slice_ns, root, check, **pidfiles)[check[0]]["status"] == "PASS"

    # A daemon the historical service left behind, known only by its pidfile (its argv
    # names something else; its process name is the service's, cut to 15 characters).
    daemon = daemon_dir / "bin" / HISTORICAL
    daemon.parent.mkdir()
    daemon.symlink_to("/bin/sleep")
    left = slice_ns.start_daemon(["bash", "-c", f"exec -a baseline-helper {daemon} 600"])
    wait_for_comm(left.pid, HISTORICAL[:15])
    pidfile = daemon_dir / f"{HISTORICAL}.pid"
    pidfile.write_text(f"{left.pid}\n")
    result = parity_in(slice_ns, root, check, **pidfiles)[check[0]]
    assert result["status"] == "WARN" and f"running (pid {left.pid})" in result["detail"]
    slice_ns.stop_daemon(left)
    # A stale pidfile (its process gone) is not a running service.
    assert parity_in(slice_ns, root, check, **pidfiles)[check[0]]["status"] == "PASS"
