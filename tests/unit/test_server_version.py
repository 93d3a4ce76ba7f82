"""The store refuses a PostgreSQL older than 14 before it migrates anything."""

from __future__ import annotations

import pytest

from controlplane.errors import GpuaasError
from controlplane.migrate import require_supported_server


@pytest.mark.parametrize("version", [(14, 0), (15, 18), (17, 2), (18,)])
def test_supported_servers_pass(version):
    require_supported_server(version)


@pytest.mark.parametrize("version", [(13, 16), (9, 6, 24), ()])
def test_older_or_unknown_servers_are_refused(version):
    with pytest.raises(GpuaasError) as excinfo:
        require_supported_server(version)
    assert excinfo.value.code == "postgres_unsupported"
    assert "14 or newer" in excinfo.value.message
