# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""NoCloud seed ISO (volume label `cidata`) for one slice allocation.

The seed carries `user-data` (a `#cloud-config` with the hostname and the users with their
`ssh_authorized_keys`, always including the node's terminal relay key), `meta-data`
(`instance-id` = allocation id, `local-hostname`) and `network-config` (version 2, DHCP on
the NIC with the reserved MAC). Given the guest's host key (generated for this allocation
by the control plane, which keeps its public half), user-data makes it the guest's only
SSH host key, so the readiness gate can pin it (docs/trust.md); the private half is
withheld from everything the module reports. Scalars are written as JSON strings, which
YAML reads as plain strings, so no key comment or user name can change the document's
structure.

The ISO is written with pycdlib (ISO9660 + Joliet + Rock Ridge, so the file names keep
their dashes). Idempotence compares the files inside an existing ISO with the desired
ones, not the ISO bytes (those carry creation timestamps).
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import tempfile

try:
    import pycdlib

    HAS_PYCDLIB = True
    PYCDLIB_IMPORT_ERROR = None
except ImportError as exc:  # reported by the module with missing_required_lib
    pycdlib = None
    HAS_PYCDLIB = False
    PYCDLIB_IMPORT_ERROR = exc

from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile, vm_common
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import PHASE_SEED, VmError

