"""``gpuaas slots``: a node's topology, its slots' approval and upkeep, and wipe proofs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from gpuaas_cli import render
from gpuaas_cli.commands.common import (
    JsonFlag,
    NodeOpt,
    OptionalReasonOpt,
    ReasonOpt,
    actor,
    control_plane,
    out,
    read_json,
    run,
)
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Import topology, approve and manage slots.")

SlotOpt = Annotated[int, typer.Option("--slot")]


def read_topology(source: str) -> Any:
    """A topology map file, or the slice_topology module's result holding one."""
    document = read_json(source)
    if isinstance(document, dict) and isinstance(document.get("topology"), dict):
        return document["topology"]
    return document


@app.command("import")
def slots_import(
    node: NodeOpt,
    source: Annotated[str, typer.Option("--from", help="Topology map JSON file, or - for stdin.")],
    as_json: JsonFlag = False,
) -> None:
    """Record a gpuaas.topology/v1 candidate map and mirror its candidates as disabled slots."""
    run(
        as_json,
        lambda: control_plane().import_topology(node, read_topology(source), actor()),
        render.render_import,
    )


@app.command("approve")
def slots_approve(
    node: NodeOpt,
    slot: Annotated[
        list[int] | None, typer.Option("--slot", help="Slot index (repeatable).")
    ] = None,
    reason: OptionalReasonOpt = None,
    as_json: JsonFlag = False,
) -> None:
    """Approve slots as available: every rule re-checked, all or nothing."""
    run(
        as_json,
        lambda: control_plane().approve_slots(node, slot or None, actor(), reason),
        lambda r: out.print(
            f"{r['hostname']}: approved {r['approved']}, already available {r['unchanged']}"
        ),
    )


@app.command("list")
def slots_list(
    node: Annotated[str | None, typer.Option("--node")] = None, as_json: JsonFlag = False
) -> None:
    """List slots (optionally of one node)."""
    run(as_json, lambda: control_plane().list_slots(node), render.render_slots)


@app.command("disable")
def slots_disable(
    node: NodeOpt, slot: SlotOpt, reason: ReasonOpt, as_json: JsonFlag = False
) -> None:
    """Take a slot out of scheduling."""
    run(
        as_json,
        lambda: {"changed": control_plane().disable_slot(node, slot, reason, actor())},
        lambda r: out.print(f"slot {slot} of {node} disabled (changed: {r['changed']})"),
    )


@app.command("repair")
def slots_repair(
    node: NodeOpt, slot: SlotOpt, reason: ReasonOpt, as_json: JsonFlag = False
) -> None:
    """Move a cleanup_blocked slot to cleanup (disk may hold data) or disabled."""
    run(
        as_json,
        lambda: {"status": control_plane().repair_slot(node, slot, reason, actor())},
        lambda r: out.print(f"slot {slot} of {node} is now {r['status']}"),
    )


@app.command("wipe-nonce")
def slots_wipe_nonce(node: NodeOpt, as_json: JsonFlag = False) -> None:
    """Issue the nonce a hand-run wipe signs its proofs for (docs/trust.md)."""
    run(
        as_json,
        lambda: {"node": node, "nonce": str(control_plane().issue_wipe_nonce(node, actor()))},
        lambda r: out.print(
            f"nonce {r['nonce']} for {node}: run the wipe with"
            f" -e slice_disk_wipe_evidence_nonce={r['nonce']}, then record its result with"
            f" `gpuaas slots wipe-proof`"
        ),
    )


@app.command("wipe-proof")
def slots_wipe_proof(
    node: NodeOpt,
    slot: SlotOpt,
    source: Annotated[str, typer.Option("--from", help="Proof JSON (disk_wipe result), or -.")],
    as_json: JsonFlag = False,
) -> None:
    """Record a disk wipe proof; a verified one the node signed for a nonce issued after the
    slot's release (`gpuaas slots wipe-nonce`) returns a cleanup slot to available."""

    def record() -> dict[str, Any]:
        document = read_json(source)
        if isinstance(document, dict) and isinstance(document.get("proof"), dict):
            document = document["proof"]
        return control_plane().record_wipe_proof(node, slot, document, actor())

    run(
        as_json,
        record,
        lambda r: out.print(
            f"slot {slot} of {node}: wipe {'verified' if r['verified'] else 'NOT verified'}, "
            f"now {r['status']} (evidence {r['evidence_id']})"
            + (f"; not trusted: {r['distrust']}" if r.get("distrust") else "")
        ),
    )
