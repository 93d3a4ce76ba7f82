# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Erase one tenant disk and prove it (schema gpuaas.wipe_proof/v1).

Refuse anything the host uses (mounts, including child partitions; OS disk; swap; holders;
other openers), then hold an O_EXCL claim on the disk for the whole operation so nothing can
mount or claim it meanwhile. Markers are written at the start, middle and end; the methods
run in order nvme_format -> blkdiscard -> write_zeroes -> zero (from the chosen one on), each
failure recorded with why; after a method the disk must show: markers gone, no signatures,
no partitions, every sampled region zero. Only then is the proof `verified`.

A verified proof is also kept in `proof_dir`; a rerun with the same approval on a disk that
has not been written since (same diskseq and write counter) and still verifies returns that
proof without erasing again.

Python stdlib only: this runs on target hosts.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    blockdev,
    evidence_signing,
    hostfile,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import (
    APPROVAL_REQUIRED,
    iso,
    utc_now,
)

PROOF_SCHEMA = "gpuaas.wipe_proof/v1"
METHODS = ("nvme_format", "blkdiscard", "write_zeroes", "zero")
MARKER_MAGIC = b"GPUAAS-WIPE-MARKER\0"
MARKER_SIZE = 4096
ALIGN = 4096  # O_DIRECT offsets: a multiple of any logical block size
ZERO_CHUNK = 4 * 1024 * 1024
NVME_NAMESPACE = re.compile(r"^nvme(\d+)n(\d+)$")
NVME_CONTROLLER = re.compile(r"^nvme\d+$")
NVME_FORMAT_TIMEOUT_MS = 30 * 60 * 1000

# Identify Controller bits (NVMe base spec): OACS bit 1 = Format NVM supported;
# FNA bit 0 = format applies to all namespaces, bit 1 = secure erase applies to all
# namespaces, bit 2 = cryptographic erase supported.
OACS_FORMAT = 0x2
FNA_FORMAT_ALL_NS = 0x1
FNA_ERASE_ALL_NS = 0x2
FNA_CRYPTO_ERASE = 0x4
SES_USER_DATA = 1
SES_CRYPTO = 2

# Wipe refuses everything the host uses; LVM/md signatures are tenant content to erase.
WIPE_TOLERATED_KINDS = (blockdev.CONTENT,)


class WipeError(Exception):
    pass


@dataclass(frozen=True)
class NvmeNamespace:
    """Where an NVMe namespace sits: the controller's character device (None when it has
    none), the namespace id and how many namespaces the controller has (None: unknown)."""

    controller_path: str | None
    nsid: int | None
    namespaces_on_controller: int | None


def nvme_namespace(kernel_name: str) -> NvmeNamespace | None:
    """The NVMe namespace behind a block device, from sysfs; None for anything else
    (including the per-path nodes of multipath NVMe such as nvme4c4n1)."""
    if not NVME_NAMESPACE.match(kernel_name):
        return None
    sys_dir = os.path.join(blockdev.SYS_BLOCK, kernel_name)
    controller = os.path.basename(os.path.realpath(os.path.join(sys_dir, "device")))
    nsid_text = blockdev.read_text(os.path.join(sys_dir, "nsid"))
    direct = NVME_CONTROLLER.match(controller) and os.path.exists(f"/dev/{controller}")
    siblings = [
        n
        for n in blockdev.listdir(os.path.join("/sys/class/nvme", controller))
        if NVME_NAMESPACE.match(n)
    ]
    return NvmeNamespace(
        controller_path=f"/dev/{controller}" if direct else None,
        nsid=int(nsid_text) if nsid_text.isdigit() else None,
        namespaces_on_controller=len(siblings) or None,
    )


@dataclass
class WipeRequest:
    device: str
    stable_dirs: list = field(default_factory=lambda: list(blockdev.DEFAULT_STABLE_DIRS))
    method: str = "auto"
    approval: str | None = None
    sample_count: int = 16
    sample_size: int = 1024 * 1024
    proof_dir: str = "/var/lib/gpuaas/wipe-proofs"
    allow_fallback: bool = True
    check_mode: bool = False
    # With a nonce, the proof returned is signed for the control plane (evidence_signing).
    node: str | None = None
    nonce: str | None = None
    signing_key: str = evidence_signing.DEFAULT_KEY_PATH
    # The NVMe boundary: which block devices are NVMe namespaces, and where their
    # controller is. Not a module option; a machine without NVMe hardware (the test lab)
    # passes a locator that declares one of its loop devices a namespace, so the live
    # `nvme id-ctrl` -> secure erase choice -> `nvme format` -> verification path runs
    # against an `nvme` stand-in on PATH.
    nvme_locator: Callable[[str], NvmeNamespace | None] = nvme_namespace


