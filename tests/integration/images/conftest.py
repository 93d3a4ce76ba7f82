"""Image tests: a real OCI registry (Debian's docker-registry) on a free loopback port."""

from __future__ import annotations

import pytest

from gpuaas_lab.registry import LocalRegistry, unavailable_reason


@pytest.fixture
def local_registry(tmp_path):
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    with LocalRegistry(tmp_path / "registry") as running:
        yield running
