"""SSH host public keys as the control plane pins them (docs/trust.md): parsed and checked
with ``cryptography``, fingerprinted as OpenSSH prints them, written as known-hosts lines
under the node's name (connections use ``HostKeyAlias``, so a new address keeps the pin).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import shlex
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

from controlplane.errors import InvalidInput

# Key types sshd generates by default (DSA, which OpenSSH dropped, is not among them); an
# RSA key must be at least this long.
KEY_TYPES = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "ssh-rsa",
)
MIN_RSA_BITS = 2048


@dataclass(frozen=True)
class HostKey:
    key_type: str
    blob: str  # the key's base64 wire form, as in a .pub file

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256(base64.b64decode(self.blob)).digest()
        return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")

    def public_line(self) -> str:
        return f"{self.key_type} {self.blob}"


def generate_host_key() -> tuple[str, HostKey]:
    """A new ed25519 host key: the private half in OpenSSH's format (what cloud-init's
    ``ssh_keys`` and dropbearconvert read) and the public half."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode("ascii")
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return private, parse_public_key(public.decode("ascii"))


def parse_public_key(text: str) -> HostKey:
    """One OpenSSH public key (``TYPE BASE64 [comment]``, as in ``ssh_host_*_key.pub`` or
    ``ssh-keyscan`` output without the host field)."""
    fields = text.split()
    if len(fields) < 2:
        raise InvalidInput(
            "host_key_invalid", f"not an OpenSSH public key: {text.strip()[:80]!r}", {}
        )
    key_type, blob = fields[0], fields[1]
    if key_type not in KEY_TYPES:
        raise InvalidInput(
            "host_key_type_refused",
            f"host key type {key_type!r} is not accepted (accepted: {', '.join(KEY_TYPES)})",
            {"key_type": key_type},
        )
    try:
        base64.b64decode(blob, validate=True)
        key = load_ssh_public_key(f"{key_type} {blob}".encode())
    except (ValueError, UnsupportedAlgorithm, binascii.Error) as exc:
        raise InvalidInput(
            "host_key_invalid", f"{key_type} key does not parse: {exc}", {"key_type": key_type}
        ) from exc
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise InvalidInput(
            "host_key_too_short",
            f"RSA host key of {key.key_size} bits (at least {MIN_RSA_BITS} required)",
            {"bits": key.key_size},
        )
    return HostKey(key_type, blob)


def parse_public_keys(lines: Iterable[str]) -> list[HostKey]:
    """Keys from ``.pub`` contents or ``ssh-keyscan`` output (a leading host field and
    ``#`` comments are skipped); one key per type, at least one key."""
    keys: dict[str, HostKey] = {}
    for raw in lines:
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if fields[0] not in KEY_TYPES and len(fields) >= 3 and fields[1] in KEY_TYPES:
            fields = fields[1:]  # ssh-keyscan's "host type key"
        key = parse_public_key(" ".join(fields))
        other = keys.get(key.key_type)
        if other is not None and other != key:
            raise InvalidInput(
                "host_key_type_twice",
                f"two different {key.key_type} keys given; a host has one key per type",
                {"fingerprints": [other.fingerprint, key.fingerprint]},
            )
        keys[key.key_type] = key
    if not keys:
        raise InvalidInput("host_keys_missing", "no SSH host public key given", {})
    return sorted(keys.values(), key=lambda k: KEY_TYPES.index(k.key_type))


def known_hosts(entries: Sequence[tuple[str, Sequence[HostKey]]]) -> str:
    """known_hosts text: each node's keys under its name (the ``HostKeyAlias`` used)."""
    return "".join(f"{name} {key.public_line()}\n" for name, keys in entries for key in keys)


def ssh_pin_args(name: str, known_hosts_file: str) -> str:
    """OpenSSH options that accept only the keys pinned for ``name`` in the file (no other
    known-hosts file, no prompt, no trust on first use). ssh keeps the first value it
    reads for an option, so these go before any other arguments."""
    return " ".join(
        f"-o {option}"
        for option in (
            f"HostKeyAlias={shlex.quote(name)}",
            f"UserKnownHostsFile={shlex.quote(known_hosts_file)}",
            "GlobalKnownHostsFile=/dev/null",
            "StrictHostKeyChecking=yes",
        )
    )


def control_path(name: str, pinned: Sequence[HostKey]) -> str:
    """Ansible's ``control_path`` for a host under these pins. An SSH master connection
    (ControlPersist) is reused without checking the host key again, so a master opened
    under other pins (before a rekey, say) must not serve this connection: the path
    carries a digest of the node and its pinned fingerprints, then ssh's own ``%C``."""
    digest = hashlib.sha256(
        "\n".join([name, *sorted(k.fingerprint for k in pinned)]).encode()
    ).hexdigest()[:10]
    return f"%(directory)s/{digest}-%%C"


def write_known_hosts(path: Path, text: str) -> None:
    replace_file(path, text, 0o644)


def replace_file(path: Path, text: str, mode: int) -> None:
    """Replace the file whole: a concurrent reader sees the old or the new text, and a file
    holding a private key is never readable by others, even for a moment (the temporary
    file is created 0600)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def mismatch(name: str, pinned: Sequence[HostKey], presented: Sequence[HostKey]) -> str | None:
    """Why the host's keys are refused, naming both sides' fingerprints; None when a key it
    presents is pinned."""
    if not pinned:
        return (
            f"{name} has no pinned SSH host key, so no connection to it is trusted; check its"
            f" keys out of band and pin them with `gpuaas node rekey {name} --reason ...`"
        )
    if {k.fingerprint for k in pinned} & {k.fingerprint for k in presented}:
        return None
    shown = ", ".join(f"{k.key_type} {k.fingerprint}" for k in presented) or "no key"
    expected = ", ".join(f"{k.key_type} {k.fingerprint}" for k in pinned)
    return (
        f"{name} presented {shown}, but the store pins {expected}: refused. If the host was"
        f" re-imaged legitimately, check its keys out of band and run"
        f" `gpuaas node rekey {name} --reason ...`"
    )
