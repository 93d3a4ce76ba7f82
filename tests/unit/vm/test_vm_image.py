"""Image digest verification and the qemu-img clone (onto a file standing in for a disk).

The clone onto a real block device, with the disk checks first, runs in the integration
tests (loop device) and in bench/vm_lifecycle.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_image
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img missing")


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "image.raw"
    data = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(64 * 1024))
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def test_digest_matches_or_fails_with_both_digests(image):
    path, digest = image
    assert vm_image.verify_digest(str(path), digest)["actual_sha256"] == digest
    assert vm_image.verify_digest(str(path), f"sha256:{digest.upper()}")["actual_sha256"] == digest
    with pytest.raises(VmError) as caught:
        vm_image.verify_digest(str(path), "0" * 64)
    assert caught.value.code == "image_digest_mismatch"
    assert caught.value.details["digest"]["actual_sha256"] == digest
    with pytest.raises(VmError) as caught:
        vm_image.verify_digest(str(path) + ".missing", digest)
    assert caught.value.code == "image_missing"
    with pytest.raises(VmError) as caught:
        vm_image.verify_digest(str(path), "abc")
    assert caught.value.code == "invalid_digest"


def test_an_earlier_verification_is_reused_only_for_the_unchanged_file(
    image, tmp_path: Path, monkeypatch
):
    path, digest = image
    monkeypatch.setattr(vm_image, "SETTLED_SECONDS", 0.2)
    time.sleep(0.3)  # the image was written before the verification, as a cached one is
    earlier = vm_image.verify_digest(str(path), digest, "preflight")
    assert not earlier["reused"] and earlier["file"]["size"] == path.stat().st_size
    hashed = []
    real_hash = vm_image.hash_file
    monkeypatch.setattr(vm_image, "hash_file", lambda p: hashed.append(p) or real_hash(p))
    again = vm_image.verify_digest(str(path), digest, verified=earlier)
    assert again["reused"] and again["actual_sha256"] == digest and hashed == []
    # a verification of another digest, or of another file, is not this one
    other = {**earlier, "actual_sha256": "1" * 64}
    assert not vm_image.verify_digest(str(path), digest, verified=other)["reused"]
    copy = tmp_path / "copy.raw"
    shutil.copyfile(path, copy)
    assert not vm_image.verify_digest(str(copy), digest, verified=earlier)["reused"]
    assert len(hashed) == 2
    # a file changed just before its hash is hashed again (its times may not show a write)
    fresh = vm_image.verify_digest(str(copy), digest)
    assert not vm_image.verify_digest(str(copy), digest, verified=fresh)["reused"]
    # written in place (same size): hashed again, and the change is caught
    with open(path, "r+b") as handle:
        handle.write(b"\0")
    with pytest.raises(VmError) as caught:
        vm_image.verify_digest(str(path), digest, verified=earlier)
    assert caught.value.code == "image_digest_mismatch"
    # replaced by another file with the same bytes: hashed again
    copy.replace(path)
    assert not vm_image.verify_digest(str(path), digest, verified=earlier)["reused"]


def test_clone_writes_the_image_records_progress_and_is_idempotent(image, tmp_path: Path):
    path, digest = image
    target = tmp_path / "disk.img"
    with open(target, "wb") as handle:
        handle.truncate(4 << 20)
    state = tmp_path / "state"
    args = (str(path), digest, "/dev/disk/by-id/nvme-eui.01", str(target), str(state))
    preview = vm_image.clone_image(*args, check_mode=True)
    assert preview["changed"] and "qemu-img convert" in preview["plan"]["command"]
    assert not state.exists()
    result = vm_image.clone_image(*args, check_mode=False)
    record = result["record"]
    assert target.read_bytes()[: path.stat().st_size] == path.read_bytes()
    assert record["bytes"] == path.stat().st_size and record["image_sha256"] == digest
    assert record["progress"][-1]["percent"] == 100.0
    assert record["throughput_mib_s"] > 0
    stored = json.loads((state / "clone-nvme-eui.01.json").read_text())
    assert stored == record
    again = vm_image.clone_image(*args, check_mode=False)
    assert not again["changed"] and again["skipped_reason"] == "already cloned"


def test_qcow2_images_are_converted_to_raw(image, tmp_path: Path):
    path, _digest = image
    qcow = tmp_path / "image.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(path), str(qcow)], check=True)
    target = tmp_path / "disk.img"
    with open(target, "wb") as handle:
        handle.truncate(4 << 20)
    digest = hashlib.sha256(qcow.read_bytes()).hexdigest()
    result = vm_image.clone_image(
        str(qcow), digest, "/dev/disk/by-id/x", str(target), str(tmp_path / "s"), False
    )
    assert result["record"]["image_format"] == "qcow2"
    assert target.read_bytes()[: path.stat().st_size] == path.read_bytes()


def test_an_image_larger_than_the_disk_is_refused_before_writing(image, tmp_path: Path):
    path, digest = image
    target = tmp_path / "small.img"
    target.write_bytes(b"\x55" * 4096)
    with pytest.raises(VmError) as caught:
        vm_image.clone_image(str(path), digest, "/dev/x", str(target), str(tmp_path / "s"), False)
    assert caught.value.code == "image_larger_than_disk"
    assert target.read_bytes() == b"\x55" * 4096


def test_digest_mismatch_is_refused_before_writing(image, tmp_path: Path):
    path, _digest = image
    target = tmp_path / "disk.img"
    target.write_bytes(b"\x55" * (4 << 20))
    with pytest.raises(VmError) as caught:
        vm_image.clone_image(str(path), "f" * 64, "/dev/x", str(target), str(tmp_path / "s"), False)
    assert caught.value.code == "image_digest_mismatch"
    assert target.read_bytes() == b"\x55" * (4 << 20)


def test_progress_is_parsed_from_carriage_return_updates(tmp_path: Path):
    script = tmp_path / "fake-qemu-img"
    script.write_text(
        "#!/bin/sh\nfor p in 0.00 9.50 19.99 50.00 99.99 100.00; do "
        "printf '    (%s/100%%)\\r' $p; done\n"
    )
    script.chmod(0o755)
    outcome = vm_image.run_clone([str(script)], timeout=10)
    assert outcome["rc"] == 0
    assert [s["percent"] for s in outcome["progress"]] == [0.0, 19.99, 50.0, 99.99, 100.0]
