# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Convert infra-approved whole disks from host-share use to slice-owned raw disks.

Validate every device first (nothing is touched if any one is refused), then:
back up fstab, unmount the child mounts, claim each disk exclusively (proof that nothing,
in any mount namespace, still uses it), comment their fstab entries with the
`gpuaas-slice-storage-disabled` marker, wipefs the children and the parent, blkdiscard
(zeroing fallback when discard is unsupported), re-read the partition table, verify nothing
is left, and write a JSON manifest of everything done.

Python stdlib only: this runs on target hosts.
"""

from __future__ import annotations

import datetime
import errno
import json
import os
import re
import socket
from dataclasses import dataclass, field

from ansible_collections.gpuaas.fleet.plugins.module_utils import blockdev, hostfile, procfs

MARKER = "gpuaas-slice-storage-disabled"
MANIFEST_SCHEMA = "gpuaas.storage_transition/v1"
BACKUP_INFIX = ".gpuaas-slice-storage-backup-"
MANIFEST_PREFIX = "slice-storage-transition-"

# Codes raised here in addition to blockdev's inspection codes.
APPROVAL_REQUIRED = "approval_required"
APPROVED_DEVICES_REQUIRED = "approved_devices_required"
NOT_APPROVED = "not_approved"
DUPLICATE_DEVICE = "duplicate_device"
AMBIGUOUS_FSTAB_ENTRY = "ambiguous_fstab_entry"
NO_DEVICES = "no_devices"
INSPECTION_FAILED = "inspection_failed"

# Mounts of the disk itself or its children are what the transition removes.
UNMOUNTABLE_CODES = (blockdev.MOUNTED, blockdev.CHILD_MOUNTED)
IDENTITY_KEYS = ("UUID", "LABEL", "PARTUUID", "PARTLABEL")
BY_DIRS = {
    "/dev/disk/by-uuid/": "UUID",
    "/dev/disk/by-label/": "LABEL",
    "/dev/disk/by-partuuid/": "PARTUUID",
    "/dev/disk/by-partlabel/": "PARTLABEL",
}


class TransitionError(Exception):
    """The apply phase failed part-way; `result` holds what was done (for the manifest)."""

    def __init__(self, message: str, result: dict):
        super().__init__(message)
        self.result = result


@dataclass
class TransitionRequest:
    devices: list
    stable_dirs: list = field(default_factory=lambda: list(blockdev.DEFAULT_STABLE_DIRS))
    approval: str | None = None
    apply: bool = False
    fstab_path: str = "/etc/fstab"
    manifest_dir: str = "/var/log/gpuaas"
    discard: bool = True
    approved_devices: list | None = None
    check_mode: bool = False


@dataclass
class DevicePlan:
    device: str
    report: blockdev.DeviceReport
    identities: list = field(default_factory=list)
    unmounts: list = field(default_factory=list)
    wipe_children: list = field(default_factory=list)
    wipe_parent: bool = False
    fstab_lines: list = field(default_factory=list)

    @property
    def needs_wipe(self) -> bool:
        return self.wipe_parent or bool(self.wipe_children)

    @property
    def actions(self) -> list[dict]:
        steps = [{"action": "umount", "target": m} for m in self.unmounts]
        steps += [
            {"action": "disable_fstab_entry", "target": line["original"], "line": line["line"]}
            for line in self.fstab_lines
        ]
        steps += [{"action": "wipefs", "target": c} for c in self.wipe_children]
        if self.wipe_parent:
            steps.append({"action": "wipefs", "target": self.report.resolved_path})
        if self.needs_wipe:
            steps.append({"action": "blkdiscard", "target": self.report.resolved_path})
            steps.append({"action": "verify_raw", "target": self.report.resolved_path})
        return steps


def utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def iso(ts: datetime.datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- fstab


def fstab_fields(line: str) -> list[str] | None:
    stripped = line.strip()
    if not stripped or stripped.startswith("#"):
        return None
    return [procfs.unescape_octal(f) for f in stripped.split()]


def device_identities(path: str, devnum: int | None, identities: dict) -> dict:
    """Everything an fstab spec may use to name one device (partition or whole disk)."""
    return {"path": path, "devnum": devnum, **{k: identities.get(k) for k in IDENTITY_KEYS}}


def _udev_unescape(text: str) -> str:
    r"""/dev/disk/by-label names encode unsafe characters as \xNN."""
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def spec_matches(spec: str, ident: dict) -> str | None:
    """How an fstab spec names this device ('UUID', 'path', ...) or None."""
    key, sep, value = spec.partition("=")
    if sep and key.upper() in IDENTITY_KEYS:
        value = value.strip("\"'")
        wanted = ident.get(key.upper())
        if wanted is None:
            return None
        same = value.lower() == wanted.lower() if key.upper().endswith("UUID") else value == wanted
        return key.upper() if same else None
    if not spec.startswith("/"):
        return None
    for prefix, id_key in BY_DIRS.items():
        if spec.startswith(prefix):
            wanted = ident.get(id_key)
            name = _udev_unescape(spec[len(prefix) :])
            if wanted is not None and (name == wanted or name.lower() == wanted.lower()):
                return id_key
    if os.path.normpath(spec) == ident["path"]:
        return "path"
    try:
        st = os.stat(spec)
    except OSError:
        return None
    if ident["devnum"] is not None and st.st_rdev == ident["devnum"] and st.st_rdev:
        return "path"
    return None


def match_fstab(text: str, identities: list[dict]) -> list[dict]:
    matches = []
    for number, line in enumerate(text.splitlines(), 1):
        fields = fstab_fields(line)
        if not fields:
            continue
        for ident in identities:
            how = spec_matches(fields[0], ident)
            if how:
                matches.append(
                    {
                        "line": number,
                        "original": line,
                        "spec": fields[0],
                        "mountpoint": fields[1] if len(fields) > 1 else "",
                        "device": ident["path"],
                        "matched_by": how,
                    }
                )
                break
    return matches


def disable_lines(text: str, line_numbers) -> str:
    wanted = set(line_numbers)
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if index + 1 in wanted:
            body = line.rstrip("\n")
            lines[index] = f"# {MARKER} {body}\n"
    return "".join(lines)


def unique_path(base: str, suffix: str = "") -> str:
    candidate, counter = base + suffix, 1
    while os.path.exists(candidate):
        candidate = f"{base}-{counter}{suffix}"
        counter += 1
    return candidate


# ---------------------------------------------------------------- planning


def _normalized(paths) -> set[str]:
    return {os.path.normpath(p) for p in paths or []}


def plan_device(device: str, report: blockdev.DeviceReport) -> DevicePlan:
    plan = DevicePlan(device=device, report=report)
    # One umount per mount, deepest mountpoint first, so nested bind mounts of the same
    # filesystem come off first; a mountpoint holding it twice (bound onto itself) twice.
    plan.unmounts = sorted(
        (m.mountpoint for m in report.mounts), key=lambda m: (-m.rstrip("/").count("/"), m)
    )
    signed = {s.device for s in report.signatures}
    plan.wipe_children = [p.path for p in report.partitions if p.path in signed]
    plan.wipe_parent = report.resolved_path in signed or bool(report.partitions)
    plan.identities = [
        device_identities(
            report.resolved_path,
            os.stat(report.resolved_path).st_rdev,
            report.identities,
        )
    ] + [
        device_identities(
            p.path, os.stat(p.path).st_rdev if os.path.exists(p.path) else None, p.identities
        )
        for p in report.partitions
    ]
    return plan


def validate(request: TransitionRequest) -> tuple[list[DevicePlan], list[dict]]:
    """Inspect every device; nothing is changed. Returns plans and refusals."""
    refused: list[dict] = []
    plans: list[DevicePlan] = []
    approved = _normalized(request.approved_devices) if request.approved_devices else None
    seen: dict[str, str] = {}
    if not request.devices:
        refused.append({"device": "", "code": NO_DEVICES, "message": "devices is empty"})
    if request.apply and approved is None:
        refused.append(
            {
                "device": "",
                "code": APPROVED_DEVICES_REQUIRED,
                "message": "apply=true needs approved_devices, the infra-approved storage "
                "profile: only whole disks on it are ever transitioned",
            }
        )
    for device in request.devices:
        if request.apply and not (request.approval or "").strip():
            refused.append(
                {
                    "device": device,
                    "code": APPROVAL_REQUIRED,
                    "message": "apply=true needs an approval reference (recorded in the manifest)",
                }
            )
        if approved is not None and os.path.normpath(device) not in approved:
            refused.append(
                {
                    "device": device,
                    "code": NOT_APPROVED,
                    "message": f"{device} is not on the infra-approved device list",
                }
            )
        try:
            report = blockdev.inspect_device(device, request.stable_dirs)
        except (blockdev.BlockDevError, OSError, ValueError) as exc:
            refused.append({"device": device, "code": INSPECTION_FAILED, "message": str(exc)})
            continue
        for finding in report.blocking(tolerated_codes=UNMOUNTABLE_CODES):
            refused.append({"device": device, "code": finding.code, "message": finding.message})
        if report.kernel_name:
            if report.kernel_name in seen:
                refused.append(
                    {
                        "device": device,
                        "code": DUPLICATE_DEVICE,
                        "message": f"{device} and {seen[report.kernel_name]} are both "
                        f"/dev/{report.kernel_name}",
                    }
                )
            seen[report.kernel_name] = device
        if not report.blocking(tolerated_codes=UNMOUNTABLE_CODES):
            plans.append(plan_device(device, report))
    return plans, refused


def attach_fstab(plans: list[DevicePlan], fstab_text: str) -> list[dict]:
    """Match fstab lines to each plan; refuse lines whose tag also names another device
    (a cloned UUID, a reused LABEL): disabling them could unmount the host's own data."""
    refused = []
    for plan in plans:
        plan.fstab_lines = match_fstab(fstab_text, plan.identities)
        ours = {i["path"] for i in plan.identities}
        for line in plan.fstab_lines:
            if line["matched_by"] == "path":
                continue
            value = next(
                i[line["matched_by"]] for i in plan.identities if i["path"] == line["device"]
            )
            try:
                owners = blockdev.tag_owners(line["matched_by"], value)
            except blockdev.BlockDevError as exc:
                refused.append(
                    {"device": plan.device, "code": INSPECTION_FAILED, "message": str(exc)}
                )
                continue
            others = [d for d in owners if d not in ours]
            if others:
                refused.append(
                    {
                        "device": plan.device,
                        "code": AMBIGUOUS_FSTAB_ENTRY,
                        "message": f"fstab line {line['line']} ({line['spec']}) also names "
                        f"{', '.join(others)}",
                    }
                )
    return refused


