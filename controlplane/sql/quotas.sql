-- Project quotas (docs/store-invariants.md, "Projects, quotas and policy"): what each
-- project's active claims hold, counted into every quota row whose scope matches, in the
-- statement that changes the claims. The CHECKs on project_quotas then refuse a usage above a limit in that same
-- transaction, whatever code wrote the claims.

-- What a project's active claims hold in a scope (NULL matches every SKU, shape or region;
-- the region is the node's). Counts a quota row's usage when it is created, and audits it.
CREATE OR REPLACE FUNCTION project_usage(
    p_project text, p_sku integer, p_shape text, p_region text,
    OUT gpus integer, OUT allocations integer) LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(claim_gpus(c.claim_kind, a.gpu_count)), 0)::int,
           count(DISTINCT a.id)::int
    FROM allocation_resource_claims c
    JOIN allocations a ON a.id = c.allocation_id
    JOIN nodes n ON n.id = a.node_id
    WHERE c.state = 'active' AND a.project_id = p_project
      AND quota_covers(p_sku, p_shape, p_region, a.sku_id, a.capacity_shape, n.region_code)
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
          AND quota_covers(q.sku_id, q.capacity_shape, q.region_code,
                           owner.sku_id, owner.capacity_shape, owner.region_code);
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
                     sum(claim_gpus(r.claim_kind, (SELECT a.gpu_count FROM allocations a
                                                   WHERE a.id = r.allocation_id)))::int AS gpus
              FROM new_rows r WHERE r.state = 'active' GROUP BY r.allocation_id) d;
    ELSIF TG_OP = 'DELETE' THEN
        SELECT array_agg(d.allocation_id), array_agg(d.claims), array_agg(d.gpus)
        INTO ids, claims, gpus
        FROM (SELECT r.allocation_id, -count(*)::int AS claims,
                     -sum(claim_gpus(r.claim_kind, (SELECT a.gpu_count FROM allocations a
                                                    WHERE a.id = r.allocation_id)))::int AS gpus
              FROM old_rows r WHERE r.state = 'active' GROUP BY r.allocation_id) d;
    ELSE
        SELECT array_agg(d.allocation_id), array_agg(d.claims), array_agg(d.gpus)
        INTO ids, claims, gpus
        FROM (SELECT r.allocation_id, sum(r.sign)::int AS claims,
                     sum(r.sign * claim_gpus(r.claim_kind,
                                             (SELECT a.gpu_count FROM allocations a
                                              WHERE a.id = r.allocation_id)))::int AS gpus
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
CREATE OR REPLACE TRIGGER project_quotas_apply_claims_insert
    AFTER INSERT ON allocation_resource_claims
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION project_quotas_apply_claims();
CREATE OR REPLACE TRIGGER project_quotas_apply_claims_update
    AFTER UPDATE ON allocation_resource_claims
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION project_quotas_apply_claims();
CREATE OR REPLACE TRIGGER project_quotas_apply_claims_delete
    AFTER DELETE ON allocation_resource_claims
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION project_quotas_apply_claims();

-- A quota row's usage is counted from the claims when it is created, and only the trigger
-- above changes it afterwards: a limit can be set or changed, a usage never written.
CREATE OR REPLACE FUNCTION project_quotas_usage_by_triggers() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        SELECT u.gpus, u.allocations INTO NEW.gpus_used, NEW.allocations_used
        FROM project_usage(NEW.project_id, NEW.sku_id, NEW.capacity_shape, NEW.region_code) u;
    ELSIF pg_trigger_depth() < 2 AND (
        (NEW.gpus_used, NEW.allocations_used) IS DISTINCT FROM
        (OLD.gpus_used, OLD.allocations_used)
        OR (NEW.project_id, NEW.sku_id, NEW.capacity_shape, NEW.region_code) IS DISTINCT FROM
           (OLD.project_id, OLD.sku_id, OLD.capacity_shape, OLD.region_code)) THEN
        RAISE EXCEPTION 'project_quotas usage is kept by triggers: its usage and scope are not written'
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE OR REPLACE TRIGGER project_quotas_usage_by_triggers
    BEFORE INSERT OR UPDATE ON project_quotas
    FOR EACH ROW EXECUTE FUNCTION project_quotas_usage_by_triggers();

-- Reserved capacity (docs/store-invariants.md, "Reserved capacity"): the node's counters
-- row carries the project a reservation holds it for and until when, read by the
-- placement statements like every other placement key.
CREATE OR REPLACE FUNCTION node_capacity_on_reservation() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE node_capacity c SET reserved_for = r.project_id, reserved_until = r.ends_at
        FROM project_reservations r
        WHERE c.node_id = NEW.node_id AND r.id = NEW.reservation_id;
    ELSE
        UPDATE node_capacity SET reserved_for = NULL, reserved_until = NULL
        WHERE node_id = OLD.node_id;
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER node_capacity_on_reservation
    AFTER INSERT OR DELETE ON project_reservation_nodes
    FOR EACH ROW EXECUTE FUNCTION node_capacity_on_reservation();
