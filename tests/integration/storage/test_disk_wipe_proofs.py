"""Disk wipe proofs on real loop disks: every method that works here, NVMe format through an
`nvme` stand-in, the fallbacks (a method that fails, one that exits 0 without erasing
everything), the verifier catching a disk that was not erased, diff, check mode, reruns, and
the playbook."""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
import sys
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing
from ansible_collections.gpuaas.fleet.plugins.module_utils.disk_wipe import (
    PROOF_SCHEMA,
    NvmeNamespace,
    WipeRequest,
    run_wipe,
    verify,
    write_markers,
)

from controlplane import attestation
from controlplane.hostkeys import parse_public_key
from gpuaas_lab.loopdev import MIB, read_direct, signatures, write_direct
from tests.integration.ansible_helpers import run_module, run_playbook
from tests.integration.storage.storage_helpers import raw_state

pytestmark = pytest.mark.root

PROOF_KEYS = {
    "schema",
    "device",
    "resolved_path",
    "size_bytes",
    "method",
    "attempts",
    "commands",
    "started_at",
    "finished_at",
    "duration_s",
    "markers",
    "samples",
    "signatures_after",
    "verified",
    "approval",
}


def used_disk(lab):
    """A released tenant disk: partition table, filesystem, data, nothing mounted."""
    disk = lab.disk(partitions=["tenant"])
    lab.mkfs(disk.partitions[0], label="tenant-root")
    write_direct(disk.device, 40 * MIB, secrets.token_bytes(MIB))
    return disk


def wipe(lab, tmp_path, disk, **options):
    request = WipeRequest(
        device=disk.stable_path,
        stable_dirs=[str(lab.by_id)],
        approval=options.pop("approval", "release-alloc-7-slot-0"),
        proof_dir=str(tmp_path / "proofs"),
        sample_count=8,
        **options,
    )
    return run_wipe(request)


def assert_verified_proof(proof, disk, method):
    assert set(proof) >= PROOF_KEYS
    assert proof["schema"] == PROOF_SCHEMA
    assert proof["verified"] is True
    assert proof["method"] == method
    assert proof["resolved_path"] == disk.device and proof["size_bytes"] == disk.size_bytes
    assert [m["offset"] for m in proof["markers"]] == [
        0,
        disk.size_bytes // 2,
        disk.size_bytes - 4096,
    ]
    assert all(m["written"] and m["gone"] for m in proof["markers"])
    assert len(proof["samples"]) == 8 and all(s["all_zero"] for s in proof["samples"])
    assert proof["signatures_before"] and proof["signatures_after"] == []
    assert proof["attempts"][-1] == {**proof["attempts"][-1], "method": method, "ok": True}
    finished = dt.datetime.fromisoformat(proof["finished_at"].replace("Z", "+00:00"))
    assert finished.tzinfo is not None
    assert raw_state(disk.device) == {"signatures": [], "partitions": [], "mounted": False}
    assert read_direct(disk.device, 40 * MIB, MIB) == bytes(MIB)


@pytest.mark.parametrize("method", ["blkdiscard", "write_zeroes", "zero"])
def test_each_method_available_here_erases_and_verifies(lab, tmp_path, method):
    disk = used_disk(lab)
    result = wipe(lab, tmp_path, disk, method=method, allow_fallback=False)
    assert result.get("failed") is not True, result["msg"]
    assert result["changed"] is True
    assert_verified_proof(result["proof"], disk, method)
    assert len(result["proof"]["attempts"]) == 1
    stored = json.loads(
        (tmp_path / "proofs" / f"{disk.stable_path.rsplit('/', 1)[1]}.json").read_text()
    )
    assert stored == result["proof"]


def test_nvme_format_on_a_loop_device_falls_back_and_says_why(lab, tmp_path):
    disk = used_disk(lab)
    result = wipe(lab, tmp_path, disk, method="nvme_format")
    proof = result["proof"]
    assert_verified_proof(proof, disk, "blkdiscard")
    first = proof["attempts"][0]
    assert first["method"] == "nvme_format" and first["ok"] is False
    assert "not an NVMe namespace" in first["error"] and first["command"] is None


def test_unsupported_discard_falls_back_to_write_zeroes(lab, tmp_path):
    disk = used_disk(lab)
    lab.disable_discard(disk)
    result = wipe(lab, tmp_path, disk)
    proof = result["proof"]
    assert_verified_proof(proof, disk, "write_zeroes")
    assert [(a["method"], a["ok"]) for a in proof["attempts"]] == [
        ("nvme_format", False),
        ("blkdiscard", False),
        ("write_zeroes", True),
    ]
    assert "Operation not supported" in proof["attempts"][1]["error"]
    assert proof["attempts"][1]["command"].endswith(f"blkdiscard --force {disk.device}")


