"""The storage_transition flow on real loop disks: a plan needs no approval; applying needs
an approval an operator recorded in the store, and touches only that record's disks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils.evidence_signing import public_line
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import MARKER
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import Conflict, InvalidInput
from controlplane.services.inventory import NodeSpec
from flows.fleet import storage_transition
from gpuaas_lab.hosts import SigningKey
from gpuaas_lab.loopdev import LoopLab, require_loop
from tests.integration.flows.prefect_reads import assert_progress_done
from tests.integration.storage.storage_helpers import raw_state
from tests.integration.wipe_proofs import node_key

pytestmark = [pytest.mark.slow, pytest.mark.root, pytest.mark.xdist_group("prefect")]

HOST = "j22u05"


def rows(engine, sql, **params):
    with engine.connect() as conn:
        return conn.execute(text(sql), params).all()


def blkid(part: str, tag: str) -> str:
    return subprocess.run(
        ["blkid", "-p", "-s", tag, "-o", "value", part], capture_output=True, text=True, check=True
    ).stdout.strip()


class StorageHost:
    """A registered node whose host is this machine, with two loop disks: a host share
    (ext4 partition, mounted, in the host's fstab) and a disk with a leftover partition."""

    def __init__(self, cp: ControlPlane, lab: LoopLab, root: Path) -> None:
        self.cp, self.lab = cp, lab
        self.share = lab.disk(partitions=["share"])
        self.leftover = lab.disk(partitions=["old"])
        lab.mkfs(self.share.partitions[0])
        self.mounts = [lab.mount(self.share.partitions[0])]
        self.fstab = root / "fstab"
        self.fstab.write_text(
            f"UUID={blkid(self.share.partitions[0], 'UUID')} {self.mounts[0]} ext4 nofail 0 2\n"
        )
        self.manifests = root / "manifests"
        # The node's evidence signing key, pinned as its bootstrap would (docs/trust.md).
        self.signing_key = SigningKey.create(root / "state")
        self.signing_key.pin(cp, HOST)
        self.extravars = {
            "slice_storage_transition_stable_dirs": [str(lab.by_id)],
            "slice_storage_transition_fstab_path": str(self.fstab),
            "slice_storage_transition_manifest_dir": str(self.manifests),
            **self.signing_key.role_vars(),
        }

    @property
    def devices(self) -> list[str]:
        return [self.share.stable_path, self.leftover.stable_path]

    def fingerprints(self):
        return [self.lab.fingerprint(d, self.mounts) for d in (self.share, self.leftover)]

    def approve(self, reference: str, devices: list[str]):
        return self.cp.record_storage_approval(HOST, devices, reference, "infra-operator")


@pytest.fixture
def storage_host(tmp_path, database_url, monkeypatch, prefect_harness):
    require_loop()
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    cp = ControlPlane.from_environment()
    cp.register_node(
        NodeSpec(
            HOST,
            "region-maas-1",
            maas_tags=("gpuaas-profile-slice-vm",),
            host_vars={
                "ansible_connection": "local",
                "ansible_python_interpreter": sys.executable,
            },
        )
    )
    with LoopLab(tmp_path / "disks") as lab:
        yield StorageHost(cp, lab, tmp_path)


def test_a_plan_runs_without_approval_and_changes_nothing(storage_host, engine):
    before = storage_host.fingerprints()
    fstab = storage_host.fstab.read_bytes()
    state = storage_transition(
        HOST, storage_host.devices, extravars=storage_host.extravars, return_state=True
    )
    result = state.result()
    assert result["devices"] == {d: "planned" for d in storage_host.devices}
    assert result["approval_evidence_id"] is None
    assert_progress_done(
        state,
        f"storage-transition-progress-{HOST}",
        "transition storage on host",
        f"Storage transition (plan) of 2 disk(s) on {HOST}",
    )
    assert storage_host.fingerprints() == before
    assert storage_host.fstab.read_bytes() == fstab
    assert not storage_host.manifests.exists()
    tasks = rows(engine, "SELECT state FROM node_tasks WHERE kind = 'storage.transition'")
    assert tasks == [("succeeded",)]
    # A plan is not a raw-disk record: slot approval must not count it as one.
    raw_records = rows(
        engine,
        "SELECT count(*) FROM evidence WHERE kind = 'storage_manifest' AND payload ? 'device'",
    )
    assert raw_records == [(0,)]


def test_applying_is_refused_without_a_recorded_approval_covering_every_disk(storage_host, engine):
    before = storage_host.fingerprints()
    devices = storage_host.devices

    unapproved = storage_transition(HOST, devices, apply=True, return_state=True)
    assert unapproved.is_failed()
    assert "needs the reference of an approval recorded" in unapproved.message

    unknown = storage_transition(HOST, devices, approval="INFRA-404", apply=True, return_state=True)
    assert unknown.is_failed()
    assert "no storage approval 'INFRA-404' is recorded for j22u05" in unknown.message

    storage_host.approve("INFRA-1", [storage_host.share.stable_path])
    partial = storage_transition(HOST, devices, approval="INFRA-1", apply=True, return_state=True)
    assert partial.is_failed()
    assert f"does not cover: {storage_host.leftover.stable_path}" in partial.message

    # Refused before anything ran on the host.
    assert rows(engine, "SELECT count(*) FROM node_tasks") == [(0,)]
    assert storage_host.fingerprints() == before
    assert not storage_host.manifests.exists()


def test_applying_with_a_recorded_approval_transitions_its_disks_and_records_them(
    storage_host, engine
):
    approval = storage_host.approve("INFRA-2026-0417", storage_host.devices)
    assert approval.created
    result = storage_transition(
        HOST,
        storage_host.devices,
        approval="INFRA-2026-0417",
        apply=True,
        extravars=storage_host.extravars,
    )
    assert result["devices"] == {d: "transitioned" for d in storage_host.devices}
    assert result["approval_evidence_id"] == approval.evidence_id
    for disk in (storage_host.share, storage_host.leftover):
        assert raw_state(disk.device) == {"signatures": [], "partitions": [], "mounted": False}
    manifest = json.loads(Path(result["manifest_path"]).read_text())
    assert manifest["approval"] == "INFRA-2026-0417"
    assert storage_host.fstab.read_text().startswith(f"# {MARKER} UUID=")
    raw_records = rows(
        engine,
        "SELECT payload ->> 'device', payload ->> 'approval',"
        " (payload ->> 'approval_evidence_id')::bigint, passed, payload ->> 'trust'"
        " FROM evidence WHERE kind = 'storage_manifest' AND payload ? 'device' ORDER BY 1",
    )
    assert raw_records == sorted(
        (d, "INFRA-2026-0417", approval.evidence_id, True, "signed by the node for this run")
        for d in storage_host.devices
    )


def test_a_manifest_the_node_did_not_sign_records_no_raw_disk(storage_host, engine):
    storage_host.cp.pin_signing_key(
        HOST, public_line(node_key("intruder")), "test", "another node's key"
    )
    storage_host.approve("INFRA-2026-0418", storage_host.devices)
    result = storage_transition(
        HOST,
        storage_host.devices,
        approval="INFRA-2026-0418",
        apply=True,
        extravars=storage_host.extravars,
    )
    assert result["devices"] == {d: "transitioned" for d in storage_host.devices}
    records = rows(
        engine,
        "SELECT passed, summary FROM evidence WHERE kind = 'storage_manifest'"
        " AND payload ? 'device'",
    )
    assert len(records) == 2
    assert all(
        not passed and "not trusted: the signature does not verify" in summary
        for passed, summary in records
    ), records


def test_approval_records_are_validated_and_a_reference_names_one_decision(storage_host):
    with pytest.raises(InvalidInput, match="not a stable disk path"):
        storage_host.approve("INFRA-3", [storage_host.share.device])
    with pytest.raises(InvalidInput, match="needs a reference"):
        storage_host.approve("  ", storage_host.devices)
    first = storage_host.approve("INFRA-3", storage_host.devices)
    again = storage_host.approve("INFRA-3", list(reversed(storage_host.devices)))
    assert first.created and not again.created
    assert again.evidence_id == first.evidence_id
    with pytest.raises(Conflict, match="already covers other disks"):
        storage_host.approve("INFRA-3", [storage_host.share.stable_path])
