"""Per-user locations of the tool's own data (embedded PostgreSQL, Prefect, run artifacts).

Root keeps them under /var/lib/gpuaas: the embedded PostgreSQL runs as the postgres user,
which cannot traverse root's home. Other users get XDG locations.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSTEM_DIR = Path("/var/lib/gpuaas")


def user_dir(name: str, override_env: str, xdg_env: str, xdg_default: str) -> Path:
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return SYSTEM_DIR / name
    base = Path(os.environ.get(xdg_env, Path.home() / xdg_default))
    return base / "gpuaas" / name


def data_dir(name: str, override_env: str) -> Path:
    return user_dir(name, override_env, "XDG_DATA_HOME", ".local/share")


def state_dir(name: str, override_env: str) -> Path:
    return user_dir(name, override_env, "XDG_STATE_HOME", ".local/state")


def prefect_home() -> Path:
    """Prefect's data next to the embedded PostgreSQL's (per user), created if missing."""
    home = data_dir("prefect", "PREFECT_HOME")
    home.mkdir(parents=True, exist_ok=True)
    return home