def test_failed_method_without_fallback_is_never_verified(lab, tmp_path):
    disk = used_disk(lab)
    lab.disable_discard(disk)
    result = wipe(lab, tmp_path, disk, method="blkdiscard", allow_fallback=False)
    assert result["failed"] is True and "not verified" in result["msg"]
    proof = result["proof"]
    assert proof["verified"] is False and proof["method"] is None
    assert result["changed"] is True  # the markers were written
    assert not (tmp_path / "proofs").exists()


def test_verifier_catches_a_disk_that_was_not_erased(lab):
    """Markers written, no erase: the verification must fail on every count."""
    disk = used_disk(lab)
    nonce = secrets.token_bytes(16)
    markers = write_markers(disk.device, disk.size_bytes, nonce)
    outcome = verify(disk.device, disk.kernel_name, disk.size_bytes, nonce, markers, 8, MIB)
    assert outcome["verified"] is False
    assert not any(m["gone"] for m in outcome["markers"])
    assert not outcome["samples"][0]["all_zero"]
    assert outcome["partitions_after"] == [f"{disk.kernel_name}p1"]
    assert len(outcome["problems"]) == 3


def test_check_mode_writes_nothing_and_rerun_reuses_the_proof(lab, tmp_path):
    disk = used_disk(lab)
    before = lab.fingerprint(disk)
    checked = run_wipe(
        WipeRequest(
            device=disk.stable_path,
            stable_dirs=[str(lab.by_id)],
            check_mode=True,
            proof_dir=str(tmp_path / "proofs"),
        )
    )
    assert checked["changed"] is True and checked["proof"] is None
    assert checked["plan"][1] == {
        "action": "erase",
        "methods": ["nvme_format", "blkdiscard", "write_zeroes", "zero"],
    }
    assert lab.fingerprint(disk) == before

    first = wipe(lab, tmp_path, disk)
    second = wipe(lab, tmp_path, disk)
    assert second["changed"] is False and second["reused_proof"] is True
    assert second["proof"] == first["proof"]
    # another approval is another erase request
    assert wipe(lab, tmp_path, disk, approval="release-alloc-8-slot-0")["changed"] is True
    # anything written since invalidates the stored proof
    write_direct(disk.device, 8 * MIB, b"\x01" * 4096)
    again = wipe(lab, tmp_path, disk, approval="release-alloc-8-slot-0")
    assert again["changed"] is True and again["proof"]["verified"] is True


def test_wipe_playbook_returns_proofs_to_the_controller(lab, tmp_path, storage_ansible_env):
    disks = [used_disk(lab), used_disk(lab)]
    out = tmp_path / "proofs-out"
    out.mkdir()
    extravars = {
        "slice_disk_wipe_devices": [d.stable_path for d in disks],
        "slice_disk_wipe_stable_dirs": [str(lab.by_id)],
        "slice_disk_wipe_approval": "release-alloc-11",
        "slice_disk_wipe_proof_dir": str(tmp_path / "host-proofs"),
        "slice_disk_wipe_sample_count": 8,
        "gpuaas_wipe_proof_out": str(out),
    }
    before = [lab.fingerprint(d) for d in disks]
    checked = run_playbook("disk_wipe.yml", extravars, tmp_path, storage_ansible_env, check=True)
    assert checked.rc == 0, checked.failures()
    assert [lab.fingerprint(d) for d in disks] == before
    assert list(out.iterdir()) == []

    run = run_playbook("disk_wipe.yml", extravars, tmp_path, storage_ansible_env)
    assert run.rc == 0, run.failures()
    results = run.task("Erase the disk and collect its proof")["results"]
    assert [r["changed"] for r in results] == [True, True]
    for index, disk in enumerate(disks):
        proof = json.loads((out / f"localhost-{index}.json").read_text())
        assert proof == results[index]["proof"]
        assert proof["device"] == disk.stable_path and proof["approval"] == "release-alloc-11"
        assert_verified_proof(proof, disk, "blkdiscard")
        assert signatures(disk.device) == []

    rerun = run_playbook("disk_wipe.yml", extravars, tmp_path, storage_ansible_env)
    assert rerun.rc == 0, rerun.failures()
    again = rerun.task("Erase the disk and collect its proof")["results"]
    assert [r["changed"] for r in again] == [False, False]
    assert [r["proof"] for r in again] == [r["proof"] for r in results]


# ---------------------------------------------------------------- NVMe format, through a stand-in
#
# NVMe hardware cannot exist here (the named boundary): an `nvme` stand-in on PATH answers
# id-ctrl/id-ns with recorded documents and performs `format` by zeroing the loop device it
# is given; the module is told, through WipeRequest.nvme_locator, that this loop device is an
# NVMe namespace. Everything else (the secure erase choice, the commands, the claim, the
# markers, the verification) is the module's own, on the real loop device.

