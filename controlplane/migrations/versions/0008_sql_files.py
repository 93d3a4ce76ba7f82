"""The slot rule in one place: SQL functions and every trigger applied from controlplane/sql.

Why: what makes a slot free, busy, in use or complete was written out in trigger bodies
(0003, 0005), CHECK constraints, the audit, the scheduler and occupancy, in three forms,
and the trigger functions were spread over four migrations. The rules are now plain SQL
functions in ``controlplane/sql/rules.sql`` (inlined by the planner, so no query pays for
them) and every trigger with its function is in ``controlplane/sql/triggers.sql``; this
revision applies both files (``CREATE OR REPLACE``), so the counters and the CHECK that an
available slot is complete call the same functions the scheduler and the audit call.
A later change to those files comes with a revision that applies them again.

It also pins a slot to one GPU: the locking statement reserves one row per requested GPU,
while the ranking counts GPUs; until a slot may hold several GPUs the table says so (every
slot created so far has one, the column's default).

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

from collections.abc import Sequence
from importlib import import_module

from alembic import op

from controlplane import sql

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COMPLETE_BEFORE = (
    "status <> 'available' OR ("
    "gpu_pci_address IS NOT NULL AND numa_node IS NOT NULL"
    " AND nvme_device LIKE '/dev/disk/by-id/%'"
    " AND mac_address IS NOT NULL AND private_ip IS NOT NULL"
    " AND fabric_claim_mode = 'per_slot_vf' AND fabric_vf_pci_address IS NOT NULL)"
)
COMPLETE_AFTER = (
    "status <> 'available' OR slot_complete(gpu_pci_address, numa_node, nvme_device,"
    " mac_address, private_ip, fabric_claim_mode, fabric_vf_pci_address)"
)
RULE_FUNCTIONS = (
    "slot_placeable(node_resource_slots)",
    "slot_in_use(text)",
    "slot_free(text, text, boolean)",
    "slot_busy(text, boolean)",
    "slot_complete(text, integer, text, macaddr, inet, text, text)",
    "node_takes_slices(text, text)",
    "node_takes_baremetal(text, text)",
)


def replace_check(name: str, condition: str) -> None:
    op.drop_constraint(op.f(name), "node_resource_slots", type_="check")
    op.create_check_constraint(op.f(name), "node_resource_slots", condition)


def upgrade() -> None:
    sql.apply(op.get_bind(), sql.RULES)
    replace_check("ck_node_resource_slots_available_is_complete", COMPLETE_AFTER)
    op.drop_constraint(
        op.f("ck_node_resource_slots_gpu_count_positive"), "node_resource_slots", type_="check"
    )
    op.create_check_constraint(
        op.f("ck_node_resource_slots_one_gpu_per_slot"), "node_resource_slots", "gpu_count = 1"
    )
    sql.apply(op.get_bind(), sql.TRIGGERS)


def downgrade() -> None:
    node_capacity = import_module("controlplane.migrations.versions.0003_node_capacity")
    counters = import_module("controlplane.migrations.versions.0005_statement_capacity_triggers")
    # The node and counter triggers as 0003 and 0005 wrote them; the evidence and guard
    # triggers are unchanged in substance and stay.
    op.execute("DROP TRIGGER node_capacity_on_node ON nodes")
    op.execute("DROP FUNCTION node_capacity_on_node()")
    op.execute(node_capacity.NODE_FUNCTION + node_capacity.NODE_TRIGGER)
    for table, (function, _, _) in counters.COUNTERS.items():
        for event in ("insert", "update", "delete"):
            op.execute(f"DROP TRIGGER {function}_{event} ON {table}")
        op.execute(f"DROP FUNCTION {function}()")
        counters.install(table)
    op.drop_constraint(
        op.f("ck_node_resource_slots_one_gpu_per_slot"), "node_resource_slots", type_="check"
    )
    op.create_check_constraint(
        op.f("ck_node_resource_slots_gpu_count_positive"), "node_resource_slots", "gpu_count > 0"
    )
    replace_check("ck_node_resource_slots_available_is_complete", COMPLETE_BEFORE)
    for function in RULE_FUNCTIONS:
        op.execute(f"DROP FUNCTION {function}")