@dataclass
class NvmeFormatChoice:
    applicable: bool
    reason: str
    ses: int | None = None
    lbaf: int | None = None
    argv: list = field(default_factory=list)


# ---------------------------------------------------------------- method selection


def method_chain(method: str, allow_fallback: bool = True) -> list[str]:
    if method == "auto":
        return list(METHODS)
    if method not in METHODS:
        raise WipeError(f"unknown method {method!r}; choose auto or one of {METHODS}")
    start = METHODS.index(method)
    return list(METHODS[start:]) if allow_fallback else [method]


def _int(value) -> int:
    if isinstance(value, str):
        return int(value, 0)
    return int(value or 0)


def current_lbaf(id_ns: dict) -> int:
    """Index of the LBA format in use: FLBAS bits 3:0, plus bits 6:5 as the high bits."""
    flbas = _int(id_ns.get("flbas", 0))
    return (flbas & 0xF) | ((flbas >> 5 & 0x3) << 4)


def choose_nvme_format(
    namespace_path: str,
    id_ctrl: dict,
    id_ns: dict,
    namespaces_on_controller: int | None,
    controller_path: str | None = None,
    nsid: int | None = None,
) -> NvmeFormatChoice:
    """Secure-erase setting from Identify Controller: crypto erase if FNA says so, else user
    data erase; refuse when the erase would (or might) reach other namespaces.

    The command goes to the controller character device with the namespace id when known,
    so nvme-cli does not try to re-read the partition table of the block device we hold.
    """
    oacs = _int(id_ctrl.get("oacs", 0))
    fna = _int(id_ctrl.get("fna", 0))
    if not oacs & OACS_FORMAT:
        return NvmeFormatChoice(False, "controller does not support Format NVM (OACS bit 1)")
    if fna & (FNA_FORMAT_ALL_NS | FNA_ERASE_ALL_NS) and namespaces_on_controller != 1:
        count = (
            "an unknown number of"
            if namespaces_on_controller is None
            else (str(namespaces_on_controller))
        )
        return NvmeFormatChoice(
            False,
            f"format/secure erase applies to all namespaces (FNA={fna:#x}) and the controller "
            f"has {count} namespaces: it would erase other namespaces",
        )
    ses = SES_CRYPTO if fna & FNA_CRYPTO_ERASE else SES_USER_DATA
    lbaf = current_lbaf(id_ns)
    kind = "cryptographic erase" if ses == SES_CRYPTO else "user data erase"
    target = (
        [controller_path, f"--namespace-id={nsid}"]
        if controller_path and nsid
        else [namespace_path]
    )
    argv = ["nvme", "format", *target, f"--ses={ses}", f"--lbaf={lbaf}"]
    argv += [f"--timeout={NVME_FORMAT_TIMEOUT_MS}", "--force"]
    return NvmeFormatChoice(True, f"{kind} (FNA={fna:#x})", ses, lbaf, argv)


def probe_nvme_format(
    kernel_name: str,
    device_path: str,
    locate: Callable[[str], NvmeNamespace | None] = nvme_namespace,
) -> tuple[NvmeFormatChoice, list]:
    """Ask the drive (nvme id-ctrl/id-ns -o json); not applicable on anything but NVMe."""
    commands: list = []
    namespace = locate(kernel_name)
    if namespace is None:
        return NvmeFormatChoice(False, f"{kernel_name} is not an NVMe namespace"), commands
    documents = []
    for sub in ("id-ctrl", "id-ns"):
        result = blockdev.run_tool(["nvme", sub, device_path, "-o", "json"], timeout=60)
        commands.append(result.command)
        if result.rc != 0:
            return NvmeFormatChoice(False, f"nvme {sub} failed: {result.error}"), commands
        try:
            documents.append(json.loads(result.stdout))
        except ValueError as exc:
            return NvmeFormatChoice(False, f"nvme {sub} output is not JSON: {exc}"), commands
    choice = choose_nvme_format(
        device_path,
        documents[0],
        documents[1],
        namespace.namespaces_on_controller,
        controller_path=namespace.controller_path,
        nsid=namespace.nsid,
    )
    return choice, commands


# ---------------------------------------------------------------- direct I/O


def _aligned(length: int) -> mmap.mmap:
    return mmap.mmap(-1, max(length, mmap.PAGESIZE))


