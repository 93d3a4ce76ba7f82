"""The lab package (demo, simulated hosts, lab hosts) as the CLI reaches it: installed
with the project's development set-up, never needed by a control-plane install."""

from __future__ import annotations

import importlib
from types import ModuleType

from controlplane.errors import GpuaasError


def import_lab(module: str) -> ModuleType:
    """``gpuaas_lab.<module>``, or a sentence saying how to install the lab package."""
    try:
        return importlib.import_module(f"gpuaas_lab.{module}")
    except ModuleNotFoundError as missing:
        if missing.name != "gpuaas_lab":
            raise
        raise GpuaasError(
            "lab_not_installed",
            "this command needs the lab package (the demo and the labs): "
            "pip install -e lab (make setup installs it)",
        ) from missing
