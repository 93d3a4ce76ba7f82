"""A small lab fleet (gpuaas_lab.sshfleet): hosts reached over real SSH as the deploy user,
root through sudo, each under the host key the store pins, swept by the discovery and
parity flows; ``down`` leaves nothing behind. The three-worker sweeps over hundreds of
such hosts are make test-lab's (test_pool_sweeps.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.enums import HostKeySource
from flows.fleet import discover_topology, parity_sweep
from flows.refusals import found
from flows.runner import STRATEGY_ENV
from gpuaas_lab import sshfleet
from gpuaas_lab.sshhost import generate_key
from tests.integration.flows.conftest import flow_control_plane

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

HOSTS = 10
# What each scenario's parity says once discovery stored its map (the checks a fleet host
# can pass honestly: sshfleet.PARITY_CHECKS).
EXPECTED_FAILURES = {
    "clean": "",
    "clean-rebooted": "",
    "missing-vfs": "api_topology",
    "duplicate-fabric": "api_topology",
    "h200": "api_topology",
}


@pytest.fixture
def fleet(tmp_path, database_url, monkeypatch, prefect_harness):
    cp = flow_control_plane(sshfleet.unavailable_reason(), tmp_path, database_url, monkeypatch)
    with sshfleet.lab_fleet(HOSTS, f"t{os.getpid()}", tmp_path / "fleets") as fleet:
        fleet.register(cp)
        yield cp, fleet


def namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line}


@pytest.mark.parametrize("strategy", ["idle_linear", "mitogen_linear"])
def test_a_fleet_is_discovered_and_checked_over_ssh_as_the_deploy_user(
    fleet, engine, strategy, monkeypatch
):
    # Under each strategy the runner offers (flows/runner.py, STRATEGY_ENV).
    monkeypatch.setenv(STRATEGY_ENV, strategy)
    _, lab = fleet
    described = lab.describe()
    assert (described["hosts"], described["serving"]) == (HOSTS, HOSTS)
    assert len({h.address for h in lab.hosts}) == len({h.host_public_key for h in lab.hosts}) == 10
    scenarios = {h.hostname: h.scenario for h in lab.hosts}

    discovered = found(
        discover_topology(
            region=sshfleet.REGION, extravars=lab.extravars(), batch_size=4, return_state=True
        )
    )
    assert sorted(discovered) == sorted(scenarios)
    assert all(r["passed"] for r in discovered.values()), discovered

    checks = {**lab.extravars(), "slice_parity_checks": list(sshfleet.PARITY_CHECKS)}
    state = parity_sweep(
        region=sshfleet.REGION,
        batch_size=4,
        parallel_batches=2,
        extravars=checks,
        return_state=True,
    )
    verdicts = {row["node"]: row["failed checks"] for row in state.result()}
    assert verdicts == {host: EXPECTED_FAILURES[s] for host, s in scenarios.items()}, verdicts
    # Each node judged once, from a task its batch ran over SSH under the pinned key.
    with engine.connect() as conn:
        judged = conn.execute(
            text(
                "SELECT count(*), count(DISTINCT node_id) FROM sweep_verdicts"
                " WHERE sweep_run_id = :run"
            ),
            {"run": str(state.state_details.flow_run_id)},
        ).one()
    assert tuple(judged) == (HOSTS, HOSTS)
    for host in lab.hosts:
        log = (Path(host.directory) / "dropbear.log").read_text()
        assert "Pubkey auth succeeded for 'gpuaas'" in log, log[-500:]
        assert "for 'root'" not in log


def test_one_job_per_batch_discovers_and_checks_in_one_playbook_run(fleet, engine, tmp_path):
    # No discovery sweep before: parity's api_topology check reads the map this run found.
    _, lab = fleet
    scenarios = {h.hostname: h.scenario for h in lab.hosts}
    checks = {**lab.extravars(), "slice_parity_checks": list(sshfleet.PARITY_CHECKS)}
    state = parity_sweep(
        region=sshfleet.REGION, batch_size=4, extravars=checks, discover=True, return_state=True
    )
    verdicts = {row["node"]: row["failed checks"] for row in state.result()}
    # The parity results were signed for the run's parity tasks (no "attestation" failure).
    assert verdicts == {host: EXPECTED_FAILURES[s] for host, s in scenarios.items()}, verdicts
    assert state.message.endswith("; topology rediscovered on 10 node(s)"), state.message
    run = str(state.state_details.flow_run_id)
    with engine.connect() as conn:
        judged = conn.execute(
            text(
                "SELECT kind, count(*), count(*) FILTER (WHERE passed) FROM sweep_verdicts"
                " WHERE sweep_run_id = :run GROUP BY kind ORDER BY kind"
            ),
            {"run": run},
        ).all()
        tasks = conn.execute(
            text(
                "SELECT n.hostname, t.kind, t.artifact_dir, t.state, t.summary ? 'import'"
                " AS imported FROM node_tasks t"
                " JOIN nodes n ON n.id = t.node_id WHERE t.flow_run_id = :run"
            ),
            {"run": run},
        ).all()
    assert [tuple(row) for row in judged] == [
        ("host.parity", HOSTS, sum(1 for s in scenarios.values() if not EXPECTED_FAILURES[s])),
        ("slice.topology_discover", HOSTS, HOSTS),
    ]
    # One playbook run per batch of four, and no other: the runs' private directories.
    assert len(tasks) == 2 * HOSTS
    runs = sorted(path.name.rsplit("-", 1)[0] for path in (tmp_path / "runs").iterdir())
    assert runs == ["fleet_check"] * 3, runs
    assert len({row.artifact_dir for row in tasks if row.kind == "host.parity"}) == 3
    assert {row.state for row in tasks if row.kind == "slice.topology_discover"} == {"succeeded"}
    # Discovery imported each map into its task, as discover_topology does.
    assert all(row.imported for row in tasks if row.kind == "slice.topology_discover")


@pytest.mark.parametrize("discover", [False, True], ids=["parity", "discovery+parity"])
def test_a_host_presenting_another_key_is_refused_and_named(fleet, discover):
    cp, lab = fleet
    host = lab.hosts[0]
    stranger = generate_key(Path(lab.directory) / "stranger", "stranger")
    cp.pin_host_keys(host.hostname, [stranger], HostKeySource.OPERATOR, "test", "wrong pin")
    checks = {**lab.extravars(), "slice_parity_checks": ["bridge"]}
    [row] = parity_sweep(hostnames=[host.hostname], extravars=checks, discover=discover)
    assert f"{host.hostname} presented ssh-ed25519" in row["failed checks"], row
    assert (Path(host.directory) / "dropbear.log").read_text().count("Pubkey auth") == 0


def test_down_removes_every_process_namespace_link_and_file(tmp_path):
    reason = sshfleet.unavailable_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path / "fleets"
    lab = sshfleet.up(3, f"d{os.getpid()}", state)
    mine = {host.namespace for host in lab.hosts}
    assert mine <= namespaces() and all(sshfleet.serving(host) for host in lab.hosts)
    assert [f["name"] for f in sshfleet.list_fleets(state)] == [lab.name]

    gone = sshfleet.down(lab.name, state)
    # Each host's server, and any session it had just forked for a probe of its port (one
    # was still there on a loaded fresh clone): down stops whatever is in the namespaces.
    assert gone["name"] == lab.name and gone["hosts"] == 3
    assert gone["processes_stopped"] >= 3
    assert not mine & namespaces()
    assert not any(sshfleet.serving(host) for host in lab.hosts)
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert lab.bridge not in links and f"gf{lab.tag}" not in links
    assert not Path(lab.directory).exists() and sshfleet.list_fleets(state) == []
    with pytest.raises(RuntimeError, match="no lab fleet named"):
        sshfleet.down(lab.name, state)
