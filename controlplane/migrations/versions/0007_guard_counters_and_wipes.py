"""Only triggers may write node_capacity; only a passed wipe proof may clear wipe_required.

Why: two database rules rested on rows that plain SQL could still change. The check
that keeps slot and node_exclusive claims apart (0006) reads ``node_capacity``, so
deleting a node's counter row, or zeroing its counters, let a slot claim and an exclusive
claim coexist. And ``wipe_required`` could be cleared by hand, returning a released
tenant disk to ``available`` with no proof it was erased. Both are now refused by the
database itself:

- ``node_capacity`` accepts INSERT, UPDATE and DELETE only from inside another trigger
  (the node and counter triggers of 0003/0005, or the cascade of a node's deletion);
  TRUNCATE is refused outright.
- clearing ``wipe_required`` needs ``last_wipe_proof_id`` to name a new, passed
  ``wipe_proof`` evidence row recorded for that very slot.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UPGRADE = """
CREATE FUNCTION node_capacity_written_by_triggers() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Depth 1 is a statement issued directly against node_capacity.
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'node_capacity is kept by triggers: % refused', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END
$$;
CREATE TRIGGER node_capacity_written_by_triggers
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON node_capacity
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_written_by_triggers();

CREATE FUNCTION slot_wipe_needs_proof() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.last_wipe_proof_id IS NOT DISTINCT FROM OLD.last_wipe_proof_id
       OR NOT EXISTS (
           SELECT 1 FROM evidence e
           WHERE e.id = NEW.last_wipe_proof_id AND e.kind = 'wipe_proof' AND e.passed
             AND e.slot_id = NEW.id)
    THEN
        RAISE EXCEPTION 'slot % needs a new passed wipe_proof evidence row to clear wipe_required',
            NEW.id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER slot_wipe_needs_proof
    BEFORE UPDATE OF wipe_required ON node_resource_slots
    FOR EACH ROW WHEN (OLD.wipe_required AND NOT NEW.wipe_required)
    EXECUTE FUNCTION slot_wipe_needs_proof();
"""

DOWNGRADE = """
DROP TRIGGER slot_wipe_needs_proof ON node_resource_slots;
DROP FUNCTION slot_wipe_needs_proof();
DROP TRIGGER node_capacity_written_by_triggers ON node_capacity;
DROP FUNCTION node_capacity_written_by_triggers();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
