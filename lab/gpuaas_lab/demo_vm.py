"""Step 5 of the demo: one slice VM through the provision and release flows, for real
(QEMU emulation, no passthrough) when this machine can run it."""

from __future__ import annotations

import uuid
from pathlib import Path

from rich.console import Console

from controlplane.api import ControlPlane
from gpuaas_lab.slicehost import LAB_SKU, LabSliceHost, unavailable_reason


def run_vm_demo(cp: ControlPlane, console: Console, root: Path) -> None:
    from flows.allocation import provision_allocation, release_allocation
    from flows.fleet import approve_slots, discover_topology

    reason = unavailable_reason()
    if reason:
        console.print(f"[yellow]no VM here: {reason}[/yellow]")
        return
    cp.define_sku(LAB_SKU)
    console.print("building (or reusing) the tiny UEFI guest image and a lab slice host ...")
    with LabSliceHost(root) as host:
        host.enroll(cp)
        discover_topology(hostnames=[host.hostname])
        approve_slots(host.hostname)
        image = cp.register_image(host.catalog_image())
        console.print(f"catalog image {image.slug}: sha256 {image.digest_sha256}")
        key, public = host.lab.ssh_keypair("tenant")
        console.print(
            f"provision_allocation: {LAB_SKU.slug} x1 on lab node {host.hostname} "
            "(QEMU emulation; GPU and VF hostdevs need VFIO, which this machine lacks)"
        )
        state = provision_allocation(
            LAB_SKU.slug,
            1,
            image.slug,
            [{"name": "gpuuser", "ssh_authorized_keys": [public]}],
            return_state=True,
        )
        if not state.is_completed():
            console.print(f"[red]provision failed[/red]: {state.message}")
            return
        result = state.result()
        readiness = result["readiness"]
        console.print(
            f"[green]active[/green]: allocation {result['allocation_id']} on {result['node']}; "
            f"lease {readiness.get('mac')} -> {readiness.get('actual_ip')} "
            f"({readiness.get('lease_state')}), ssh_ready={readiness.get('ssh_ready')}"
        )
        login = host.lab.ssh(
            readiness.get("actual_ip") or "10.100.0.10", "gpuuser", key, "uname -sr"
        )
        console.print(
            f"ssh gpuuser@guest uname -sr -> {login.stdout.strip() or login.stderr.strip()}"
        )
        released = release_allocation(result["allocation_id"], return_state=True)
        if not released.is_completed():
            console.print(f"[red]release failed[/red]: {released.message}")
            return
        for slot in released.result()["slots"]:
            console.print(f"released; slot {slot['slot']}: {slot['status']} ({slot['proof']})")
        shown = cp.show_allocation(uuid.UUID(result["allocation_id"]))
        console.print(f"allocation {shown.id} is {shown.state}")