NVME_DOCS = Path(__file__).resolve().parents[2] / "unit" / "storage" / "data"
STANDIN = Path(__file__).resolve().parent / "nvme_standin.py"


class NvmeStandIn:
    def __init__(self, directory: Path):
        self.bin = directory / "bin"
        self.bin.mkdir()
        self.executable = self.bin / "nvme"
        self.executable.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
        self.executable.chmod(0o755)
        self.config = directory / "nvme-standin.json"
        self.log = directory / "nvme-argv.jsonl"

    def answer(self, id_ctrl: str, id_ns: str, format_zeroes: str = "whole") -> None:
        self.config.write_text(
            json.dumps(
                {
                    "id_ctrl": json.loads((NVME_DOCS / id_ctrl).read_text()),
                    "id_ns": json.loads((NVME_DOCS / id_ns).read_text()),
                    "log": str(self.log),
                    "format_zeroes": format_zeroes,
                }
            )
        )

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def nvme(tmp_path, monkeypatch) -> NvmeStandIn:
    standin = NvmeStandIn(tmp_path)
    monkeypatch.setenv("PATH", f"{standin.bin}:{os.environ['PATH']}")
    monkeypatch.setenv("GPUAAS_NVME_STANDIN", str(standin.config))
    return standin


def as_nvme_namespace(disk, namespaces_on_controller: int = 1):
    """The NVMe locator for a lab disk: no controller character device, namespace id 1."""

    def locate(kernel_name: str) -> NvmeNamespace | None:
        if kernel_name != disk.kernel_name:
            return None
        return NvmeNamespace(None, 1, namespaces_on_controller)

    return locate


@pytest.mark.parametrize(
    ("id_ctrl", "id_ns", "ses", "lbaf", "kind"),
    [
        ("id-ctrl-pm9a3-crypto.json", "id-ns-lbaf1.json", 2, 1, "cryptographic erase"),
        ("id-ctrl-no-crypto.json", "id-ns-lbaf0.json", 1, 0, "user data erase"),
    ],
    ids=["crypto_erase_supported", "user_data_erase"],
)
def test_nvme_format_chooses_the_secure_erase_from_id_ctrl_and_verifies_the_device(
    lab, tmp_path, nvme, id_ctrl, id_ns, ses, lbaf, kind
):
    disk = used_disk(lab)
    nvme.answer(id_ctrl, id_ns)
    result = wipe(
        lab,
        tmp_path,
        disk,
        method="nvme_format",
        allow_fallback=False,
        nvme_locator=as_nvme_namespace(disk),
    )
    assert result.get("failed") is not True, result["msg"]
    proof = result["proof"]
    assert_verified_proof(proof, disk, "nvme_format")
    assert nvme.calls() == [
        ["id-ctrl", disk.device, "-o", "json"],
        ["id-ns", disk.device, "-o", "json"],
        ["format", disk.device, f"--ses={ses}", f"--lbaf={lbaf}", "--timeout=1800000", "--force"],
    ]
    assert proof["commands"][:3] == [f"{nvme.executable} {' '.join(c)}" for c in nvme.calls()]
    [attempt] = proof["attempts"]
    assert attempt["command"] == proof["commands"][2]
    assert attempt["secure_erase"]["ses"] == ses and attempt["secure_erase"]["lbaf"] == lbaf
    assert attempt["secure_erase"]["why"].startswith(kind)
    assert attempt["verify_seconds"] >= 0
    # verification read the loop device itself: markers gone, sampled regions zero
    assert all(read_direct(disk.device, m["offset"], 4096) == bytes(4096) for m in proof["markers"])


def test_nvme_format_that_exits_0_but_leaves_data_falls_back_and_says_so(lab, tmp_path, nvme):
    """A format that reports success but zeroes only the second half (faulty firmware): the
    verification on the device catches it, blkdiscard takes over, and the result says so."""
    disk = used_disk(lab)
    nvme.answer("id-ctrl-pm9a3-crypto.json", "id-ns-lbaf1.json", format_zeroes="second_half")
    result = wipe(lab, tmp_path, disk, method="nvme_format", nvme_locator=as_nvme_namespace(disk))
    proof = result["proof"]
    assert_verified_proof(proof, disk, "blkdiscard")
    assert [c[0] for c in nvme.calls()] == ["id-ctrl", "id-ns", "format"]
    failed, succeeded = proof["attempts"]
    assert failed["method"] == "nvme_format" and failed["ok"] is False
    assert failed["command"] == proof["commands"][2] and failed["verify_seconds"] >= 0
    assert failed["error"].startswith("verification failed: a marker was not written or is still")
    assert "sampled regions are not zero at offsets [0" in failed["error"]
    assert succeeded["method"] == "blkdiscard" and succeeded["ok"] is True
    assert result["msg"].startswith(
        "erased with blkdiscard and verified; fell back from nvme_format: verification failed: "
    )


