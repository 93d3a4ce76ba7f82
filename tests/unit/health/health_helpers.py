"""Recorded tool outputs for the health probe's tests: a runner that answers from them."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import MISSING, CommandResult

DATA = Path(__file__).parent / "data"


def recorded(name: str) -> str:
    return (DATA / name).read_text()


class RecordedTools:
    """A runner answering from recorded outputs: `nvme smart-log <disk>` per kernel name
    (the healthy log for any other), nvidia-smi and dcgmi when given, else rc 127 as for a
    program that is not installed. `calls` keeps every argv."""

    def __init__(self, smart_logs=None, nvidia_smi=None, dcgmi=None, nvme_installed=True):
        self.smart_logs = smart_logs or {}
        self.nvidia_smi = nvidia_smi
        self.dcgmi = dcgmi
        self.nvme_installed = nvme_installed
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv, data=None):
        argv = tuple(argv)
        self.calls.append(argv)
        if argv[0] == "nvme" and self.nvme_installed:
            answer = self.smart_logs.get(Path(argv[2]).name, (0, "nvme-smart-log-healthy.json"))
            rc, name = answer
            return CommandResult(argv, rc, recorded(name) if rc == 0 else "", name if rc else "")
        if argv[0] == "nvidia-smi" and self.nvidia_smi:
            return CommandResult(argv, *self.nvidia_smi)
        if argv[0] == "dcgmi" and self.dcgmi:
            return CommandResult(argv, *self.dcgmi)
        return CommandResult(argv, MISSING, "", f"{argv[0]}: command not found")


def codes(report: dict) -> list[tuple[str, str, str, list[int]]]:
    """(code, severity, scope, slots) of each finding, in order."""
    return [(f["code"], f["severity"], f["scope"], f["slots"]) for f in report["findings"]]
