"""An OCI registry for the image tests and benchmarks: Debian's `docker-registry` (the CNCF
distribution registry) with its own configuration and storage, plain HTTP on one local
address (loopback, or a lab host's private bridge), stopped by its process group."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from gpuaas_lab.ports import free_port

BINARY = "docker-registry"


def unavailable_reason() -> str | None:
    if shutil.which(BINARY) is None:
        return f"{BINARY} is not installed (Debian package docker-registry)"
    return None


@dataclass
class LocalRegistry:
    """Use as a context manager; ``host`` is ``ADDRESS:PORT`` (``address`` one of this
    machine's own: loopback by default, a lab host's bridge gateway for the lab host)."""

    root: Path
    address: str = "127.0.0.1"
    port: int = 0
    process: subprocess.Popen | None = None

    def __post_init__(self) -> None:
        if not self.port:
            self.port = free_port(self.address)

    @property
    def host(self) -> str:
        return f"{self.address}:{self.port}"

    def __enter__(self) -> LocalRegistry:
        self.root.mkdir(parents=True, exist_ok=True)
        config = self.root / "config.yml"
        config.write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.root / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: {self.host}\n"
        )
        with open(self.root / "registry.log", "ab") as log:
            self.process = subprocess.Popen(
                [BINARY, "serve", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://{self.host}/v2/", timeout=2):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    log_text = (self.root / "registry.log").read_text()[-2000:]
                    raise RuntimeError(f"the registry did not start: {log_text}") from None
                time.sleep(0.2)

    def stop(self) -> None:
        """Stop the registry now (a registry that goes away)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def __exit__(self, *exc_info) -> None:
        self.stop()
