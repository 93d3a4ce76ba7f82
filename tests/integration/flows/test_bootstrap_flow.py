"""The bootstrap_host flow through the control-plane inventory, on an isolated target (a
network namespace plus a copy-on-write mount namespace, tests/integration/bootstrap): the
store supplies the profile, subnet, bridge, approved reservations and VFIO devices."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.services.inventory import NodeSpec
from flows.fleet import bootstrap_host
from gpuaas_lab.demo import recorded_map
from tests.integration.bootstrap.conftest import (
    CANNOT_PASS,
    GRUB,
    SLICE_MACHINE_VARS,
    Target,
    target_module,
    target_unavailable_reason,
)

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

HOSTSFILE = "/var/lib/gpuaas/dnsmasq/slice-hosts"


def module_args(artifact_dir: str, action: str) -> dict:
    """What the run passed to ``action``, from the runner's kept job events."""
    for event_file in sorted(Path(artifact_dir, "job_events").glob("*.json")):
        event = json.loads(event_file.read_text())
        data = event.get("event_data") or {}
        if event.get("event") == "runner_on_ok" and data.get("resolved_action") == action:
            return data["res"]["invocation"]["module_args"]
    raise AssertionError(f"{action} did not run")


def rows(engine, sql, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    reason = target_unavailable_reason()
    if reason:
        pytest.skip(reason)
    state_dir = tmp_path_factory.mktemp("bootstrap-flow-target")
    try:
        built = Target(target_module.create(state_dir, tmfifo=True))
        built.run("sh", "-c", f"mkdir -p /etc/default && printf '{GRUB}' > /etc/default/grub")
        yield built
    finally:
        errors = target_module.destroy(state_dir)
        assert not errors, errors


@pytest.fixture
def control_plane(target, tmp_path, database_url, monkeypatch, prefect_harness):
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    return ControlPlane.from_environment()


def register(cp: ControlPlane, target: Target, hostname: str, tags: tuple[str, ...]) -> None:
    cp.register_node(
        NodeSpec(
            hostname,
            "region-maas-1",
            maas_tags=tags,
            slice_subnet="10.100.0.0/24",
            host_vars={
                "ansible_connection": "local",
                "ansible_python_interpreter": target.state["python"],
            },
        )
    )


def test_a_node_without_a_profile_is_refused_before_anything_changes(target, control_plane, engine):
    register(control_plane, target, "j22u16", ())
    state = bootstrap_host("j22u16", SLICE_MACHINE_VARS, return_state=True)
    assert state.is_failed()
    assert "j22u16 needs exactly one profile" in state.message
    (task_state, error, output), *_ = rows(
        engine,
        "SELECT state, error, output FROM node_tasks WHERE kind = 'host.bootstrap'",
    )
    assert task_state == "failed" and "found []" in error
    ran = [t["task"] for t in output["tasks"]]
    assert ran == [
        "Work out the profile from the explicit setting, MAAS tags or inventory groups",
        "Refuse hosts without exactly one known profile",
    ]
    assert not any(t["changed"] for t in output["tasks"])
    node = {n.hostname: n for n in control_plane.list_nodes()}["j22u16"]
    assert node.admin_state == "unavailable"
    assert node.admin_state_reason.startswith("parity: run_failed (")


def test_bootstrap_takes_profile_network_and_approved_slots_from_the_store(
    target, control_plane, engine
):
    register(control_plane, target, "j22u15", ("gpuaas-profile-slice-vm",))
    # Collected now: parity's freshness check reads its time from the inventory.
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    document = {**recorded_map("j22u15"), "collected_at": now}
    control_plane.import_topology("j22u15", document, "test")
    control_plane.approve_slots("j22u15", [0, 1, 2], "test")
    control_plane.disable_slot("j22u15", 1, "riser under investigation", "test")

    # Only this machine's settings are passed: profile, subnet, bridge and reservations
    # come from the store through the inventory.
    verdict = bootstrap_host("j22u15", SLICE_MACHINE_VARS)

    slots = {s["slot_index"]: s for s in document["candidate_slots"]}
    served = target.run("cat", HOSTSFILE).stdout.splitlines()
    assert [line for line in served if not line.startswith("#")] == [
        f"{slots[i]['mac_address']},{slots[i]['private_ip']},j22u15-slot{i}" for i in (0, 2)
    ]
    bridge = target.run("ip", "-4", "-o", "addr", "show", "dev", "ovsbr0").stdout
    assert "10.100.0.1/24" in bridge

    (task_state, parameters, output, artifact_dir), *_ = rows(
        engine,
        "SELECT state, parameters, output, artifact_dir FROM node_tasks"
        " WHERE kind = 'host.bootstrap'",
    )
    assert task_state == "succeeded"
    assert parameters == {**SLICE_MACHINE_VARS, "slice_host_bootstrap_allow_reboot": False}
    vfio = module_args(artifact_dir, "gpuaas.fleet.vfio_binding")
    assert vfio["devices"] == sorted(
        address
        for i in (0, 2)
        for address in (slots[i]["gpu_pci_address"], slots[i]["fabric_vf_pci_address"])
    )
    assert vfio["manage_overrides"] is False
    checks = {r["check"]: r["status"] for r in output["result"]["results"]}
    assert {c for c, s in checks.items() if s == "FAIL"} == CANNOT_PASS
    assert checks["bridge"] == checks["dnsmasq"] == checks["nat"] == "PASS"
    assert checks["api_topology"] == "PASS"

    assert verdict["node"] == "j22u15" and verdict["admin state"] == "unavailable"
    assert set(verdict["failed checks"].split(", ")) == CANNOT_PASS
    node = {n.hostname: n for n in control_plane.list_nodes()}["j22u15"]
    assert node.admin_state_reason == "parity: " + ", ".join(sorted(CANNOT_PASS))

    # The bootstrap created the node's evidence signing key, root only, and the flow pinned
    # its public half (docs/trust.md, "Signed evidence").
    mode = target.run("stat", "-c", "%a %U", "/etc/gpuaas/evidence-signing.key").stdout.split()
    assert mode == ["600", "root"]
    [signing] = [k for k in control_plane.host_keys("j22u15") if k.purpose == "evidence_signing"]
    assert (signing.key_type, signing.source) == ("ssh-ed25519", "bootstrap")
    reported = target.python(
        "from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing\n"
        "print(evidence_signing.ensure_key('/etc/gpuaas/evidence-signing.key', True)"
        "['fingerprint'])"
    ).stdout.strip()
    assert signing.fingerprint == reported
    # The pin is the flow run's, in the audit trail (docs/operations.md, "Audit trail").
    [(actor, run_id)] = rows(
        engine,
        "SELECT e.recorded_by, t.flow_run_id FROM evidence e, node_tasks t"
        " WHERE e.kind = 'operator_action' AND e.payload->>'action' = 'node.pin_keys'"
        " AND e.summary LIKE '%j22u15%' AND t.kind = 'host.bootstrap'",
    )
    assert actor == f"flow:bootstrap_host/{run_id}"
