"""``gpuaas storage``: infra approvals of the disks a storage transition turns into slice
disks."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuaas_cli.commands.common import JsonFlag, NodeOpt, actor, control_plane, out, run
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Approve disks for a storage transition.")


@app.command("approve")
def storage_approve(
    node: NodeOpt,
    device: Annotated[
        list[str], typer.Option("--device", help="Disk by stable identity (repeatable).")
    ],
    reference: Annotated[
        str, typer.Option("--reference", help="Change or ticket id naming the decision.")
    ],
    as_json: JsonFlag = False,
) -> None:
    """Record an infra approval to turn these disks into raw slice disks (storage transition)."""
    run(
        as_json,
        lambda: control_plane().record_storage_approval(node, device, reference, actor()),
        lambda r: out.print(
            f"{'recorded' if r['created'] else 'already recorded'}: approval {r['reference']} "
            f"of {node} covers {', '.join(r['devices'])} (evidence {r['evidence_id']})"
        ),
    )
