"""A run's secret directory outlives a run that was killed (its ``finally`` never ran):
the next run on the machine removes it (flows.runner.remove_orphaned_secrets)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from flows.runner import SECRETS_PREFIX, PlaybookRun, private_secrets, remove_orphaned_secrets


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def secret_directory(root: Path, owner: str) -> Path:
    directory = root / f"{SECRETS_PREFIX}{owner}-abc123"
    directory.mkdir()
    (directory / "pgpass").write_text("*:*:*:*:hunter2\n")
    return directory


def test_directories_of_dead_runs_go_those_of_live_ones_and_strangers_stay(tmp_path):
    dead = secret_directory(tmp_path, str(dead_pid()))
    live = secret_directory(tmp_path, str(os.getpid()))
    unnamed = tmp_path / f"{SECRETS_PREFIX}q8x0zz1v"
    unnamed.mkdir()
    other = tmp_path / "unrelated-123-dir"
    other.mkdir()

    assert remove_orphaned_secrets(tmp_path) == [dead]

    assert not dead.exists()
    assert live.exists() and unnamed.exists() and other.exists()


def test_a_run_names_its_directory_after_itself_and_clears_orphans_first(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    orphan = secret_directory(tmp_path, str(dead_pid()))
    run = PlaybookRun(
        "parity.yml",
        {},
        extravars={"gpuaas_bmc_password": "s3cret"},
        database_url="postgresql://gpuaas:pw@db/gpuaas",
    )
    with private_secrets(run) as secrets:
        directory = Path(secrets.environment["PGPASSFILE"]).parent
        assert directory.name.startswith(f"{SECRETS_PREFIX}{os.getpid()}-")
        assert not orphan.exists()
    assert not directory.exists()
