# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's evidence signing key, and attestations of the results it reports.

Each node holds one Ed25519 key, readable by root only, created at bootstrap; the control
plane pins its public half. A result the store acts on (a wipe proof) carries an
attestation: a statement naming the node, the subject, the nonce the control plane issued
for this run (its node task id), the disk's identity, the time and the SHA-256 of the
result's canonical form, signed over the statement's canonical form (docs/trust.md,
"Signed evidence"). Signing uses ``cryptography``, never hand-written primitives.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import base64
import datetime
import hashlib
import json
import os

from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile

try:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    HAS_CRYPTOGRAPHY = True
except ImportError:
    HAS_CRYPTOGRAPHY = False

DEFAULT_KEY_PATH = "/etc/gpuaas/evidence-signing.key"
STATEMENT_SCHEMA = "gpuaas.attestation/v1"
ATTESTATION_KEY = "attestation"
KEY_COMMENT = "gpuaas-evidence"


class SigningError(Exception):
    """The node's signing key cannot be read, created or used."""


def canonical(document):
    """The bytes that are hashed and signed: sorted keys, no whitespace, ASCII only."""
    return json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode("ascii")


def payload_digest(payload):
    """SHA-256 of the result's canonical form, its attestation left out."""
    body = {k: v for k, v in payload.items() if k != ATTESTATION_KEY}
    return hashlib.sha256(canonical(body)).hexdigest()


def _require_cryptography():
    if not HAS_CRYPTOGRAPHY:
        raise SigningError("the python cryptography library is required to sign evidence")


def public_line(key):
    """The public half as an OpenSSH ``ssh-ed25519`` line (what the control plane pins)."""
    raw = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{raw.decode('ascii')} {KEY_COMMENT}"


def fingerprint(line):
    """OpenSSH's ``SHA256:`` fingerprint of a public key line."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def load_key(path):
    _require_cryptography()
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SigningError(f"cannot read the signing key {path}: {exc.strerror}") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except ValueError as exc:
        raise SigningError(f"{path} is not a PEM private key: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def key_problem(path):
    """Why the key file's permissions let someone other than root read it, else None."""
    st = os.stat(path)
    if st.st_mode & 0o077 or st.st_uid != 0:
        return f"{path} must be owned by root and readable by root only (mode 0600)"
    return None


def ensure_key(path, check_mode):
    """The node's key: read, or created (0600, directory 0700) when absent. Returns the
    result for the module: ``changed``, ``public_key``, ``fingerprint`` (None in check
    mode before the key exists)."""
    key = load_key(path)
    if key is not None:
        problem = key_problem(path) if os.geteuid() == 0 else None
        if problem:
            raise SigningError(problem)
        line = public_line(key)
        return {
            "changed": False,
            "path": path,
            "public_key": line,
            "fingerprint": fingerprint(line),
        }
    if check_mode:
        return {"changed": True, "path": path, "public_key": None, "fingerprint": None}
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    hostfile.write_bytes(path, pem, mode=0o600, dir_mode=0o700)
    line = public_line(key)
    return {"changed": True, "path": path, "public_key": line, "fingerprint": fingerprint(line)}


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def attest(key, subject, node, nonce, payload, disk):
    """The attestation of ``payload`` (a result dict) for the control plane's ``nonce``."""
    statement = {
        "schema": STATEMENT_SCHEMA,
        "subject": subject,
        "node": node,
        "nonce": nonce,
        "disk": disk,
        "signed_at": utc_now(),
        "payload_sha256": payload_digest(payload),
    }
    signature = key.sign(canonical(statement))
    line = public_line(key)
    return {
        "statement": statement,
        "signature": base64.b64encode(signature).decode("ascii"),
        "key_fingerprint": fingerprint(line),
    }


def attestation_for(key_path, subject, node, nonce, payload, disk):
    """``{"attestation": ...}`` over ``payload``, or ``{"attestation_error": why}`` when it
    cannot be signed (the control plane then does not believe the result)."""
    try:
        key = load_key(key_path)
        if key is None:
            raise SigningError(
                f"no evidence signing key at {key_path}; bootstrap the node to create it"
            )
        return {ATTESTATION_KEY: attest(key, subject, node, nonce, payload, disk)}
    except SigningError as exc:
        return {"attestation_error": str(exc)}


def attest_field(params, subject, result, field):
    """What a module adds to ``result`` when its parameters carry a nonce (the shared
    attestation options, common_args.attestation_spec): the attestation of
    ``{field: result[field]}``, the part the control plane acts on; nothing without one."""
    if not params.get("nonce"):
        return {}
    return attestation_for(
        params["signing_key"],
        subject,
        params["node"],
        params["nonce"],
        {field: result.get(field)},
        {},
    )


def sign_result(key_path, subject, node, nonce, payload, disk):
    """``payload`` with its own attestation (or ``attestation_error``) added."""
    body = {k: v for k, v in payload.items() if k not in (ATTESTATION_KEY, "attestation_error")}
    return {**body, **attestation_for(key_path, subject, node, nonce, body, disk)}


def disk_identity(kernel_name, sys_block="/sys/block"):
    """What the kernel reports identifying the disk behind ``kernel_name``: serial, WWID,
    EUI-64 or NGUID, model (absent values left out; a loop device has none)."""
    base = os.path.join(sys_block, kernel_name)
    found = {}
    for name, relative in (
        ("serial", "device/serial"),
        ("model", "device/model"),
        ("wwid", "wwid"),
        ("eui", "eui"),
        ("nguid", "nguid"),
    ):
        value = hostfile.read_text(os.path.join(base, relative))
        if value and value.strip():
            found[name] = value.strip()
    return found