def read_region(path: str, offset: int, length: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        buf = _aligned(length)
        got = os.preadv(fd, [memoryview(buf)[:length]], offset)
        return bytes(buf[:got])
    finally:
        os.close(fd)


def write_region(path: str, offset: int, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        buf = _aligned(len(data))
        buf[: len(data)] = data
        os.pwritev(fd, [memoryview(buf)[: len(data)]], offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def zero_fill(path: str, size: int) -> None:
    """Overwrite the whole device with zeros (O_DIRECT, 4 MiB writes, fsync at the end)."""
    fd = os.open(path, os.O_WRONLY | os.O_DIRECT | os.O_CLOEXEC)
    try:
        buf = _aligned(ZERO_CHUNK)
        offset = 0
        while offset < size:
            length = min(ZERO_CHUNK, size - offset)
            written = os.pwritev(fd, [memoryview(buf)[:length]], offset)
            if written <= 0:
                raise OSError(f"short write at offset {offset}")
            offset += written
        os.fsync(fd)
    finally:
        os.close(fd)


def is_zero(data: bytes) -> bool:
    return not data.strip(b"\0")


# ---------------------------------------------------------------- markers and samples


def marker_offsets(size: int) -> list[int]:
    middle = (size // 2) // ALIGN * ALIGN
    return sorted({0, middle, (size - MARKER_SIZE) // ALIGN * ALIGN})


def make_marker(nonce: bytes, offset: int) -> bytes:
    head = MARKER_MAGIC + nonce + offset.to_bytes(8, "little")
    body = hashlib.sha256(head).digest() * ((MARKER_SIZE - len(head)) // 32 + 1)
    return (head + body)[:MARKER_SIZE]


def write_markers(path: str, size: int, nonce: bytes) -> list[dict]:
    markers = []
    for offset in marker_offsets(size):
        data = make_marker(nonce, offset)
        write_region(path, offset, data)
        markers.append(
            {"offset": offset, "written": read_region(path, offset, MARKER_SIZE) == data}
        )
    return markers


def sample_offsets(size: int, count: int, length: int, markers) -> list[int]:
    """First and last region, every marker, then unpredictable offsets (all recorded)."""
    last = max(0, (size - length) // ALIGN * ALIGN)
    chosen = {0, last} | {min(m["offset"] // ALIGN * ALIGN, last) for m in markers}
    slots = last // ALIGN + 1
    target = min(slots, max(count, len(chosen)))
    rng = secrets.SystemRandom()
    while len(chosen) < target:
        chosen.add(rng.randrange(slots) * ALIGN)
    return sorted(chosen)


def verify(
    path: str, kernel_name: str, size: int, nonce: bytes, markers, sample_count, sample_size
) -> dict:
    checked = [
        {
            "offset": m["offset"],
            "written": m["written"],
            "gone": read_region(path, m["offset"], MARKER_SIZE) != make_marker(nonce, m["offset"]),
        }
        for m in markers
    ]
    length = min(sample_size, size)
    samples = [
        {"offset": off, "length": length, "all_zero": is_zero(read_region(path, off, length))}
        for off in sample_offsets(size, sample_count, length, markers)
    ]
    signatures = [s.__dict__ for s in blockdev.probe_signatures(path)]
    partitions = blockdev.partition_names(kernel_name)
    problems = []
    if not all(m["written"] and m["gone"] for m in checked):
        problems.append("a marker was not written or is still readable")
    if signatures:
        problems.append(f"signatures remain: {[s['type'] for s in signatures]}")
    if partitions:
        problems.append(f"partitions remain: {partitions}")
    if not all(s["all_zero"] for s in samples):
        bad = [s["offset"] for s in samples if not s["all_zero"]]
        problems.append(f"sampled regions are not zero at offsets {bad}")
    return {
        "markers": checked,
        "samples": samples,
        "signatures_after": signatures,
        "partitions_after": partitions,
        "verified": not problems,
        "problems": problems,
    }


# ---------------------------------------------------------------- write counters, stored proofs


def write_state(kernel_name: str) -> dict:
    """diskseq changes when the device is re-attached; stat field 7 counts sectors written."""
    fields = blockdev.read_text(os.path.join(blockdev.SYS_BLOCK, kernel_name, "stat")).split()
    return {
        "diskseq": blockdev.read_text(os.path.join(blockdev.SYS_BLOCK, kernel_name, "diskseq")),
        "sectors_written": int(fields[6]) if len(fields) > 6 else None,
    }


def proof_path(proof_dir: str, device: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(device))
    return os.path.join(proof_dir, f"{name}.json")


def load_proof(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def store_proof(path: str, proof: dict) -> None:
    os.makedirs(os.path.dirname(path), mode=0o750, exist_ok=True)
    hostfile.write_bytes(
        path, (json.dumps(proof, indent=2, sort_keys=True) + "\n").encode(), mode=0o600
    )


def reusable_proof(request: WipeRequest, report: blockdev.DeviceReport) -> dict | None:
    """A stored verified proof for this approval on an untouched, still-clean disk."""
    stored = load_proof(proof_path(request.proof_dir, request.device))
    if not stored or stored.get("schema") != PROOF_SCHEMA or not stored.get("verified"):
        return None
    if stored.get("approval") != request.approval or stored.get("device") != request.device:
        return None
    if stored.get("write_state") != write_state(report.kernel_name):
        return None
    if report.signatures or report.partitions or stored.get("size_bytes") != report.size_bytes:
        return None
    size = report.size_bytes
    length = min(request.sample_size, size)
    offsets = sample_offsets(size, request.sample_count, length, [])
    if not all(is_zero(read_region(report.resolved_path, o, length)) for o in offsets):
        return None
    return stored


# ---------------------------------------------------------------- the wipe


def _attempt(method: str, ok: bool, error: str, command, seconds: float) -> dict:
    return {"method": method, "ok": ok, "error": error, "command": command, "seconds": seconds}


def run_method(
    method: str,
    path: str,
    kernel_name: str,
    size: int,
    commands: list,
    nvme_locator: Callable[[str], NvmeNamespace | None] = nvme_namespace,
) -> dict:
    """Run one erase method; returns an attempt record (ok only means the command worked)."""
    if method == "nvme_format":
        choice, probes = probe_nvme_format(kernel_name, path, nvme_locator)
        commands.extend(probes)
        if not choice.applicable:
            return _attempt(method, False, f"not applicable: {choice.reason}", None, 0.0)
        argv = choice.argv
    elif method == "blkdiscard":
        argv = ["blkdiscard", "--force", path]
    elif method == "write_zeroes":
        argv = ["blkdiscard", "--zeroout", "--force", path]
    else:
        command = f"pwrite zeros O_DIRECT bs={ZERO_CHUNK} {path} (in-process)"
        commands.append(command)
        started = time.monotonic()
        try:
            zero_fill(path, size)
        except OSError as exc:
            return _attempt(method, False, str(exc), command, time.monotonic() - started)
        return _attempt(method, True, "", command, round(time.monotonic() - started, 3))
    result = blockdev.run_tool(argv, timeout=86400)
    commands.append(result.command)
    attempt = _attempt(method, result.rc == 0, result.error, result.command, result.seconds)
    if method == "nvme_format":
        attempt["secure_erase"] = {"ses": choice.ses, "lbaf": choice.lbaf, "why": choice.reason}
    return attempt


def _claim(path: str) -> int:
    try:
        return os.open(path, os.O_RDWR | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        raise WipeError(f"cannot claim {path} exclusively: {exc.strerror}") from exc


def erase_and_verify(request: WipeRequest, report: blockdev.DeviceReport, proof: dict) -> None:
    path, kname, size = report.resolved_path, report.kernel_name, report.size_bytes
    nonce = secrets.token_bytes(16)
    claim = _claim(path)
    try:
        proof["markers"] = write_markers(path, size, nonce)
        for method in method_chain(request.method, request.allow_fallback):
            attempt = run_method(method, path, kname, size, proof["commands"], request.nvme_locator)
            proof["attempts"].append(attempt)
            if not attempt["ok"]:
                continue
            try:
                blockdev.reread_partitions(claim)
            except OSError as exc:
                attempt["reread_partitions_error"] = exc.strerror
            proof["commands"].append(f"ioctl BLKRRPART {path}")
            proof["commands"].append(f"wipefs --no-act --json {path}")
            started = time.monotonic()
            outcome = verify(
                path,
                kname,
                size,
                nonce,
                proof["markers"],
                request.sample_count,
                request.sample_size,
            )
            attempt["verify_seconds"] = round(time.monotonic() - started, 3)
            proof.update(
                method=method,
                markers=outcome["markers"],
                samples=outcome["samples"],
                signatures_after=outcome["signatures_after"],
                partitions_after=outcome["partitions_after"],
                verified=outcome["verified"],
            )
            if outcome["verified"]:
                return
            attempt.update(ok=False, error="verification failed: " + "; ".join(outcome["problems"]))
    finally:
        os.close(claim)


def new_proof(request: WipeRequest, report: blockdev.DeviceReport) -> dict:
    return {
        "schema": PROOF_SCHEMA,
        "device": request.device,
        "resolved_path": report.resolved_path,
        "kernel_name": report.kernel_name,
        "size_bytes": report.size_bytes,
        "host": socket.gethostname(),
        "method": None,
        "requested_method": request.method,
        "attempts": [],
        "commands": [],
        "started_at": None,
        "finished_at": None,
        "duration_s": None,
        "markers": [],
        "samples": [],
        "signatures_before": [s.__dict__ for s in report.signatures],
        "signatures_after": [],
        "partitions_after": [],
        "verified": False,
        "approval": request.approval,
    }


def run_wipe(request: WipeRequest) -> dict:
    """The module result: refusals change nothing; `failed` unless the proof is verified."""
    result = {"changed": False, "proof": None, "refused": [], "plan": []}
    try:
        chain = method_chain(request.method, request.allow_fallback)
    except WipeError as exc:
        return {**result, "failed": True, "msg": str(exc)}
    report = blockdev.inspect_device(request.device, request.stable_dirs)
    refused = [
        {"device": request.device, "code": f.code, "message": f.message}
        for f in report.blocking(tolerated_kinds=WIPE_TOLERATED_KINDS)
    ]
    if not request.check_mode and not (request.approval or "").strip():
        refused.append(
            {
                "device": request.device,
                "code": APPROVAL_REQUIRED,
                "message": "erasing a disk needs an approval reference (recorded in the proof)",
            }
        )
    result["inspection"] = report.to_dict()
    if refused:
        codes = ", ".join(r["code"] for r in refused)
        return {
            **result,
            "refused": refused,
            "failed": True,
            "msg": f"refused, nothing changed: {codes}",
        }
    result["plan"] = [
        {"action": "write_markers", "offsets": marker_offsets(report.size_bytes)},
        {"action": "erase", "methods": chain},
        {
            "action": "verify",
            "sample_count": request.sample_count,
            "sample_size": request.sample_size,
        },
    ]
    stored = reusable_proof(request, report) if request.approval else None
    if stored:
        return {
            **result,
            "proof": attested(request, report, stored),
            "reused_proof": True,
            "msg": "already wiped under this approval and untouched since; proof reused",
        }
    before = {
        "signatures": [s.__dict__ for s in report.signatures],
        "partitions": [p.path for p in report.partitions],
    }
    if request.check_mode:
        # what a verified wipe leaves: nothing
        result["diff"] = {"before": before, "after": {"signatures": [], "partitions": []}}
        return {**result, "changed": True, "msg": "check mode: would erase and verify"}

    proof = new_proof(request, report)
    started, clock = utc_now(), time.monotonic()
    proof["started_at"] = iso(started)
    try:
        erase_and_verify(request, report, proof)
    except (WipeError, OSError, blockdev.BlockDevError) as exc:
        proof["error"] = str(exc)
    proof["finished_at"] = iso(utc_now())
    proof["duration_s"] = round(time.monotonic() - clock, 3)
    proof["write_state"] = write_state(report.kernel_name)
    if proof["verified"]:
        store_proof(proof_path(request.proof_dir, request.device), proof)
    result.update(changed=bool(proof["markers"]), proof=attested(request, report, proof))
    result["diff"] = {"before": before, "after": observed_layout(report)}
    failed = [f"{a['method']}: {a['error']}" for a in proof["attempts"] if not a["ok"]]
    if proof["verified"]:
        fell_back = f"; fell back from {'; '.join(failed)}" if failed else ""
        return {**result, "msg": f"erased with {proof['method']} and verified{fell_back}"}
    why = proof.get("error") or "; ".join(failed)
    return {**result, "failed": True, "msg": f"wipe not verified: {why}"}


def attested(request: WipeRequest, report: blockdev.DeviceReport, proof: dict) -> dict:
    """The proof as returned: signed by the node for the control plane's nonce, naming the
    disk's identity, when a nonce was given (docs/trust.md, "Signed evidence")."""
    if not request.nonce:
        return proof
    return evidence_signing.sign_result(
        request.signing_key,
        "wipe_proof",
        request.node,
        request.nonce,
        proof,
        evidence_signing.disk_identity(report.kernel_name),
    )


def observed_layout(report: blockdev.DeviceReport) -> dict:
    """Signatures (disk and partitions) and partitions the disk shows now, probed afresh."""
    partitions = blockdev.partition_names(report.kernel_name)
    signatures = []
    for path in [report.resolved_path, *(f"/dev/{name}" for name in partitions)]:
        try:
            signatures.extend(s.__dict__ for s in blockdev.probe_signatures(path))
        except blockdev.BlockDevError as exc:
            signatures.append({"device": path, "error": str(exc)})
    return {"signatures": signatures, "partitions": [f"/dev/{name}" for name in partitions]}
