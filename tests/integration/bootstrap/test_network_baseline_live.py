"""The network baseline on a real target with a Linux bridge: the boot script's code path
(the OVS path runs in molecule/slice_network_baseline)."""

from __future__ import annotations

import json

import pytest

from tests.integration.bootstrap.conftest import target_module

pytestmark = [pytest.mark.root, pytest.mark.slow]

SLOTS = [("52:54:00:3f:a2:10", "10.100.0.10"), ("52:54:00:9c:01:7e", "10.100.0.11")]
CONFIG = {
    "baseline": {
        "bridge": "slicebr0",
        "bridge_type": "linux",
        "subnet": "10.100.0.0/24",
        "slot_macs": [mac for mac, _ip in SLOTS],
    },
    "services": {
        "before": [],
        "after": [
            {
                "name": "dnsmasq",
                "direct": {
                    "argv": [
                        "dnsmasq",
                        "--conf-file=/etc/gpuaas/test-dnsmasq.conf",
                        "--pid-file=/run/dnsmasq/dnsmasq.pid",
                    ],
                    "pidfile": "/run/dnsmasq/dnsmasq.pid",
                },
            }
        ],
    },
}
DNSMASQ_CONF = """interface=slicebr0
except-interface=lo
bind-dynamic
port=0
dhcp-range=10.100.0.0,static,255.255.255.0,1h
dhcp-authoritative
dhcp-option=option:router,10.100.0.1
dhcp-hostsfile=/etc/gpuaas/test-hosts
dhcp-leasefile=/run/dnsmasq/leases
"""
MAIN = (
    "from ansible_collections.gpuaas.fleet.plugins.module_utils import network_baseline\n"
    "sys.exit(network_baseline.main(sys.argv[1:]))\n"
)


def baseline(target, *args: str, check: bool = True):
    return target.python(MAIN, "--config", "/etc/gpuaas/test-baseline.json", *args, check=check)


@pytest.fixture(scope="module")
def converged(target):
    target.run("mkdir", "-p", "/etc/gpuaas")
    target.run(
        "sh", "-c", f"cat > /etc/gpuaas/test-baseline.json <<'EOF'\n{json.dumps(CONFIG)}\nEOF"
    )
    target.run("sh", "-c", f"cat > /etc/gpuaas/test-dnsmasq.conf <<'EOF'\n{DNSMASQ_CONF}EOF")
    hosts = "".join(f"{mac},{ip}\n" for mac, ip in SLOTS)
    target.run("sh", "-c", f"printf '{hosts}' > /etc/gpuaas/test-hosts")
    first = baseline(target)
    return target, first.stdout


def test_a_manual_run_converges_and_starts_dnsmasq(converged) -> None:
    target, output = converged
    assert "create Linux bridge slicebr0" in output
    assert "ebtables GPUAAS-SLICE: -s 52:54:00:3f:a2:10 -j DROP" in output
    pid = target.run("cat", "/run/dnsmasq/dnsmasq.pid").stdout.strip()
    assert target.run("cat", f"/proc/{pid}/comm").stdout.strip() == "dnsmasq"


def test_second_run_and_check_change_nothing(converged) -> None:
    target, _output = converged
    assert "0 change(s)" in baseline(target, "--check").stdout
    assert "0 change(s)" in baseline(target, "--no-service-management").stdout


def test_slices_get_leases_and_nat_but_not_each_other(converged) -> None:
    target, _output = converged
    results = target_module.check_network(
        target.state, "slicebr0", "linux", SLOTS, "52:54:00:66:66:66", "10.100.0.0/24"
    )
    failed = [r for r in results if not r["ok"]]
    assert not failed, failed
    checks = {r["check"] for r in results}
    assert {"cross-slice traffic dropped (same L2)", "uplink sees the translated source"} <= checks


def test_a_link_of_another_kind_is_refused_and_kept(converged) -> None:
    target, _output = converged
    target.run("ip", "link", "add", "notabridge", "type", "veth", "peer", "name", "nb-peer")
    config = json.loads(json.dumps(CONFIG))
    config["baseline"]["bridge"] = "notabridge"
    target.run("sh", "-c", f"cat > /etc/gpuaas/refuse.json <<'EOF'\n{json.dumps(config)}\nEOF")
    proc = target.python(MAIN, "--config", "/etc/gpuaas/refuse.json", check=False)
    assert proc.returncode == 1 and "not a Linux bridge" in proc.stdout
    assert target.run("ip", "link", "show", "notabridge", check=False).returncode == 0
