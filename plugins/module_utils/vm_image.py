# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Slice image: digest verification and the clone onto the slot's raw disk.

The node image cache holds catalog images (docs/slice-host.md, "Image cache"); a provision
verifies the cached
file's sha256 against the catalog digest and then clones it with
`qemu-img convert -O raw` onto the boot disk of the allocation (an approved raw NVMe by
stable identity), with progress samples, timing and throughput.

The preflight hashes the image before anything is written; the clone, seconds later, hashes
it again unless it is given that verification and the file is still the one that was hashed:
same device and inode, same size, modification and change time (any write or replacement
changes them). The identity is read from the open file that is hashed, so a file replaced
meanwhile is hashed again. File times tick coarsely, so a write in the same tick as the last
change before the hash would leave them as they were: a file changed less than
SETTLED_SECONDS before it was hashed is hashed again too (git's "racy clean" rule).

A clone record in the allocation's state directory (device, image digest, timing) makes a
second provision of the same allocation a no-op: the disk already holds its image and,
once the VM runs, its tenant's writes, so it is never cloned over again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time

from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    hostfile,
    vm_common,
    vm_disk,
    vm_libvirt,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import PHASE_IMAGE, VmError

HASH_CHUNK = 8 << 20
SETTLED_SECONDS = 2.0
PROGRESS_RE = re.compile(rb"\((\d+(?:\.\d+)?)/100%\)")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
IMAGE_FORMATS = ("raw", "qcow2")


def file_identity(st: os.stat_result) -> dict:
    """What changes when a file's content may have: another file (device, inode), a write
    (size, modification and change times) or any metadata change (change time)."""
    return {
        "device": st.st_dev,
        "inode": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def hash_file(path: str) -> tuple[str, float, dict]:
    """(sha256, seconds, identity of the open file taken before reading it, with the time
    the hash began as `hashed_at_ns`)."""
    started = time.monotonic()
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        identity = file_identity(os.fstat(handle.fileno()))
        identity["hashed_at_ns"] = time.time_ns()
        for chunk in iter(lambda: handle.read(HASH_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest(), round(time.monotonic() - started, 3), identity


def still_verified(path: str, expected: str, verified) -> dict | None:
    """The earlier verification `verified` (verify_digest's evidence) when it matched
    `expected` on this very file and the file has not changed since, else None."""
    if not isinstance(verified, dict) or not isinstance(verified.get("file"), dict):
        return None
    if verified.get("path") != path or verified.get("actual_sha256") != expected:
        return None
    hashed = dict(verified["file"])
    hashed_at_ns = hashed.pop("hashed_at_ns", None)
    if not isinstance(hashed_at_ns, int) or not isinstance(hashed.get("ctime_ns"), int):
        return None
    if hashed["ctime_ns"] > hashed_at_ns - int(SETTLED_SECONDS * 1e9):
        return None  # changed just before the hash: a write since may not show in its times
    try:
        current = file_identity(os.stat(path))
    except OSError:
        return None
    if current != hashed:
        return None
    return {**verified, "expected_sha256": expected, "reused": True}


def verify_digest(path: str, expected: str, phase: str = PHASE_IMAGE, verified=None) -> dict:
    """Hash the image and compare with the catalog digest; VmError when they differ.
    `verified`: an earlier verification in this provision, reused if the file is unchanged."""
    expected = str(expected).strip().lower().removeprefix("sha256:")
    if not SHA256_RE.match(expected):
        raise VmError("invalid_digest", f"{expected!r} is not a sha256 hex digest", phase)
    if not os.path.isfile(path):
        raise VmError("image_missing", f"image {path} does not exist in the node cache", phase)
    earlier = still_verified(path, expected, verified)
    if earlier:
        return earlier
    actual, seconds, identity = hash_file(path)
    evidence = {"path": path, "expected_sha256": expected, "actual_sha256": actual}
    evidence["seconds"] = seconds
    evidence["file"] = identity
    evidence["reused"] = False
    if actual != expected:
        raise VmError(
            "image_digest_mismatch",
            f"image {path} has sha256 {actual}, the catalog says {expected}",
            phase,
            digest=evidence,
        )
    return evidence


def image_info(path: str) -> dict:
    """`qemu-img info` of the image: format and virtual size."""
    proc = subprocess.run(
        ["qemu-img", "info", "--output=json", path],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if proc.returncode != 0:
        raise VmError(
            "image_unreadable", f"qemu-img info {path}: {proc.stderr.strip()}", PHASE_IMAGE
        )
    info = json.loads(proc.stdout)
    if info.get("format") not in IMAGE_FORMATS:
        raise VmError(
            "image_format_unsupported",
            f"{path} is {info.get('format')}; supported: {', '.join(IMAGE_FORMATS)}",
            PHASE_IMAGE,
        )
    return {"format": info["format"], "virtual_size": int(info["virtual-size"])}


def device_size(path: str) -> int:
    with open(path, "rb") as handle:
        return handle.seek(0, os.SEEK_END)


def clone_command(source: str, source_format: str, target: str) -> list[str]:
    """qemu-img onto an existing block device: no target creation (-n), direct I/O on
    the target (-t none), out-of-order writes (-W), progress on stdout (-p)."""
    return [
        "qemu-img",
        "convert",
        "-p",
        "-n",
        "-W",
        "-t",
        "none",
        "-f",
        source_format,
        "-O",
        "raw",
        source,
        target,
    ]


def run_clone(argv: list[str], timeout: float) -> dict:
    """Run qemu-img, sampling its progress; returns seconds, progress samples, rc."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    samples: list[dict] = []
    last_percent = -10.0
    buffer = b""
    while True:
        chunk = proc.stdout.read1(4096) if hasattr(proc.stdout, "read1") else proc.stdout.read(64)
        if not chunk:
            break
        buffer = (buffer + chunk)[-256:]
        for match in PROGRESS_RE.finditer(buffer):
            percent = float(match.group(1))
            if percent >= last_percent + 10 or percent >= 100.0 > last_percent:
                samples.append(
                    {"percent": percent, "seconds": round(time.monotonic() - started, 3)}
                )
                last_percent = percent
        buffer = buffer[buffer.rfind(b")") + 1 :] if b")" in buffer else buffer
        if time.monotonic() - started > timeout:
            proc.kill()
            break
    stderr = proc.stderr.read().decode(errors="replace")
    rc = proc.wait()
    return {
        "rc": rc,
        "stderr": stderr.strip(),
        "seconds": round(time.monotonic() - started, 3),
        "progress": samples,
    }


def clone_record_path(state_dir: str, device: str) -> str:
    return os.path.join(state_dir, f"clone-{os.path.basename(device)}.json")


def existing_clone(state_dir: str, device: str, sha256: str) -> dict | None:
    """The clone record of this image on this device, if the allocation already has it."""
    record = vm_common.read_json(clone_record_path(state_dir, device))
    expected = str(sha256).strip().lower().removeprefix("sha256:")
    if record and record.get("image_sha256") == expected and record.get("device") == device:
        return record
    return None


def clone_image(
    source: str,
    sha256: str,
    device: str,
    resolved_device: str,
    state_dir: str,
    check_mode: bool,
    verify: bool = True,
    timeout: float = 3600,
    verified=None,
) -> dict:
    """Verify the image (or reuse `verified`, see verify_digest), then clone it onto
    `resolved_device` unless already recorded."""
    record_path = clone_record_path(state_dir, device)
    expected = str(sha256).strip().lower().removeprefix("sha256:")
    record = existing_clone(state_dir, device, expected)
    if record:
        return {"changed": False, "skipped_reason": "already cloned", "record": record}
    digest = verify_digest(source, expected, verified=verified) if verify else None
    info = image_info(source)
    size = device_size(resolved_device)
    if info["virtual_size"] > size:
        raise VmError(
            "image_larger_than_disk",
            f"image virtual size {info['virtual_size']} exceeds {device} ({size} bytes)",
            PHASE_IMAGE,
        )
    argv = clone_command(source, info["format"], resolved_device)
    plan = {"command": " ".join(argv), "image": info, "device_size": size}
    if check_mode:
        return {"changed": True, "plan": plan, "digest": digest}
    outcome = run_clone(argv, timeout)
    if outcome["rc"] != 0:
        raise VmError(
            "clone_failed",
            f"qemu-img convert exited {outcome['rc']}: {outcome['stderr']}",
            PHASE_IMAGE,
            clone=outcome,
        )
    seconds = max(outcome["seconds"], 0.001)
    record = {
        "device": device,
        "resolved_device": resolved_device,
        "image_path": source,
        "image_sha256": expected,
        "image_format": info["format"],
        "bytes": info["virtual_size"],
        "seconds": outcome["seconds"],
        "throughput_mib_s": round(info["virtual_size"] / seconds / (1 << 20), 1),
        "progress": outcome["progress"],
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    hostfile.write_bytes(record_path, json.dumps(record, indent=2).encode(), mode=0o600)
    return {"changed": True, "plan": plan, "digest": digest, "record": record}


def run(params: dict, check_mode: bool) -> dict:
    """Module entry: refuse unless the disk is usable, then clone (once)."""
    name = vm_common.domain_name(params["allocation_id"])
    record = existing_clone(params["state_dir"], params["device"], params["sha256"])
    if record:
        return {"changed": False, "skipped_reason": "already cloned", "record": record}
    conn = vm_libvirt.open_libvirt(params["libvirt_uri"], PHASE_IMAGE)
    try:
        if vm_libvirt.lookup_domain(conn, name) is not None:
            raise VmError(
                "domain_exists",
                f"domain {name} exists but no clone record does: refusing to clone over "
                "a disk an allocation may already use; release it first",
                PHASE_IMAGE,
            )
        disk = vm_disk.inspect_slot_disk(
            params["device"], params["stable_dirs"], conn, name, own_defined=False
        )
    finally:
        conn.close()
    if disk["problems"]:
        first = disk["problems"][0]
        raise VmError(
            first["code"],
            "; ".join(p["message"] for p in disk["problems"]),
            PHASE_IMAGE,
            disk=disk,
        )
    outcome = clone_image(
        params["image"],
        params["sha256"],
        params["device"],
        disk["resolved_path"],
        params["state_dir"],
        check_mode,
        verify=params["verify_digest"],
        timeout=params["timeout"],
        verified=params.get("verified"),
    )
    return {**outcome, "disk": disk}
