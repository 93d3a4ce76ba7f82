"""A host reached over real SSH on this machine's loopback, in seconds rather than the
minutes a lab host VM takes to boot: Dropbear (the SSH server the slice guests run) on
127.0.0.1 with a host key the lab generates, logging root in with a lab key. It runs in a
mount namespace of its own whose /root is an empty tmpfs holding only the lab's
authorized_keys, so the machine's own root account and SSH setup are never touched. The
namespace is a slave of the machine's (loopdev.py says why): a private one would keep
copies of the mounts other tests make meanwhile, which the storage modules rightly refuse
to wipe under (other_namespace_mount).

What it proves is the controller's side of SSH: which host key a connection accepts,
and how a refusal reads. Modules reached through it act on this machine, so only
read-only ones (parity) are run through it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from controlplane.hostkeys import parse_public_key
from gpuaas_lab.ports import free_port

DROPBEAR = "/usr/sbin/dropbear"
START_TIMEOUT_SECONDS = 10.0


def ssh_host_unavailable_reason() -> str | None:
    """Why a loopback SSH host cannot run here, or None when it can."""
    if os.geteuid() != 0:
        return "needs root to log in as root and to mount a private /root"
    for tool in (DROPBEAR, "dropbearconvert", "ssh-keygen", "ssh-keyscan", "unshare"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def generate_key(path: Path, comment: str) -> str:
    """A new OpenSSH ed25519 key pair at ``path``; returns the public line."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


@dataclass
class LoopbackSshHost:
    """``with LoopbackSshHost(directory, "name") as host:`` serves SSH on ``host.port``
    until the block ends, then stops the server and every session it forked."""

    directory: Path
    name: str
    port: int = 0
    host_public_key: str = ""
    client_key: Path = Path()
    process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LoopbackSshHost:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.host_public_key = generate_key(self.directory / "host_ed25519", self.name)
        subprocess.run(
            [
                "dropbearconvert",
                "openssh",
                "dropbear",
                str(self.directory / "host_ed25519"),
                str(self.directory / "host_ed25519.dropbear"),
            ],
            check=True,
            capture_output=True,
        )
        self.client_key = self.directory / "client_ed25519"
        authorized = self.directory / "authorized_keys"
        authorized.write_text(generate_key(self.client_key, "lab client") + "\n")
        self.port = free_port()
        self.process = self._start(authorized)
        try:
            self._wait_until_listening()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self, authorized: Path) -> subprocess.Popen[bytes]:
        script = (
            "mount -t tmpfs -o mode=0700 lab-root /root && mkdir -m 0700 /root/.ssh"
            ' && install -m 0600 "$1" /root/.ssh/authorized_keys'
            ' && exec "$2" -F -E -s -p "127.0.0.1:$3" -r "$4" -P "$5"'
        )
        with (self.directory / "dropbear.log").open("wb") as log:
            return subprocess.Popen(
                [
                    "unshare",
                    "--mount",
                    "--propagation",
                    "slave",
                    "sh",
                    "-c",
                    script,
                    "lab-sshd",
                    str(authorized),
                    DROPBEAR,
                    str(self.port),
                    str(self.directory / "host_ed25519.dropbear"),
                    str(self.directory / "dropbear.pid"),
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group, so stopping it also ends the sessions it forked.
                start_new_session=True,
            )

    def _wait_until_listening(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"dropbear exited: {self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"dropbear did not listen on 127.0.0.1:{self.port}: {self.log()}")

    def log(self) -> str:
        return (self.directory / "dropbear.log").read_text(errors="replace")[-2000:]

    @property
    def fingerprint(self) -> str:
        return parse_public_key(self.host_public_key).fingerprint

    def host_vars(self) -> dict[str, str | int]:
        """The node record's variables for reaching it (no key paths: the store refuses
        those, so flows are given ``ansible_ssh_private_key_file`` as an extra variable)."""
        return {
            "ansible_port": self.port,
            "ansible_user": "root",
            "ansible_python_interpreter": "/usr/bin/python3",
        }

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
