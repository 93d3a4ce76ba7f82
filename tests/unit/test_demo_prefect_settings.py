"""The demo's Prefect settings reach Prefect: it reads them once, when first imported."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
from gpuaas_lab import demo
demo.prefect_environment()
import flows  # imports Prefect, as the demo's flows do
from prefect.settings import (
    PREFECT_HOME, PREFECT_LOGGING_LEVEL, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS
)
print(PREFECT_HOME.value(), PREFECT_LOGGING_LEVEL.value(),
      PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value())
"""


def run_probe(**overrides: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(overrides)
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return proc.stdout.split()


def test_the_demo_settings_apply_where_the_user_set_none(tmp_path):
    home = tmp_path / "prefect-home"
    assert run_probe(PREFECT_HOME=str(home)) == [str(home), "WARNING", "180"]


def test_the_users_own_settings_win(tmp_path):
    found = run_probe(
        PREFECT_HOME=str(tmp_path),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="45",
        PREFECT_LOGGING_LEVEL="DEBUG",
    )
    assert found == [str(tmp_path), "DEBUG", "45"]