def read_fstab(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except FileNotFoundError:
        return ""


# ---------------------------------------------------------------- applying


def _record(actions: list, action: str, target: str, result=None, **extra) -> dict:
    entry = {"action": action, "target": target, "ok": True, "error": "", **extra}
    if result is not None:
        entry.update(
            command=result.command, ok=result.rc == 0, error=result.error, seconds=result.seconds
        )
    actions.append(entry)
    return entry


def _unmount(plan: DevicePlan, actions: list) -> None:
    for mountpoint in plan.unmounts:
        result = blockdev.run_tool(["umount", mountpoint], timeout=300)
        if not _record(actions, "umount", mountpoint, result)["ok"]:
            raise RuntimeError(result.error)


def _claim(report: blockdev.DeviceReport) -> int:
    path = report.resolved_path
    try:
        return os.open(path, os.O_RDWR | os.O_EXCL | os.O_CLOEXEC)
    except OSError as exc:
        why = exc.strerror
        if exc.errno == errno.EBUSY:
            where = blockdev.where_mounted(report.kernel_name)
            why = "still in use" + (f", still mounted: {'; '.join(where)}" if where else "")
        raise RuntimeError(f"cannot claim {path} exclusively: {why}") from exc


def _wipe_device(plan: DevicePlan, claim_fd: int, discard: bool, actions: list) -> dict:
    """wipefs children then parent, re-read partitions, discard; we hold the O_EXCL claim."""
    parent = plan.report.resolved_path
    for target in [*plan.wipe_children, *([parent] if plan.wipe_parent else [])]:
        result = blockdev.run_tool(["wipefs", "--all", "--force", target], timeout=300)
        if not _record(actions, "wipefs", target, result)["ok"]:
            raise RuntimeError(result.error)
    blockdev.reread_partitions(claim_fd)
    _record(actions, "reread_partition_table", parent, command="ioctl BLKRRPART")
    if not discard:
        _record(actions, "discard_skipped", parent, reason="discard=false")
        return {"status": "skipped"}
    result = blockdev.run_tool(["blkdiscard", "--force", parent], timeout=3600)
    _record(actions, "blkdiscard", parent, result)
    if result.rc == 0:
        return {"status": "discarded"}
    zero = blockdev.run_tool(["blkdiscard", "--zeroout", "--force", parent], timeout=86400)
    _record(actions, "zeroout_fallback", parent, zero, reason=result.error)
    if zero.rc != 0:
        raise RuntimeError(f"discard failed ({result.error}) and zeroing failed ({zero.error})")
    return {"status": "zeroed", "discard_error": result.error}


def _verify_raw(plan: DevicePlan) -> dict:
    parent = plan.report.resolved_path
    signatures = [s.__dict__ for s in blockdev.probe_signatures(parent)]
    partitions = blockdev.partition_names(plan.report.kernel_name)
    return {
        "signatures": signatures,
        "partitions": partitions,
        "raw": not signatures and not partitions,
    }


def _device_summary(plan: DevicePlan) -> dict:
    r = plan.report
    return {
        "partitions": [p.__dict__ for p in r.partitions],
        "signatures": [s.__dict__ for s in r.signatures],
        "mounts": [m.__dict__ for m in r.mounts],
    }


def apply_plans(request: TransitionRequest, plans: list[DevicePlan], fstab_text: str) -> dict:
    """The destructive phase. Raises TransitionError with the partial record on failure."""
    stamp = utc_now()
    state = {
        "fstab_backup": None,
        "fstab_rewritten": False,
        "devices": {p.device: [] for p in plans},
        "outcome": {},
    }
    active = [p for p in plans if p.actions]
    claims: dict[str, int] = {}
    try:
        lines = sorted({line["line"] for p in active for line in p.fstab_lines})
        if lines:
            backup = unique_path(request.fstab_path + BACKUP_INFIX + stamp.strftime("%Y%m%d%H%M%S"))
            hostfile.write_bytes(backup, fstab_text.encode(), like=request.fstab_path)
            state["fstab_backup"] = backup
        for plan in active:
            _unmount(plan, state["devices"][plan.device])
        # Claim before rewriting fstab: a disk still held (e.g. by a copy of its mount in a
        # mount namespace created after the plan) stops the run with fstab untouched.
        wiping = [p for p in active if p.needs_wipe]
        for plan in wiping:
            claims[plan.device] = _claim(plan.report)
            _record(state["devices"][plan.device], "claim_exclusive", plan.report.resolved_path)
        if lines:
            try:
                hostfile.write_bytes(
                    request.fstab_path,
                    disable_lines(fstab_text, lines).encode(),
                    like=request.fstab_path,
                )
            except OSError as exc:
                raise RuntimeError(
                    f"cannot rewrite {request.fstab_path}: {exc.strerror or exc}"
                ) from exc
            state["fstab_rewritten"] = True
            for plan in active:
                for line in plan.fstab_lines:
                    _record(
                        state["devices"][plan.device],
                        "disable_fstab_entry",
                        line["original"],
                        line=line["line"],
                        matched_by=line["matched_by"],
                    )
        for plan in active:
            if not plan.needs_wipe:
                state["outcome"][plan.device] = {
                    "discard": {"status": "not_needed"},
                    "after": _verify_raw(plan),
                }
        for plan in wiping:
            actions = state["devices"][plan.device]
            discard = _wipe_device(plan, claims[plan.device], request.discard, actions)
            after = _verify_raw(plan)
            _record(
                actions,
                "verify_raw",
                plan.report.resolved_path,
                ok=after["raw"],
                error="" if after["raw"] else f"left behind: {after}",
            )
            state["outcome"][plan.device] = {"discard": discard, "after": after}
            if not after["raw"]:
                raise RuntimeError(f"{plan.device} is not raw after the transition: {after}")
    except (RuntimeError, OSError, blockdev.BlockDevError) as exc:
        raise TransitionError(str(exc), state) from exc
    finally:
        for fd in claims.values():
            os.close(fd)
    return state


# ---------------------------------------------------------------- manifest and result


def write_manifest(manifest_dir: str, manifest: dict, stamp: datetime.datetime) -> str:
    os.makedirs(manifest_dir, mode=0o750, exist_ok=True)
    base = os.path.join(manifest_dir, MANIFEST_PREFIX + stamp.strftime("%Y%m%d%H%M%S"))
    path = unique_path(base, ".json")
    hostfile.write_bytes(
        path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode(), mode=0o600
    )
    return path


def _device_result(plan: DevicePlan, status: str, actions=None, outcome=None) -> dict:
    r = plan.report
    result = {
        "device": plan.device,
        "resolved_path": r.resolved_path,
        "kernel_name": r.kernel_name,
        "size_bytes": r.size_bytes,
        "status": status,
        "before": _device_summary(plan),
        "fstab_entries": plan.fstab_lines,
        "actions": actions if actions is not None else plan.actions,
    }
    if outcome:
        result.update(discard=outcome["discard"], after=outcome["after"])
    return result


def _done_before_failure(state: dict) -> str:
    """What the operator has to know to recover: what is unmounted, fstab, what is wiped."""
    done = [a for actions in state["devices"].values() for a in actions if a["ok"]]
    unmounted = [a["target"] for a in done if a["action"] == "umount"]
    wiped = sorted({a["target"] for a in done if a["action"] == "wipefs"})
    if state["fstab_rewritten"]:
        fstab = f"fstab entries disabled (original in {state['fstab_backup']})"
    elif state["fstab_backup"]:
        fstab = f"fstab unchanged (backup {state['fstab_backup']} kept)"
    else:
        fstab = "fstab unchanged"
    return (
        f"Done before the failure: unmounted {', '.join(unmounted) or 'nothing'}; {fstab}; "
        f"signatures wiped on {', '.join(wiped) or 'nothing'}"
    )


def run_transition(request: TransitionRequest) -> dict:
    """Plan, and when asked, apply. Returns the module result (with 'failed' on errors)."""
    started = utc_now()
    result = {
        "changed": False,
        "plan": [],
        "devices": [],
        "refused": [],
        "manifest_path": None,
        "manifest": None,
        "fstab_backup": None,
    }
    plans, refused = validate(request)
    fstab_text = read_fstab(request.fstab_path)
    refused += attach_fstab(plans, fstab_text)
    result["plan"] = [
        {"device": p.device, "resolved_path": p.report.resolved_path, "actions": p.actions}
        for p in plans
    ]
    if refused:
        result.update(
            refused=refused,
            failed=True,
            msg="refused, nothing changed: "
            + "; ".join(f"{r['device']}: {r['code']}" for r in refused),
        )
        return result
    will_change = any(p.actions for p in plans)
    lines = sorted({line["line"] for p in plans for line in p.fstab_lines})
    result["diff"] = {
        "before_header": request.fstab_path,
        "after_header": request.fstab_path,
        "before": fstab_text,
        "after": disable_lines(fstab_text, lines),
    }
    if not request.apply or request.check_mode:
        status = "would_transition" if request.apply else "planned"
        result["devices"] = [_device_result(p, status if p.actions else "raw") for p in plans]
        result["changed"] = bool(request.apply and will_change)
        result["msg"] = "plan only" if not request.apply else "check mode: nothing changed"
        return result
    if not will_change:
        result["devices"] = [_device_result(p, "raw", actions=[]) for p in plans]
        result["msg"] = "every device is already raw; nothing to do"
        return result

    failure = None
    try:
        state = apply_plans(request, plans, fstab_text)
    except TransitionError as exc:
        state, failure = exc.result, str(exc)
    result["changed"] = True
    result["fstab_backup"] = state["fstab_backup"]
    result["devices"] = [
        _device_result(
            p,
            "transitioned" if p.device in state["outcome"] else ("failed" if p.actions else "raw"),
            actions=state["devices"][p.device],
            outcome=state["outcome"].get(p.device),
        )
        for p in plans
    ]
    finished = utc_now()
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "status": "failed" if failure else "completed",
        "error": failure,
        "approval": request.approval,
        "host": socket.gethostname(),
        "started_at": iso(started),
        "finished_at": iso(finished),
        "fstab_path": request.fstab_path,
        "fstab_backup": state["fstab_backup"],
        "fstab_rewritten": state["fstab_rewritten"],
        "marker": MARKER,
        "discard_requested": request.discard,
        "devices": result["devices"],
    }
    result["manifest"] = manifest
    result["manifest_path"] = write_manifest(request.manifest_dir, manifest, started)
    if failure:
        result.update(
            failed=True,
            msg=f"transition failed part-way: {failure}. {_done_before_failure(state)}; "
            f"manifest {result['manifest_path']}",
        )
    else:
        result["msg"] = f"{sum(1 for p in plans if p.actions)} device(s) are now raw"
    return result
