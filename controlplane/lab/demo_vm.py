"""Step 5 of the demo: one slice VM through the provision and release flows."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from controlplane.api import ControlPlane


def run_vm_demo(cp: ControlPlane, console: Console, root: Path) -> None:
    console.print("[yellow]VM demo not wired yet[/yellow]")