VOLUME_LABEL = "cidata"
SEED_FILES = ("user-data", "meta-data", "network-config")
# ISO9660 level-1 names of the seed files (8.3, upper case); Joliet/Rock Ridge keep the
# real names that cloud-init reads.
ISO_NAMES = {
    "user-data": "/USERDATA.;1",
    "meta-data": "/METADATA.;1",
    "network-config": "/NETWORKC.;1",
}
SSH_KEY_RE = re.compile(
    r"^(ssh-ed25519|ssh-rsa|ecdsa-sha2-nistp(256|384|521)|"
    r"sk-ssh-ed25519@openssh\.com|sk-ecdsa-sha2-nistp256@openssh\.com)"
    r" [A-Za-z0-9+/]+={0,3}( [^\r\n]*)?$"
)
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
HOSTNAME_RE = re.compile(r"^(?=.{1,63}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
PRIVATE_KEY_RE = re.compile(
    r"\A-----BEGIN OPENSSH PRIVATE KEY-----\n"
    r"[A-Za-z0-9+/=\n]+"
    r"-----END OPENSSH PRIVATE KEY-----\n?\Z"
)
WITHHELD = "<private host key withheld>"


def _q(value) -> str:
    return json.dumps(str(value))


def validate_key(key: str, where: str) -> str:
    text = str(key).strip()
    if not SSH_KEY_RE.match(text):
        raise VmError(
            "invalid_ssh_key",
            f"{where}: not a single-line OpenSSH public key: {text[:40]!r}...",
            PHASE_SEED,
        )
    return text


def normalize_users(users, relay_key: str = "", relay_pending: bool = False) -> list[dict]:
    """Validate users; append the terminal relay key to every user's keys (deduplicated).
    ``relay_pending``: the relay key is not read yet but will be appended, so a user without
    keys of its own is accepted."""
    if not users:
        raise VmError("no_users", "at least one cloud-init user is required", PHASE_SEED)
    relay = validate_key(relay_key, "terminal relay key") if relay_key else ""
    normalized = []
    seen = set()
    for index, user in enumerate(users):
        name = str(user.get("name", ""))
        if not USER_RE.match(name):
            raise VmError("invalid_user", f"user {index}: invalid user name {name!r}", PHASE_SEED)
        if name in seen:
            raise VmError("invalid_user", f"user {name} is listed twice", PHASE_SEED)
        seen.add(name)
        keys = [validate_key(k, f"user {name}") for k in user.get("ssh_authorized_keys") or []]
        if relay and relay not in keys:
            keys.append(relay)
        if not keys and not relay_pending:
            raise VmError("no_ssh_keys", f"user {name} has no ssh_authorized_keys", PHASE_SEED)
        normalized.append(
            {
                "name": name,
                "shell": str(user.get("shell") or "/bin/bash"),
                "sudo": str(user.get("sudo") or ""),
                "ssh_authorized_keys": keys,
            }
        )
    return normalized


def validate_host_key(private_key: str, public_key: str) -> tuple[str, str]:
    """The guest's ed25519 host key pair as cloud-init's ``ssh_keys`` takes it."""
    public = validate_key(public_key, "guest host key")
    if not public.startswith("ssh-ed25519 "):
        raise VmError("host_key_invalid", "the guest host key must be ssh-ed25519", PHASE_SEED)
    private = private_key.strip() + "\n"
    if not PRIVATE_KEY_RE.match(private):
        raise VmError(
            "host_key_invalid",
            "the guest's private host key must be an unencrypted OpenSSH private key",
            PHASE_SEED,
        )
    return private, public


def render_user_data(hostname: str, users: list[dict], host_key=None) -> str:
    """``host_key``: (private, public) of the guest's only SSH host key, or None."""
    lines = [
        "#cloud-config",
        f"hostname: {_q(hostname)}",
        "preserve_hostname: false",
        "ssh_pwauth: false",
        "disable_root: true",
    ]
    if host_key:
        lines += [
            "ssh_deletekeys: true",
            "ssh_genkeytypes: []",
            "ssh_keys:",
            f"  ed25519_private: {_q(host_key[0])}",
            f"  ed25519_public: {_q(host_key[1])}",
        ]
    lines.append("users:")
    for user in users:
        lines.append(f"  - name: {_q(user['name'])}")
        lines.append("    lock_passwd: true")
        lines.append(f"    shell: {_q(user['shell'])}")
        if user["sudo"]:
            lines.append(f"    sudo: {_q(user['sudo'])}")
        lines.append("    ssh_authorized_keys:")
        lines.extend(f"      - {_q(key)}" for key in user["ssh_authorized_keys"])
    return "\n".join(lines) + "\n"


def render_meta_data(instance_id: str, hostname: str) -> str:
    return f"instance-id: {_q(instance_id)}\nlocal-hostname: {_q(hostname)}\n"


def render_network_config(mac_address: str) -> str:
    mac = vm_common.normalize_mac(mac_address)
    return (
        "version: 2\n"
        "ethernets:\n"
        "  mgmt0:\n"
        "    match:\n"
        f"      macaddress: {_q(mac)}\n"
        "    dhcp4: true\n"
    )


def check_hostname(hostname) -> None:
    if not HOSTNAME_RE.match(str(hostname)):
        raise VmError("invalid_hostname", f"{hostname!r} is not a valid host name", PHASE_SEED)


def seed_files(
    instance_id: str, hostname: str, users, mac_address: str, relay_key: str = "", host_key=None
):
    """The desired seed contents: {file name: bytes}."""
    check_hostname(hostname)
    normalized = normalize_users(users, relay_key)
    return {
        "user-data": render_user_data(hostname, normalized, host_key).encode(),
        "meta-data": render_meta_data(instance_id, hostname).encode(),
        "network-config": render_network_config(mac_address).encode(),
    }


def build_iso(files: dict) -> bytes:
    if not HAS_PYCDLIB:
        raise VmError("pycdlib_missing", "pycdlib is not installed", PHASE_SEED)
    iso = pycdlib.PyCdlib()
    iso.new(joliet=3, rock_ridge="1.09", vol_ident=VOLUME_LABEL)
    for name in SEED_FILES:
        data = files[name]
        iso.add_fp(
            io.BytesIO(data), len(data), ISO_NAMES[name], rr_name=name, joliet_path=f"/{name}"
        )
    out = io.BytesIO()
    iso.write_fp(out)
    iso.close()
    return out.getvalue()


def read_iso(path: str) -> dict | None:
    """The seed files inside an existing ISO, or None if it is missing or unreadable."""
    if not HAS_PYCDLIB or not os.path.exists(path):
        return None
    label = volume_label(path)
    if label != VOLUME_LABEL:
        return {"volume-label": label.encode()}
    iso = pycdlib.PyCdlib()
    try:
        iso.open(path)
    except (pycdlib.pycdlibexception.PyCdlibException, OSError):
        return None
    files = {}
    try:
        for name in SEED_FILES:
            buffer = io.BytesIO()
            try:
                iso.get_file_from_iso_fp(buffer, joliet_path=f"/{name}")
            except pycdlib.pycdlibexception.PyCdlibException:
                continue
            files[name] = buffer.getvalue()
    finally:
        iso.close()
    return files


def volume_label(path: str) -> str:
    """ISO9660 volume identifier (primary volume descriptor, sector 16, byte 40)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(16 * 2048 + 40)
            return handle.read(32).decode("ascii", errors="replace").strip()
    except OSError:
        return ""


def withheld(files, secret: str):
    """``files`` as reported: the secret (as the seed writes it) replaced."""
    if not files or not secret:
        return files
    written = _q(secret).encode()
    return {name: data.replace(written, _q(WITHHELD).encode()) for name, data in files.items()}


# The slice's state directory (seed, console log) is searchable by all and listable by
# root only: QEMU runs as libvirt's unprivileged user, which libvirt makes the seed's owner
# for the domain's life but cannot give a way through a directory closed to it (a 0750
# directory failed every start on a Debian host; docs/slice-host.md, "Slice state").
STATE_DIR_MODE = 0o711
SEED_MODE = 0o640


def _mode_of(path: str):
    try:
        return os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def ensure_seed(path: str, files: dict, check_mode: bool, secret: str = "") -> dict:
    """Write the ISO at `path` unless it already holds exactly `files`, and keep its
    directory searchable by QEMU; ``secret`` (the guest's private host key) never appears in
    the result or the diff."""
    current = read_iso(path)
    directory = os.path.dirname(os.path.abspath(path))
    directory_mode = _mode_of(directory)
    rewrite = current != files
    reopen = directory_mode is not None and directory_mode != STATE_DIR_MODE
    changed = rewrite or reopen
    result = {
        "changed": changed,
        "path": path,
        "files": {name: data.decode() for name, data in withheld(files, secret).items()},
        "diff": {
            "before_header": path,
            "after_header": path,
            "before": _diff_text(withheld(current, secret)),
            "after": _diff_text(withheld(files, secret)),
        },
    }
    if reopen:
        result["diff"]["before_header"] += f" (directory mode {directory_mode:04o})"
        result["diff"]["after_header"] += f" (directory mode {STATE_DIR_MODE:04o})"
    if check_mode:
        return result
    if rewrite:
        hostfile.write_bytes(path, build_iso(files), mode=SEED_MODE, dir_mode=STATE_DIR_MODE)
    # makedirs applies the umask, and an older provision left the directory 0750.
    if _mode_of(directory) != STATE_DIR_MODE:
        os.chmod(directory, STATE_DIR_MODE)
    return result


def _diff_text(files) -> str:
    if not files:
        return ""
    return "".join(
        f"--- {name}\n{data.decode(errors='replace') if isinstance(data, bytes) else data}"
        for name, data in sorted(files.items())
    )


def make_relay_key(path: str, directory: str) -> None:
    """A new ed25519 pair at `path`, moved into place whole (the caller holds its lock)."""
    with tempfile.TemporaryDirectory(prefix=".relay-key.", dir=directory) as scratch:
        made = os.path.join(scratch, "key")
        proc = subprocess.run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"gpuaas-terminal-relay@{socket.gethostname()}",
                "-f",
                made,
            ],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if proc.returncode != 0:
            raise VmError(
                "terminal_key_failed", f"ssh-keygen {path}: {proc.stderr.strip()}", PHASE_SEED
            )
        hostfile.move_into_place(made + ".pub", path + ".pub")
        hostfile.move_into_place(made, path)


def ensure_relay_key(path: str, check_mode: bool) -> dict:
    """The node terminal relay key pair at `path` (+ .pub), created (ed25519) if missing.

    Provisions that start together on a new host all want it at once, so it is made under
    the key's lock, in a scratch directory beside it, and moved into place public half
    first (each half synced to disk before its rename, `hostfile.move_into_place`): a
    private key that exists always has its public half, and every run reads the one pair
    that stays."""
    public = path + ".pub"
    created = False
    if not os.path.exists(path):
        if check_mode:
            return {"path": path, "created": True, "public_key": ""}
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, mode=0o700, exist_ok=True)
        with hostfile.edit_lock(path):
            created = not os.path.exists(path)
            if created:
                make_relay_key(path, directory)
    try:
        with open(public, encoding="utf-8") as handle:
            key = handle.read().strip()
    except OSError as exc:
        raise VmError(
            "terminal_key_missing",
            f"terminal relay key {path} has no public key {public}: {exc.strerror}",
            PHASE_SEED,
        ) from exc
    return {"path": path, "created": created, "public_key": key}


def seed_spec() -> dict:
    """The seed's own options (the allocation id and the MAC come from the caller's): the
    argument spec of slice_vm_seed and of slice_vm_domain's ``seed``."""
    return dict(
        path=dict(type="path", required=True),
        hostname=dict(type="str", required=True),
        users=dict(
            type="list",
            elements="dict",
            required=True,
            options=dict(
                name=dict(type="str", required=True),
                ssh_authorized_keys=dict(type="list", elements="str", default=[], no_log=False),
                shell=dict(type="str", default="/bin/bash"),
                sudo=dict(type="str"),
            ),
        ),
        terminal_key_path=dict(type="path", no_log=False),
        host_private_key=dict(type="str", no_log=True),
        host_public_key=dict(type="str", no_log=False),
    )


SEED_REQUIRED_TOGETHER = (("host_private_key", "host_public_key"),)


def check_inputs(params: dict) -> tuple[str, str] | None:
    """Every input of the seed, checked before anything (the relay key included) is
    written; the guest host key pair, or None."""
    vm_common.parse_allocation_id(params["allocation_id"])
    check_hostname(params["hostname"])
    normalize_users(params["users"], relay_pending=bool(params.get("terminal_key_path")))
    if params.get("host_private_key") or params.get("host_public_key"):
        return validate_host_key(
            params.get("host_private_key") or "", params.get("host_public_key") or ""
        )
    return None


def run(params: dict, check_mode: bool) -> dict:
    """Module entry: check the inputs, make the relay key, then render the seed and write it
    if it differs."""
    host_key = check_inputs(params)
    relay = {"path": "", "created": False, "public_key": ""}
    if params.get("terminal_key_path"):
        relay = ensure_relay_key(params["terminal_key_path"], check_mode)
    files = seed_files(
        params["allocation_id"],
        params["hostname"],
        params["users"],
        params["mac_address"],
        relay["public_key"],
        host_key,
    )
    result = ensure_seed(params["path"], files, check_mode, host_key[0] if host_key else "")
    result["host_key"] = host_key[1] if host_key else None
    result["terminal_key"] = relay
    result["changed"] = result["changed"] or relay["created"]
    return result
