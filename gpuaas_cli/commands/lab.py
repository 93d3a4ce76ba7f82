"""``gpuaas lab``: lab hosts under QEMU and fleets of simulated hosts, for development; the
commands need the lab package and answer in JSON only."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from typing import Annotated, Any

import typer

from gpuaas_cli.commands.common import control_plane, run
from gpuaas_cli.helpfix import Typer
from gpuaas_cli.lab import import_lab

app = Typer(no_args_is_help=True, help="Lab machinery (needs the lab package).")
host_app = Typer(
    no_args_is_help=True, help="Debian lab hosts under QEMU, managed over SSH (root only)."
)
app.add_typer(host_app, name="host")
fleet_app = Typer(
    no_args_is_help=True,
    help="Fleets of simulated hosts reached over real SSH, registered as nodes (root only).",
)
app.add_typer(fleet_app, name="fleet")


def run_json(action: Callable[[], Any]) -> None:
    """Lab commands are for people and scripts alike: JSON always."""
    run(True, action, lambda _: None)


def exit_on_sigterm() -> None:
    """A service manager's SIGTERM while a lab is being made still removes what was half
    made: it exits through the code that cleans up."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


@host_app.command("up")
def lab_host_up(
    name: Annotated[str, typer.Argument(help="Host name (1-10: a-z, 0-9, dash).")],
    nvme: Annotated[int, typer.Option("--nvme", help="Emulated NVMe controllers.")] = 2,
    deploy: Annotated[
        bool,
        typer.Option(
            "--deploy",
            help="Boot with the MAAS deploy user-data (slice-vm profile): the collection of "
            "this checkout is served to the host, which bootstraps itself on first boot.",
        ),
    ] = False,
) -> None:
    """Build the image if needed, boot a lab host and wait for SSH and cloud-init; prints
    JSON."""

    def boot() -> dict:
        exit_on_sigterm()
        if deploy:
            return import_lab("deployseed").up_deployed(name, nvme=nvme).describe()
        return import_lab("hostlab").up(name, nvme=nvme).describe()

    run_json(boot)


@host_app.command("down")
def lab_host_down(name: Annotated[str, typer.Argument(help="Host name.")]) -> None:
    """Stop a lab host and remove everything it made (QEMU, tap, bridge, files)."""
    run_json(lambda: import_lab("hostlab").down(name))


@host_app.command("list")
def lab_host_list() -> None:
    """Lab hosts of this machine, running or not, as JSON."""
    run_json(lambda: import_lab("hostlab").list_hosts())


@fleet_app.command("up")
def lab_fleet_up(
    hosts: Annotated[int, typer.Option("--hosts", help="How many hosts.")] = 10,
    name: Annotated[
        str, typer.Option("--name", help="Fleet name; hosts are NAME-0001, NAME-0002...")
    ] = "fleet",
    region: Annotated[str, typer.Option("--region", help="Region the nodes join.")] = (
        "region-lab-fleet"
    ),
) -> None:
    """Start the fleet's hosts (one SSH server, namespace and host tree each) and register
    them as slice nodes with their SSH host keys pinned; prints JSON."""

    def start() -> dict:
        exit_on_sigterm()
        sshfleet = import_lab("sshfleet")
        fleet = sshfleet.up(hosts, name)
        try:
            fleet.register(control_plane(), region)
        except BaseException:
            sshfleet.down(name)
            raise
        return {**fleet.describe(), "extravars": fleet.extravars()}

    run_json(start)


@fleet_app.command("down")
def lab_fleet_down(
    name: Annotated[str, typer.Option("--name", help="Fleet name.")] = "fleet",
) -> None:
    """Stop every host of the fleet and remove what it made (processes, namespaces,
    bridge, files). Its nodes stay in the store (retire them with gpuaas node retire)."""
    run_json(lambda: import_lab("sshfleet").down(name))


@fleet_app.command("list")
def lab_fleet_list() -> None:
    """Lab fleets of this machine, as JSON."""
    run_json(lambda: import_lab("sshfleet").list_fleets())
