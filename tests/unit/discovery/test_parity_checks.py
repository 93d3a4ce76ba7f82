"""Parity checks that read files under a root, dnsmasq configuration, libvirt sockets, evidence."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs, topology
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import CommandResult

from gpuaas_lab import hosttrees

NOW = datetime.datetime(2026, 4, 24, 10, 30, tzinfo=datetime.UTC)


def run(root, checks, **options):
    options.setdefault("manager", "direct")
    ctx = parity.ParityContext(host=sysfs.HostRoot(str(root)), now=NOW, **options)
    return {r["check"]: r for r in parity.run_checks(ctx, checks)}


def test_host_checks_pass_on_a_prepared_host(host_tree):
    results = run(host_tree("clean", "j22u15"), ["vfio", "kvm", "iommu", "ipoib_netplan"])
    assert {name: r["status"] for name, r in results.items()} == dict.fromkeys(results, "PASS")
    assert results["iommu"]["detail"] == "iommu_groups=96 cmdline_iommu=yes"


def test_host_checks_fail_on_lab_host_j22u05_before_firmware(spec_tree):
    spec = dataclasses.replace(
        hosttrees.clean_host("j22u05"),
        kvm=False,
        iommu_enabled=False,
        vfio_modules=("vfio",),
        ipoib_netplan=False,
    )
    results = run(spec_tree(spec), ["vfio", "kvm", "iommu", "ipoib_netplan"])
    assert all(r["status"] == "FAIL" and r["remediation"] for r in results.values())
    assert results["vfio"]["detail"] == "not loaded: vfio_pci, vfio_iommu_type1"
    assert results["kvm"]["detail"] == "/dev/kvm missing"
    assert results["iommu"]["detail"] == "iommu_groups=0 cmdline_iommu=yes"
    assert results["ipoib_netplan"]["remediation"] == (
        "render /etc/netplan/60-ipoib.yaml from site/profile bootstrap"
    )


# IPoIB netplan: parsed, not just present -----------------------------------------------

NETPLAN = "etc/netplan/60-ipoib.yaml"


@pytest.mark.parametrize(
    ("content", "fabric_subnet", "status", "detail"),
    [
        (
            "network:\n  version: 2\n  ethernets:\n    ibp26s0:\n"
            "      addresses: [172.16.10.5/24]\n",
            "172.16.0.0/16",
            "PASS",
            "/etc/netplan/60-ipoib.yaml configures ibp26s0=172.16.10.5/24",
        ),
        (
            # Renamed by set-name, an address with options (netplan's mapping form).
            "network:\n  ethernets:\n    fabric0:\n      match: {macaddress: 'aa:bb'}\n"
            "      set-name: ibp154s0\n      addresses:\n        - 172.16.20.7/24:\n"
            "            label: fabric\n        - fd00::7/64\n",
            None,
            "PASS",
            "/etc/netplan/60-ipoib.yaml configures ibp154s0=172.16.20.7/24",
        ),
        (
            "network:\n  version: 2\n  ethernets:\n    eno8303:\n      dhcp4: true\n",
            None,
            "FAIL",
            "/etc/netplan/60-ipoib.yaml configures no ibp* interface",
        ),
        (
            "network:\n  ethernets:\n    ibp26s0:\n      dhcp4: false\n",
            None,
            "FAIL",
            "/etc/netplan/60-ipoib.yaml gives no IPv4 address to ibp26s0",
        ),
        (
            "network:\n  ethernets:\n    ibp26s0:\n      addresses: [192.168.50.5/24]\n",
            "172.16.0.0/16",
            "FAIL",
            "/etc/netplan/60-ipoib.yaml addresses ibp26s0=192.168.50.5/24 are outside the "
            "fabric subnet 172.16.0.0/16",
        ),
        ("network: [1, 2\n", None, "FAIL", None),
        ("# only a comment\nversion: 2\n", None, "FAIL", None),
        ("", None, "FAIL", "/etc/netplan/60-ipoib.yaml is empty"),
    ],
)
def test_ipoib_netplan_is_parsed(spec_tree, content, fabric_subnet, status, detail):
    spec = dataclasses.replace(
        hosttrees.clean_host("j22u15"), ipoib_netplan=False, extra_files={NETPLAN: content}
    )
    result = run(spec_tree(spec), ["ipoib_netplan"], fabric_subnet=fabric_subnet)
    result = result["ipoib_netplan"]
    assert result["status"] == status, result
    if detail:
        assert result["detail"] == detail
    if status == "FAIL":
        assert result["remediation"]


def test_netplan_parse_errors_are_specific():
    with pytest.raises(parity.ParityError, match="is not valid YAML"):
        parity.netplan_ipoib("network: [1, 2\n")
    with pytest.raises(parity.ParityError, match="has no network: mapping"):
        parity.netplan_ipoib("- a\n- b\n")
    matched = parity.netplan_ipoib(
        "network:\n  ethernets:\n    ib-any:\n      match: {name: ibp*}\n"
        "      addresses: [172.16.1.1/24, not-an-address]\n"
    )
    assert matched == {"ibp*": ["172.16.1.1/24"]}


@pytest.mark.parametrize("subnet", ["10.100.0.5/24", "slices", "10.100.0.0/33"])
def test_a_bad_slice_subnet_is_refused_by_name(host_tree, subnet):
    with pytest.raises(parity.ParityError, match=f"slice_subnet '{re.escape(subnet)}'"):
        run(host_tree("clean", "j22u15"), ["bridge"], slice_subnet=subnet)


def test_a_bad_fabric_subnet_is_refused(host_tree):
    with pytest.raises(parity.ParityError, match="fabric_subnet 'fabric' is not a network"):
        run(host_tree("clean", "j22u15"), ["ipoib_netplan"], fabric_subnet="fabric")


@pytest.mark.parametrize(
    ("services", "status"),
    [
        ((hosttrees.NETWORK_SERVICE,), "PASS"),
        ((hosttrees.HISTORICAL_NETWORK_SERVICE,), "WARN"),
        ((hosttrees.NETWORK_SERVICE, hosttrees.HISTORICAL_NETWORK_SERVICE), "WARN"),
        ((), "FAIL"),
    ],
)
def test_historical_network_service(spec_tree, services, status, tmp_path):
    spec = dataclasses.replace(hosttrees.clean_host("j22u11"), network_services=services)
    result = run(spec_tree(spec), ["historical_network_service"], pidfile_dirs=(str(tmp_path),))[
        "historical_network_service"
    ]
    assert result["status"] == status


class SystemctlShow:
    """Stand-in for `systemctl show` (no systemd as PID 1 here): unit -> (active, file state)."""

    def __init__(self, units):
        self.units = units
        self.calls = []

    def __call__(self, argv):
        self.calls.append(argv)
        unit = argv[-1]
        if argv[:2] != ["systemctl", "show"]:
            return CommandResult(tuple(argv), 1, "", "unexpected")
        if unit not in self.units:
            return CommandResult(
                tuple(argv),
                0,
                "LoadState=not-found\nActiveState=inactive\nUnitFileState=\nMainPID=0\n",
            )
        active, file_state = self.units[unit]
        return CommandResult(
            tuple(argv),
            0,
            f"LoadState=loaded\nActiveState={active}\nUnitFileState={file_state}\nMainPID=0\n",
        )


CURRENT_UNIT = f"{hosttrees.NETWORK_SERVICE}.service"
HISTORICAL_UNIT = f"{hosttrees.HISTORICAL_NETWORK_SERVICE}.service"


@pytest.mark.parametrize(
    ("units", "status", "detail"),
    [
        (
            {CURRENT_UNIT: ("active", "enabled")},
            "PASS",
            f"{CURRENT_UNIT} installed and enabled",
        ),
        (
            {CURRENT_UNIT: ("active", "disabled")},
            "WARN",
            f"{CURRENT_UNIT} is installed but not enabled at boot (UnitFileState=disabled)",
        ),
        (
            # The unit file is gone but systemd still runs and enables the historical unit.
            {CURRENT_UNIT: ("active", "enabled"), HISTORICAL_UNIT: ("active", "enabled")},
            "WARN",
            f"historical {hosttrees.HISTORICAL_NETWORK_SERVICE} is active and enabled; "
            f"{CURRENT_UNIT} is installed",
        ),
        (
            {CURRENT_UNIT: ("active", "enabled"), HISTORICAL_UNIT: ("inactive", "enabled")},
            "WARN",
            f"historical {hosttrees.HISTORICAL_NETWORK_SERVICE} is enabled; "
            f"{CURRENT_UNIT} is installed",
        ),
        (
            {CURRENT_UNIT: ("active", "enabled"), HISTORICAL_UNIT: ("inactive", "disabled")},
            "PASS",
            None,
        ),
    ],
)
def test_historical_network_service_under_systemd(spec_tree, units, status, detail):
    spec = hosttrees.clean_host("j22u11")
    systemctl = SystemctlShow(units)
    result = run(
        spec_tree(spec), ["historical_network_service"], manager="systemd", runner=systemctl
    )["historical_network_service"]
    assert result["status"] == status, result
    if detail:
        assert result["detail"] == detail
    assert all(call[:2] == ["systemctl", "show"] for call in systemctl.calls)


def test_historical_service_state_unreadable_is_a_warning(spec_tree):
    def broken(argv):
        return CommandResult(tuple(argv), 1, "", "Failed to connect to bus")

    result = run(
        spec_tree(hosttrees.clean_host("j22u11")),
        ["historical_network_service"],
        manager="systemd",
        runner=broken,
    )["historical_network_service"]
    assert result["status"] == "WARN" and "Failed to connect to bus" in result["detail"]


def test_service_command_lines():
    name = hosttrees.HISTORICAL_NETWORK_SERVICE
    assert parity._runs_service(["/bin/sh", f"/usr/local/sbin/{name}"], name)
    assert parity._runs_service(["bash", "-e", f"/usr/local/sbin/{name}.sh"], name)
    assert parity._runs_service([f"/usr/local/sbin/{name}", "--once"], name)
    assert not parity._runs_service(["vim", "/etc/motd", f"/usr/local/sbin/{name}"], name)
    assert not parity._runs_service(
        ["/bin/sh", "/usr/local/sbin/gpuaas-slice-network-baseline"], name
    )


def evidence(minutes_old, blockers=()):
    stamp = NOW - datetime.timedelta(minutes=minutes_old)
    return {"collected_at": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"), "blockers": list(blockers)}


@pytest.mark.parametrize(
    ("topology_evidence", "status", "detail"),
    [
        (None, "WARN", "no control-plane topology evidence given; local checks only"),
        (evidence(5), "PASS", "completed with no hard blockers (300s old)"),
        (
            evidence(5, [{"code": "tmfifo_missing", "severity": "advisory"}]),
            "PASS",
            "completed with no hard blockers (300s old)",
        ),
        # Older evidence without severities: codes known to be advisory do not fail.
        (evidence(5, [{"code": "tmfifo_missing"}]), "PASS", None),
        (evidence(25 * 60), "FAIL", "topology evidence is 90000s old (max 86400s)"),
        (
            evidence(-30),
            "FAIL",
            "topology evidence is dated 1800s in the future (2026-04-24T11:00:00Z)",
        ),
        (
            evidence(5, [{"code": "nat_missing", "severity": "hard"}]),
            "FAIL",
            "1 hard blockers: nat_missing",
        ),
        ({"collected_at": "yesterday", "blockers": []}, "FAIL", None),
    ],
)
def test_api_topology(host_tree, topology_evidence, status, detail):
    result = run(
        host_tree("clean", "j22u15"), ["api_topology"], topology_evidence=topology_evidence
    )["api_topology"]
    assert result["status"] == status
    if detail:
        assert result["detail"] == detail


def stamp(minutes_old):
    return (NOW - datetime.timedelta(minutes=minutes_old)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    ("options", "status", "detail"),
    [
        (
            {"topology_collected_at": stamp(60)},
            "PASS",
            "completed with no hard blockers (3600s old)",
        ),
        (
            {"topology_collected_at": stamp(25 * 60)},
            "FAIL",
            "topology evidence is 90000s old (max 86400s)",
        ),
        (
            {"topology_collected_at": stamp(90), "max_age_seconds": 3600},
            "FAIL",
            "topology evidence is 5400s old (max 3600s)",
        ),
        (
            {"topology_collected_at": ""},
            "FAIL",
            "the control plane holds no topology evidence for this node",
        ),
        (
            {
                "topology_collected_at": stamp(5),
                "topology_blockers": [{"code": "nat_missing", "severity": "hard"}],
            },
            "FAIL",
            "1 hard blockers: nat_missing",
        ),
        (
            # A map from this run wins over the stored timestamp.
            {"topology_collected_at": stamp(25 * 60), "topology_evidence": evidence(1)},
            "PASS",
            "completed with no hard blockers (60s old)",
        ),
    ],
)
def test_api_topology_from_stored_control_plane_evidence(host_tree, options, status, detail):
    result = run(host_tree("clean", "j22u15"), ["api_topology"], **options)["api_topology"]
    assert (result["status"], result["detail"]) == (status, detail)
    if status == "FAIL" and "blockers" not in detail:
        assert result["remediation"].startswith("run discover-topology")


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(86400, 86400), ("3600", 3600), ("90s", 90), ("15m", 900), ("24h", 86400), ("7D", 604800)],
)
def test_parse_duration(value, seconds):
    assert parity.parse_duration(value) == seconds


@pytest.mark.parametrize("value", ["", "0", "-5m", "1.5h", "24 hours", "h", "1w"])
def test_parse_duration_refuses_anything_else(value):
    with pytest.raises(parity.ParityError, match="not a positive duration"):
        parity.parse_duration(value)


def test_api_topology_accepts_a_discovery_map(host_tree, discover_offline):
    topology_map = discover_offline(host_tree("h200"))
    result = run(host_tree("h200"), ["api_topology"], topology_evidence=topology_map)
    assert result["api_topology"]["status"] == "FAIL"
    assert "mounted_child_partition" in result["api_topology"]["detail"]


def test_unknown_checks_are_refused(host_tree):
    with pytest.raises(parity.ParityError, match="unknown checks: bogus"):
        run(host_tree("clean", "j22u15"), ["kvm", "bogus"])


def test_checks_run_in_the_parity_target_order(host_tree):
    results = run(host_tree("clean", "j22u15"), ["api_topology", "kvm", "vfio"])
    assert list(results) == ["vfio", "kvm", "api_topology"]


# dnsmasq configuration --------------------------------------------------------------


def test_dnsmasq_ranges_from_command_line_and_config_files(tmp_path):
    (tmp_path / "etc/dnsmasq.d").mkdir(parents=True)
    (tmp_path / "etc/dnsmasq.conf").write_text("# default\nconf-dir=/etc/dnsmasq.d/,*.conf\n")
    (tmp_path / "etc/dnsmasq.d/gpuaas.conf").write_text(
        "interface=ovsbr0\ndhcp-range=set:gpu,10.100.0.10,10.100.0.17,255.255.255.0,12h\n"
    )
    (tmp_path / "etc/dnsmasq.d/other.conf.bak").write_text("dhcp-range=192.0.2.10,192.0.2.20\n")
    argv = ["dnsmasq", "--dhcp-range=172.16.0.10,172.16.0.20", "-F", "198.51.100.5,static"]
    ranges = parity.dnsmasq_ranges(argv, str(tmp_path))
    assert ranges == [
        "172.16.0.10,172.16.0.20",
        "198.51.100.5,static",
        "set:gpu,10.100.0.10,10.100.0.17,255.255.255.0,12h",
    ]
    assert [parity.range_in_subnet(r, "10.100.0.0/24") for r in ranges] == [False, False, True]


def test_dnsmasq_explicit_conf_file_replaces_the_default(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/dnsmasq.conf").write_text("dhcp-range=10.100.0.10,10.100.0.17\n")
    (tmp_path / "slice.conf").write_text("dhcp-range=10.200.0.10,10.200.0.17\n")
    ranges = parity.dnsmasq_ranges(["dnsmasq", "-C", "/slice.conf"], str(tmp_path))
    assert ranges == ["10.200.0.10,10.200.0.17"]
    assert parity.dnsmasq_ranges(["dnsmasq", "--conf-file=/dev/null"], str(tmp_path)) == []


def test_dnsmasq_processes_only_in_this_network_namespace(tmp_path):
    """A /proc with dnsmasq in our namespace, dnsmasq in another, another daemon, and a
    dnsmasq that already exited (no argv): only the first is ours."""
    proc = tmp_path / "proc"
    own_ns = proc / "self/ns/net"
    own_ns.parent.mkdir(parents=True)
    own_ns.write_text("")
    other_ns = tmp_path / "other-ns"
    other_ns.write_text("")

    def process(pid: int, comm: str, argv: list[str], netns: Path) -> None:
        (proc / str(pid) / "ns").mkdir(parents=True)
        (proc / str(pid) / "ns/net").symlink_to(netns)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        (proc / str(pid) / "cmdline").write_text("\0".join(argv) + ("\0" if argv else ""))

    process(1200, "dnsmasq", ["/usr/sbin/dnsmasq", "--conf-file=/etc/slice.conf"], own_ns)
    process(87, "dnsmasq", ["dnsmasq", "--dhcp-range=192.0.2.10,192.0.2.20"], other_ns)
    process(300, "sshd", ["sshd", "-D"], own_ns)
    process(400, "dnsmasq", [], own_ns)
    assert parity.dnsmasq_processes(str(proc)) == [
        (1200, ["/usr/sbin/dnsmasq", "--conf-file=/etc/slice.conf"])
    ]


# libvirt: the check's boundary is "a daemon accepts on its socket" --------------------


def test_libvirt_socket_that_accepts_passes_and_a_dead_one_fails(tmp_path, host_tree):
    path = tmp_path / "libvirt-sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(1)
    root = host_tree("clean", "j22u15")
    try:
        result = run(root, ["libvirt"], libvirt_sockets=(str(tmp_path / "nope"), str(path)))
        assert result["libvirt"]["status"] == "PASS"
        assert result["libvirt"]["detail"] == f"{path} accepts connections"
    finally:
        listener.close()
    result = run(root, ["libvirt"], libvirt_sockets=(str(path),))
    assert result["libvirt"]["status"] == "FAIL"
    assert "Connection refused" in result["libvirt"]["detail"]


def test_udp_sockets_are_traced_to_the_process_holding_them():
    probe = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket,sys; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM);"
            "s.bind(('127.0.0.1', 0)); print(s.getsockname()[1]); sys.stdout.flush();"
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(probe.stdout.readline())
        listening = parity.udp_port_inodes(port, pid=probe.pid)
        assert len(listening) == 1
        assert listening <= parity.socket_inodes(probe.pid)
        assert not listening & parity.socket_inodes(os.getpid())
    finally:
        probe.stdin.close()
        probe.wait(timeout=10)


# checks over collected network evidence ---------------------------------------------


def evidence_from(**overrides):
    """Evidence as netstate.collect returns it for a fully prepared slice host."""
    base = {
        "bridge_link": True,
        "bridge_present": True,
        "bridge_kind": "openvswitch",
        "bridge_up": True,
        "bridge_owns_gateway": True,
        "gateway": "10.100.0.1/24",
        "subnet": "10.100.0.0/24",
        "nat_masquerade": True,
        "nat_rule": "-A POSTROUTING -s 10.100.0.0/24 -j MASQUERADE",
        "tmfifo_present": True,
        "tmfifo_ipv4": "192.168.100.1/30",
        "interfaces": {
            "ovsbr0": {"kind": "openvswitch", "up": True, "ipv4": ["10.100.0.1/24"]},
            "ibp26s0": {"kind": None, "up": True, "ipv4": ["172.16.10.5/24"]},
        },
        "routes": [{"dst": "172.16.10.0/24", "dev": "ibp26s0"}],
        "errors": [],
    }
    base.update(overrides)
    base.setdefault("bridge", "ovsbr0")
    base.setdefault("bridge_addresses", base["interfaces"].get("ovsbr0", {}).get("ipv4", []))
    return base


NETWORK_ONLY = ["fabric_address", "fabric_route", "bridge", "nat", "tmfifo"]


def run_with(root, evidence, **options):
    ctx = parity.ParityContext(host=sysfs.HostRoot(str(root)), evidence=evidence, **options)
    return {r["check"]: r for r in parity.run_checks(ctx, NETWORK_ONLY)}


def test_network_checks_pass_on_prepared_evidence(host_tree):
    results = run_with(host_tree("clean", "j22u15"), evidence_from())
    assert {c: r["status"] for c, r in results.items()} == dict.fromkeys(NETWORK_ONLY, "PASS")
    assert results["fabric_address"]["detail"] == "ibp26s0=172.16.10.5/24, route 172.16.10.0/24"
    assert results["bridge"]["detail"] == "ovsbr0 (openvswitch) is up and owns 10.100.0.1/24"


def test_network_checks_fail_on_lab_host_j22u11(host_tree):
    # The custom image: no IPoIB address or route, bridge without its address, no NAT.
    evidence = evidence_from(
        bridge_owns_gateway=False,
        nat_masquerade=False,
        nat_rule=None,
        tmfifo_present=False,
        tmfifo_ipv4=None,
        interfaces={
            "ovsbr0": {"kind": "openvswitch", "up": True, "ipv4": []},
            "ibp26s0": {"kind": None, "up": False, "ipv4": []},
        },
        routes=[{"dst": "default", "dev": "eno8303"}],
    )
    results = run_with(host_tree("clean", "j22u11"), evidence)
    assert {c: r["status"] for c, r in results.items()} == {
        "fabric_address": "FAIL",
        "fabric_route": "FAIL",
        "bridge": "FAIL",
        "nat": "FAIL",
        "tmfifo": "WARN",
    }
    assert results["fabric_address"]["detail"] == "ibp* interfaces without IPv4: ibp26s0"
    assert results["bridge"]["detail"] == "ovsbr0 does not own 10.100.0.1/24 (has: none)"
    assert results["tmfifo"]["detail"].startswith("tmfifo_net0 is absent")


def test_fabric_route_for_a_configured_site_subnet(host_tree):
    root = host_tree("clean", "j22u15")
    wanted = run_with(root, evidence_from(), fabric_subnet="172.16.0.0/16")["fabric_route"]
    assert wanted["status"] == "FAIL" and "for 172.16.0.0/16" in wanted["detail"]
    routes = [{"dst": "172.16.0.0/16", "dev": "ibp26s0", "gateway": "172.16.10.254"}]
    found = run_with(root, evidence_from(routes=routes), fabric_subnet="172.16.0.0/16")
    assert found["fabric_route"]["status"] == "PASS"


@pytest.mark.parametrize(
    ("overrides", "detail"),
    [
        (
            {"bridge_link": False, "bridge_present": False, "bridge_kind": None},
            "ovsbr0 does not exist",
        ),
        (
            {"bridge_present": False, "bridge_kind": "dummy"},
            "ovsbr0 is a dummy link, not a Linux or Open vSwitch bridge",
        ),
        ({"bridge_up": False}, "ovsbr0 (openvswitch) is down"),
    ],
)
def test_bridge_must_be_an_up_bridge(host_tree, overrides, detail):
    result = run_with(host_tree("clean", "j22u15"), evidence_from(**overrides))["bridge"]
    assert (result["status"], result["detail"]) == ("FAIL", detail)
    assert result["remediation"]


@pytest.mark.parametrize(
    ("options", "overrides", "status", "detail"),
    [
        (
            {"fabric_subnet": "172.16.0.0/16"},
            {},
            "PASS",
            "ibp26s0=172.16.10.5/24, route 172.16.10.0/24",
        ),
        (
            {"fabric_subnet": "10.200.0.0/16"},
            {},
            "FAIL",
            "no ibp* address in 10.200.0.0/16 (has: ibp26s0=172.16.10.5/24)",
        ),
        (
            {},
            {"routes": []},
            "FAIL",
            "ibp26s0 owns 172.16.10.5/24 but has no route that reaches it",
        ),
        (
            {},
            {"routes": [{"dst": "172.16.10.0/24", "dev": "eno8303"}]},
            "FAIL",
            "ibp26s0 owns 172.16.10.5/24 but has no route that reaches it",
        ),
        (
            {},
            {"interfaces": {"ibp26s0": {"kind": None, "up": False, "ipv4": ["172.16.10.5/24"]}}},
            "FAIL",
            "ibp26s0 owns 172.16.10.5/24 but is down",
        ),
    ],
)
def test_fabric_address_in_the_site_subnet_with_a_route(
    host_tree, options, overrides, status, detail
):
    evidence = evidence_from(**overrides)
    result = run_with(host_tree("clean", "j22u15"), evidence, **options)["fabric_address"]
    assert (result["status"], result["detail"]) == (status, detail)


def test_kvm_on_a_live_root_is_probed_not_just_listed():
    usable, detail = sysfs.kvm_state(sysfs.HostRoot("/"))
    if not os.path.exists("/dev/kvm"):
        assert (usable, detail) == (False, "/dev/kvm missing")
    elif usable:
        assert detail == "/dev/kvm answers (API version 12)"
    else:
        assert detail.startswith(("/dev/kvm cannot be opened", "/dev/kvm does not answer"))


# discovery in the same module run (parity.check_host) ---------------------------------

DISCOVER_OPTIONS = {
    "node": "j22u15",
    "network_mode": "private-nat",
    "collect_network": True,
    "fabric_link_layer": "InfiniBand",
}


def no_commands(argv):
    raise AssertionError(f"ran {argv}: nothing was to be read")


def recorded_network():
    """Recorded commands of a prepared slice bridge (`ip -j`, iptables-save), and the
    commands asked."""
    calls = []
    bridge = {
        "ifname": "ovsbr0",
        "flags": ["BROADCAST", "UP"],
        "linkinfo": {"info_kind": "bridge"},
        "addr_info": [{"family": "inet", "local": "10.100.0.1", "prefixlen": 24}],
    }
    saved = "*nat\n-A POSTROUTING -s 10.100.0.0/24 -j MASQUERADE\nCOMMIT\n"

    def runner(argv):
        calls.append(tuple(argv))
        if argv[:3] == ["ip", "-d", "-j"]:
            return CommandResult(tuple(argv), 0, json.dumps([bridge]))
        if argv[0] == "ip":
            return CommandResult(tuple(argv), 0, "[]")
        if argv[0] == "iptables-save":
            return CommandResult(tuple(argv), 0, saved)
        return CommandResult(tuple(argv), 2)

    return runner, calls


def test_parity_judges_the_topology_it_discovers(host_tree):
    root = host_tree("clean", "j22u15")
    runner, calls = recorded_network()
    ctx = parity.ParityContext(
        host=sysfs.HostRoot(str(root)),
        runner=runner,
        # Stale evidence handed in: the map discovered in this run takes its place.
        topology_evidence={"collected_at": "2020-01-01T00:00:00Z", "blockers": []},
    )
    output = parity.check_host(ctx, ["api_topology", "bridge", "nat"], DISCOVER_OPTIONS)
    # The live network state was read once, for the discovery and the checks both.
    assert calls and len(calls) == len(set(calls)), calls
    expected = topology.discover(str(root), runner=recorded_network()[0], **DISCOVER_OPTIONS)
    discovered = output["topology"]
    assert discovered.pop("collected_at") and expected.pop("collected_at")
    assert discovered == expected
    assert discovered["slice_network"]["bridge_owns_gateway"] is True
    results = {r["check"]: r for r in output["results"]}
    assert results["bridge"]["status"] == results["nat"]["status"] == "PASS", output
    # Judged by the map just discovered (its hard blockers, if this machine's forwarding
    # is off, say), not by the stale one handed in.
    hard = [b["code"] for b in topology.hard_blockers(discovered)]
    api = results["api_topology"]
    assert api["status"] == ("FAIL" if hard else "PASS"), api
    assert all(code in api["detail"] for code in hard) and "old" not in api["detail"]
    assert output["changed"] is False

    without = parity.check_host(ctx, ["api_topology"])
    assert "topology" not in without
    [stale] = without["results"]
    assert stale["status"] == "FAIL" and "old" in stale["detail"], stale


def test_parity_fails_on_the_hard_blockers_it_discovers(host_tree):
    # No VFs on the fabric PFs: discovery reports hard blockers, api_topology fails.
    ctx = parity.ParityContext(
        host=sysfs.HostRoot(str(host_tree("missing-vfs", "j22u15"))),
        runner=recorded_network()[0],
    )
    output = parity.check_host(ctx, ["api_topology"], DISCOVER_OPTIONS)
    hard = [b["code"] for b in topology.hard_blockers(output["topology"])]
    assert hard
    [api] = output["results"]
    assert api["status"] == "FAIL" and hard[0] in api["detail"], api


def test_a_discovery_that_cannot_read_the_host_checks_nothing(tmp_path):
    ctx = parity.ParityContext(host=sysfs.HostRoot(str(tmp_path)), runner=no_commands)
    with pytest.raises(topology.TopologyError, match="no sys/ directory"):
        parity.check_host(ctx, None, {**DISCOVER_OPTIONS, "collect_network": False})


def test_bad_input_is_refused_before_discovery_reads_anything(host_tree):
    ctx = parity.ParityContext(
        host=sysfs.HostRoot(str(host_tree("clean", "j22u15"))),
        slice_subnet="10.100.0.0/33",
        runner=no_commands,
    )
    with pytest.raises(
        parity.ParityError, match=re.escape("slice_subnet '10.100.0.0/33' is not a network")
    ):
        parity.check_host(ctx, None, DISCOVER_OPTIONS)
    good = dataclasses.replace(ctx, slice_subnet="10.100.0.0/24")
    with pytest.raises(parity.ParityError, match="nosuchcheck"):
        parity.check_host(good, ["nosuchcheck"], DISCOVER_OPTIONS)