def test_nvme_format_is_not_run_when_it_would_erase_other_namespaces(lab, tmp_path, nvme):
    disk = used_disk(lab)
    nvme.answer("id-ctrl-erase-all-namespaces.json", "id-ns-lbaf0.json")
    result = wipe(
        lab,
        tmp_path,
        disk,
        method="nvme_format",
        nvme_locator=as_nvme_namespace(disk, namespaces_on_controller=2),
    )
    proof = result["proof"]
    assert_verified_proof(proof, disk, "blkdiscard")
    assert [c[0] for c in nvme.calls()] == ["id-ctrl", "id-ns"]
    first = proof["attempts"][0]
    assert first["ok"] is False and first["command"] is None
    assert "would erase other namespaces" in first["error"]
    assert "fell back from nvme_format: not applicable: " in result["msg"]


# ---------------------------------------------------------------- diff


def test_diff_after_is_what_the_disk_shows_after_an_unverified_wipe(lab, tmp_path, nvme):
    """The md superblock at 4 KiB survives a format that zeroes only the second half: the
    diff's after side is probed from the disk, so it shows the signature still there."""
    disk = lab.disk()
    lab.write_md_superblock(disk.device)
    nvme.answer("id-ctrl-no-crypto.json", "id-ns-lbaf0.json", format_zeroes="second_half")
    result = wipe(
        lab,
        tmp_path,
        disk,
        method="nvme_format",
        allow_fallback=False,
        nvme_locator=as_nvme_namespace(disk),
    )
    assert result["failed"] is True and result["proof"]["verified"] is False
    before, after = result["diff"]["before"], result["diff"]["after"]
    assert [s["type"] for s in before["signatures"]] == ["linux_raid_member"]
    assert [s["type"] for s in after["signatures"]] == ["linux_raid_member"]
    assert after["signatures"] == before["signatures"]
    assert after["signatures"][0]["uuid"] == signatures(disk.device)[0]["uuid"]
    assert before["partitions"] == after["partitions"] == []


def test_module_diff_shows_signatures_and_partitions_gone(lab, tmp_path):
    disk = used_disk(lab)
    args = {
        "device": disk.stable_path,
        "stable_dirs": [str(lab.by_id)],
        "approval": "release-alloc-12-slot-0",
        "proof_dir": str(tmp_path / "proofs"),
        "sample_count": 4,
    }
    checked = run_module("disk_wipe", args, tmp_path, check=True, diff=True)
    result = run_module("disk_wipe", args, tmp_path, diff=True)
    rerun = run_module("disk_wipe", args, tmp_path, diff=True)

    assert checked["rc"] == 0 and result["rc"] == 0, result["msg"]
    before = result["diff"]["before"]
    assert before["partitions"] == [disk.partitions[0]]
    assert {s["type"] for s in before["signatures"]} >= {"gpt", "PMBR", "ext4"}
    assert result["diff"]["after"] == {"signatures": [], "partitions": []}
    assert checked["diff"] == result["diff"]
    assert rerun["changed"] is False and "diff" not in rerun


# ---------------------------------------------------------------- signed proofs


def test_a_wipe_given_a_nonce_returns_a_proof_signed_for_it(lab, tmp_path):
    """docs/trust.md, "Signed evidence": the module signs the proof it returns; a rerun
    for another nonce (the stored proof reused) is signed for that nonce."""
    key = tmp_path / "evidence-signing.key"
    pinned = [parse_public_key(evidence_signing.ensure_key(str(key), False)["public_key"])]
    disk = used_disk(lab)
    signing = {"node": "gpu-a1", "signing_key": str(key)}
    first = wipe(lab, tmp_path, disk, nonce="task-1", **signing)
    proof = first["proof"]
    assert_verified_proof(proof, disk, "blkdiscard")
    attested = attestation.verify(proof, "wipe_proof", "gpu-a1", pinned)
    assert attested.nonce == "task-1"
    stored = json.loads((tmp_path / "proofs" / f"{Path(disk.stable_path).name}.json").read_text())
    assert "attestation" not in stored

    again = wipe(lab, tmp_path, disk, nonce="task-2", **signing)
    assert again["reused_proof"] is True
    assert attestation.verify(again["proof"], "wipe_proof", "gpu-a1", pinned).nonce == "task-2"

    unsigned = wipe(lab, tmp_path, disk, nonce="task-3", node="gpu-a1", signing_key="/nonexistent")
    assert "no evidence signing key at /nonexistent" in unsigned["proof"]["attestation_error"]
    with pytest.raises(attestation.Untrusted, match=r"^unsigned"):
        attestation.verify(unsigned["proof"], "wipe_proof", "gpu-a1", pinned)
