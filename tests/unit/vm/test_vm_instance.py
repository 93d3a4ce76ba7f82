"""slice_vm_domain's seed and reservation parts (vm_instance) on temporary files and
libvirt's own test driver (test:///default: real libvirt, no hypervisor)."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_dhcp, vm_instance
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError

ALLOCATION = "158ea147-0115-407f-bbd5-1850c32b9517"
MAC = "52:54:00:3f:a2:10"
TENANT_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDaDZktS536XWaxw7nhGAmShgTktoeDSYVAU/Mv9MLQe alice@laptop"
)


def params(tmp_path: Path, state: str = "running", **overrides) -> dict:
    values = {
        "allocation_id": ALLOCATION,
        "state": state,
        "slots": [
            {
                "gpu_pci_address": "0000:17:00.0",
                "fabric_vf_pci_address": "0000:18:00.1",
                "nvme_device": "/dev/nvme1n1",
                "numa_node": None,
            }
        ],
        "profile": {
            "vcpus": 2,
            "memory_mib": 1024,
            "hugepages": False,
            "hugepage_size_kib": 1048576,
            "bandwidth": None,
        },
        "mac_address": MAC,
        "bridge": "br-slice",
        "bridge_type": "linux",
        "seed_iso": None,
        "seed": {
            "path": str(tmp_path / "slice" / "seed.iso"),
            "hostname": "slice-1",
            "users": [
                {"name": "gpuuser", "ssh_authorized_keys": [TENANT_KEY], "shell": "/bin/bash"}
            ],
            "terminal_key_path": str(tmp_path / "terminal" / "id_ed25519"),
            "host_private_key": None,
            "host_public_key": None,
        },
        "reservation": {
            "ip_address": "10.100.0.10",
            "hostname": "slice-1",
            "hostsfile": str(tmp_path / "hosts"),
            "leasefile": str(tmp_path / "leases"),
            "pidfile": str(tmp_path / "dnsmasq.pid"),
            "interface": None,
            "release_timeout": 1.0,
        },
        "console_log": None,
        "emulation": True,
        "pci_passthrough": False,
        "shutdown_timeout": 5,
        "undefine_attempts": 2,
        "undefine_retry_delay": 0.1,
        "libvirt_uri": "test:///default",
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(values.get(key), dict):
            values[key] = dict(values[key], **value)
        else:
            values[key] = value
    return values


def test_check_mode_reports_every_part_in_order_and_writes_nothing(tmp_path: Path):
    result = vm_instance.run(params(tmp_path), check_mode=True)
    assert result["changed"] and result["actions"] == ["define", "start"]
    assert result["seed"]["changed"] and result["seed"]["terminal_key"]["created"]
    assert result["reservation"]["added"] == [f"{MAC},10.100.0.10,slice-1"]
    assert result["seed"]["finished_at"] <= result["reservation"]["finished_at"]
    seed_diff, reservation_diff, domain_diff = result["diff"]
    assert seed_diff["after_header"] == str(tmp_path / "slice" / "seed.iso")
    assert reservation_diff["after"] == f"{MAC},10.100.0.10,slice-1\n"
    assert domain_diff["after"]["state"] == "running"
    assert "diff" not in result["seed"] and "diff" not in result["reservation"]
    assert list(tmp_path.iterdir()) == []


def test_the_seed_written_is_the_one_the_domain_attaches(tmp_path: Path):
    wanted = params(tmp_path)
    assert vm_instance.domain_params(wanted)["seed_iso"] == wanted["seed"]["path"]
    result = vm_instance.run(wanted, check_mode=True)
    assert f'<source file="{wanted["seed"]["path"]}"/>' in result["xml"]


def test_without_parts_the_result_is_the_domain_alone(tmp_path: Path):
    result = vm_instance.run(params(tmp_path, seed=None, reservation=None), check_mode=True)
    assert "seed" not in result and "reservation" not in result
    assert result["diff"]["after"]["state"] == "running"


def test_absent_removes_the_reservation_after_the_domain(tmp_path: Path):
    present = vm_instance.reservation_params(params(tmp_path), "present")
    assert vm_dhcp.run(present, check_mode=False)["changed"]
    (tmp_path / "hosts").write_text(
        (tmp_path / "hosts").read_text() + "52:54:00:00:00:01,10.100.0.99\n"
    )
    result = vm_instance.run(params(tmp_path, state="absent"), check_mode=False)
    assert result["changed"] and result["actions"] == []
    assert "seed" not in result
    domain_diff, reservation_diff = result["diff"]
    assert domain_diff["after"] == {"state": "absent"}
    assert MAC in reservation_diff["before"] and MAC not in reservation_diff["after"]
    assert (tmp_path / "hosts").read_text() == "52:54:00:00:00:01,10.100.0.99\n"
    again = vm_instance.run(params(tmp_path, state="absent"), check_mode=False)
    assert not again["changed"]


@pytest.mark.parametrize(
    "bad, code",
    [
        ({"reservation": {"ip_address": "10.100.0.300"}}, "invalid_ip"),
        ({"reservation": {"hostname": "a,b"}}, "invalid_hostname"),
        ({"seed": {"hostname": "not a host"}}, "invalid_hostname"),
        ({"seed": {"users": [{"name": "Bad User", "ssh_authorized_keys": []}]}}, "invalid_user"),
        (
            {
                "seed": {
                    "users": [{"name": "u", "ssh_authorized_keys": []}],
                    "terminal_key_path": None,
                }
            },
            "no_ssh_keys",
        ),
        ({"profile": {"vcpus": 0}}, None),
        ({"mac_address": "52:54:00:3f:a2"}, "invalid_mac"),
    ],
)
def test_bad_input_in_any_part_changes_nothing(tmp_path: Path, bad, code):
    with pytest.raises(VmError) as caught:
        vm_instance.run(params(tmp_path, **bad), check_mode=False)
    if code:
        assert caught.value.code == code
    assert list(tmp_path.iterdir()) == []


def test_a_part_that_fails_stops_the_rest_and_the_finished_ones_are_reported(tmp_path: Path):
    # libvirt's test driver reading a definition file that is not there: the domain part
    # fails after the seed and the reservation were written.
    unreachable = f"test://{tmp_path / 'no-such-node.xml'}"
    with pytest.raises(VmError) as caught:
        vm_instance.run(params(tmp_path, libvirt_uri=unreachable), check_mode=False)
    assert caught.value.phase == "domain"
    finished = caught.value.details
    assert finished["seed"]["changed"] and Path(finished["seed"]["path"]).exists()
    assert finished["reservation"]["added"] == [f"{MAC},10.100.0.10,slice-1"]
    assert "diff" in finished["seed"]
