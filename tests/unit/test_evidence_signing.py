"""The node's evidence signing key and attestations (module utility), checked by the
control plane's verifier: the two canonical forms must agree (docs/trust.md)."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing

from controlplane import attestation
from controlplane.hostkeys import parse_public_key

PROOF = {
    "schema": "gpuaas.wipe_proof/v1",
    "device": "/dev/disk/by-id/nvme-eui.0001",
    "verified": True,
    "duration_s": 1.25,
    "attempts": [{"method": "blkdiscard", "ok": True, "note": "ünïcode"}],
}


@pytest.fixture
def key_path(tmp_path):
    path = tmp_path / "etc" / "evidence-signing.key"
    evidence_signing.ensure_key(str(path), check_mode=False)
    return path


def test_the_key_is_created_once_private_and_reported_as_a_pinnable_ed25519_line(tmp_path):
    path = tmp_path / "etc" / "evidence-signing.key"
    checked = evidence_signing.ensure_key(str(path), check_mode=True)
    assert checked == {**checked, "changed": True, "public_key": None} and not path.exists()
    created = evidence_signing.ensure_key(str(path), check_mode=False)
    assert created["changed"] and stat.S_IMODE(path.stat().st_mode) == 0o600
    again = evidence_signing.ensure_key(str(path), check_mode=False)
    assert not again["changed"] and again["public_key"] == created["public_key"]
    pinned = parse_public_key(created["public_key"])
    assert pinned.key_type == "ssh-ed25519"
    assert created["fingerprint"] == pinned.fingerprint
    # The same fingerprint OpenSSH prints for the key.
    pub = tmp_path / "key.pub"
    pub.write_text(created["public_key"] + "\n")
    shown = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True)
    assert pinned.fingerprint in shown.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="ownership checks need root")
def test_a_key_others_can_read_is_refused(key_path):
    key_path.chmod(0o644)
    with pytest.raises(evidence_signing.SigningError, match="readable by root only"):
        evidence_signing.ensure_key(str(key_path), check_mode=False)


def test_a_signed_result_verifies_with_the_pinned_key_and_binds_node_nonce_and_disk(key_path):
    signed = evidence_signing.sign_result(
        str(key_path), "wipe_proof", "gpu-a1", "n-1", PROOF, {"serial": "S1"}
    )
    pinned = [parse_public_key(evidence_signing.ensure_key(str(key_path), False)["public_key"])]
    attested = attestation.verify(signed, "wipe_proof", "gpu-a1", pinned)
    assert (attested.nonce, attested.disk) == ("n-1", {"serial": "S1"})
    with pytest.raises(attestation.Untrusted, match="not 'wipe_proof' of 'gpu-a2'"):
        attestation.verify(signed, "wipe_proof", "gpu-a2", pinned)
    with pytest.raises(attestation.Untrusted, match="altered after it was signed"):
        attestation.verify({**signed, "duration_s": 1.0}, "wipe_proof", "gpu-a1", pinned)
    statement = {**signed["attestation"]["statement"], "nonce": "n-2"}
    replayed = {**signed, "attestation": {**signed["attestation"], "statement": statement}}
    with pytest.raises(attestation.Untrusted, match="does not verify"):
        attestation.verify(replayed, "wipe_proof", "gpu-a1", pinned)


def test_without_a_key_the_result_says_why_and_is_not_believed(tmp_path):
    unsigned = evidence_signing.sign_result(
        str(tmp_path / "absent.key"), "wipe_proof", "gpu-a1", "n-1", PROOF, {}
    )
    assert "attestation" not in unsigned
    assert "bootstrap the node" in unsigned["attestation_error"]
    with pytest.raises(attestation.Untrusted, match=r"^unsigned: no evidence signing key"):
        attestation.verify(unsigned, "wipe_proof", "gpu-a1", [])


def test_the_canonical_forms_agree():
    assert evidence_signing.canonical(PROOF) == attestation.canonical(PROOF)
    assert evidence_signing.payload_digest(PROOF) == attestation.payload_digest(PROOF)


def test_disk_identity_reads_what_the_kernel_reports(tmp_path):
    block = tmp_path / "nvme0n1"
    (block / "device").mkdir(parents=True)
    (block / "device" / "serial").write_text("S4EVNX0R123456  \n")
    (block / "eui").write_text("0025385b71b01234\n")
    assert evidence_signing.disk_identity("nvme0n1", str(tmp_path)) == {
        "serial": "S4EVNX0R123456",
        "eui": "0025385b71b01234",
    }
    assert evidence_signing.disk_identity("loop7", str(tmp_path)) == {}
