"""The tenancy rules in one place: SQL functions beside the slot rules.

Why: when a reservation is live (``ends_at`` NULL or later than now) was written out in
the scheduler's statements, occupancy, the capacity repository and, inverted, the
project commands; what a quota's scope covers in both quota functions, the scheduler and
the project commands; the GPUs a claim holds toward a quota four times in the quota
trigger. They are now ``reservation_live``, ``reservation_admits``, ``quota_covers`` and
``claim_gpus`` in ``controlplane/sql/rules.sql`` (inlined by the planner, as the slot
rules are), and the quota functions in ``controlplane/sql/quotas.sql`` call them; this
revision applies both files again so an existing store gets them (docs/architecture.md,
"Where each rule lives").

Downgrade puts back the quota functions as revision 0024 left them, with the rules
spelled out (``QUOTA_FUNCTIONS_BEFORE``), and keeps the four functions: revision 0019
applies the same ``quotas.sql``, which calls them, so an upgrade from below this revision
needs them (revision 0008 creates them with the rest of ``rules.sql``).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-02
"""

from collections.abc import Sequence

from alembic import op

from controlplane import sql

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# The functions of controlplane/sql/quotas.sql that call the rules, as revision 0024 left
# them.
QUOTA_FUNCTIONS_BEFORE = """
CREATE OR REPLACE FUNCTION project_usage(
    p_project text, p_sku integer, p_shape text, p_region text,
    OUT gpus integer, OUT allocations integer) LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(CASE WHEN c.claim_kind = 'slot' THEN 1 ELSE a.gpu_count END), 0)::int,
           count(DISTINCT a.id)::int
    FROM allocation_resource_claims c
    JOIN allocations a ON a.id = c.allocation_id
    JOIN nodes n ON n.id = a.node_id
    WHERE c.state = 'active' AND a.project_id = p_project
      AND (p_sku IS NULL OR a.sku_id = p_sku)
      AND (p_shape IS NULL OR a.capacity_shape = p_shape)
      AND (p_region IS NULL OR n.region_code = p_region)
$$;

-- Apply per-allocation changes of active claims: ``claims`` is the change in the number
-- of its active claims, ``gpus`` the change in GPUs they hold. An allocation counts once
-- while it holds any active claim. One allocation at a time, each read by its key: a
-- session keeps its plans, and a plan that joined the changes to the allocations and
-- nodes tables was chosen for the tables' size when first run, then scanned them whole on
-- every placement as they grew (docs/store-invariants.md, "Projects, quotas and policy").
CREATE OR REPLACE FUNCTION project_quotas_apply(
    p_allocations uuid[], p_claims integer[], p_gpus integer[]) RETURNS void
    LANGUAGE plpgsql AS $$
DECLARE
    i integer;
    owner record;
    held integer;
    allocations_change integer;
BEGIN
    FOR i IN 1 .. coalesce(array_length(p_allocations, 1), 0) LOOP
        SELECT a.project_id, a.sku_id, a.capacity_shape, n.region_code INTO owner
        FROM allocations a JOIN nodes n ON n.id = a.node_id
        WHERE a.id = p_allocations[i];
        CONTINUE WHEN NOT FOUND;
        -- The state is filtered after the allocation's own claims are read: as a second
        -- index condition the plan also walked every active claim of the fleet.
        SELECT count(*) FILTER (WHERE c.state = 'active') INTO held
        FROM allocation_resource_claims c WHERE c.allocation_id = p_allocations[i];
        allocations_change := (held > 0)::int - (held - p_claims[i] > 0)::int;
        CONTINUE WHEN p_gpus[i] = 0 AND allocations_change = 0;
        UPDATE project_quotas q
        SET gpus_used = q.gpus_used + p_gpus[i],
            allocations_used = q.allocations_used + allocations_change,
            updated_at = now()
        WHERE q.project_id = owner.project_id
          AND (q.sku_id IS NULL OR q.sku_id = owner.sku_id)
          AND (q.capacity_shape IS NULL OR q.capacity_shape = owner.capacity_shape)
          AND (q.region_code IS NULL OR q.region_code = owner.region_code);
    END LOOP;
END
$$;

-- As the owner, like the node counters (controlplane/sql/triggers.sql): the quotas' usage
-- is written by no process role.
CREATE OR REPLACE FUNCTION project_quotas_apply_claims() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public, pg_temp AS $$
DECLARE
    ids uuid[];
    claims integer[];
    gpus integer[];
BEGIN
    -- Only allocations of a project with quota rows pay for more than this probe.
    IF NOT EXISTS (SELECT 1 FROM project_quotas) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'INSERT' THEN
        SELECT array_agg(d.allocation_id), array_agg(d.claims), array_agg(d.gpus)
        INTO ids, claims, gpus
        FROM (SELECT r.allocation_id, count(*)::int AS claims,
                     sum(CASE WHEN r.claim_kind = 'slot' THEN 1
                              ELSE (SELECT a.gpu_count FROM allocations a
                                    WHERE a.id = r.allocation_id) END)::int AS gpus
              FROM new_rows r WHERE r.state = 'active' GROUP BY r.allocation_id) d;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(d.allocation_id), array_agg(d.claims), array_agg(d.gpus)
        INTO ids, claims, gpus
        FROM (SELECT r.allocation_id, -count(*)::int AS claims,
                     -sum(CASE WHEN r.claim_kind = 'slot' THEN 1
                               ELSE (SELECT a.gpu_count FROM allocations a
                                     WHERE a.id = r.allocation_id) END)::int AS gpus
              FROM old_rows r WHERE r.state = 'active' GROUP BY r.allocation_id) d;
    ELSE
        SELECT array_agg(d.allocation_id), array_agg(d.claims), array_agg(d.gpus)
        INTO ids, claims, gpus
        FROM (SELECT r.allocation_id, sum(r.sign)::int AS claims,
                     sum(r.sign * CASE WHEN r.claim_kind = 'slot' THEN 1
                                       ELSE (SELECT a.gpu_count FROM allocations a
                                             WHERE a.id = r.allocation_id) END)::int AS gpus
              FROM (SELECT 1 AS sign, n.allocation_id, n.claim_kind FROM new_rows n
                    WHERE n.state = 'active'
                    UNION ALL
                    SELECT -1, o.allocation_id, o.claim_kind FROM old_rows o
                    WHERE o.state = 'active') r
              GROUP BY r.allocation_id HAVING sum(r.sign) <> 0) d;
    END IF;
    IF ids IS NOT NULL THEN
        PERFORM project_quotas_apply(ids, claims, gpus);
    END IF;
    RETURN NULL;
END
$$;
"""


def upgrade() -> None:
    sql.apply(op.get_bind(), sql.RULES)
    sql.apply(op.get_bind(), sql.QUOTAS)


def downgrade() -> None:
    # Dropped, not replaced: CREATE OR REPLACE asks first for CREATE on the schema, DROP
    # for ownership, and a process role running a migration is refused as not the owner
    # (docs/operations.md, "gpuaas_owner"; tests/integration/test_store_roles.py).
    op.execute("DROP FUNCTION project_usage(text, integer, text, text)")
    # Sent without parameters, as sql.apply sends the files: PL/pgSQL's := stays literal.
    with op.get_bind().connection.cursor() as cursor:
        cursor.execute(QUOTA_FUNCTIONS_BEFORE)
