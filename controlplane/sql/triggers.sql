-- Functions over the store's rows and every trigger of the store. Applied after the
-- tables exist (rules.sql comes first). See docs/store-invariants.md.

-- A slot a slice placement may take, judged on its own row: free, a whole GPU passed
-- through on its own, and complete. Claims of other slots (fabric conflicts) are judged
-- by the placement statements, which see the claims (controlplane/repositories/capacity.py).
CREATE OR REPLACE FUNCTION slot_placeable(s node_resource_slots) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT slot_free(s.status, s.health_state, s.wipe_required)
    AND s.sharing_mechanism = 'exclusive_device' AND s.parent_slot_id IS NULL
    AND slot_complete(s.gpu_pci_address, s.numa_node, s.nvme_device, s.mac_address,
                      s.private_ip, s.fabric_claim_mode, s.fabric_vf_pci_address)
$$;

-- Evidence is proof: once written it never changes. No process role is granted UPDATE,
-- DELETE or TRUNCATE on it (controlplane/store_roles.py), and this refuses them to the
-- owner too; a migration that must rewrite evidence says so with
-- ALTER TABLE evidence DISABLE TRIGGER evidence_append_only, which only the owner may run
-- (docs/operations.md, "Store roles").
CREATE OR REPLACE FUNCTION evidence_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'evidence is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE OR REPLACE TRIGGER evidence_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON evidence
    FOR EACH STATEMENT EXECUTE FUNCTION evidence_append_only();

-- The calls that change the shape tables refresh their planner statistics
-- (controlplane/repositories/statistics.py). ANALYZE is the owner's, so this runs it as the
-- owner for the role that made the change, on those tables only.
CREATE OR REPLACE FUNCTION analyze_shape_tables(tables text[]) RETURNS void
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF NOT tables <@ ARRAY['nodes', 'node_capacity', 'node_resource_slots'] THEN
        RAISE EXCEPTION 'only the shape tables are analyzed here, not %', tables
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF cardinality(tables) > 0 THEN
        EXECUTE 'ANALYZE (SKIP_LOCKED) ' || array_to_string(tables, ', ');
    END IF;
END
$$;

-- The counter triggers run as the owner of the store (SECURITY DEFINER, on the store's
-- schema only): no process role is granted a write of node_capacity or of a quota's
-- usage, so the counters change only here (docs/operations.md, "Store roles").

-- node_capacity copies each node's placement keys, in the node's own transaction.
CREATE OR REPLACE FUNCTION node_capacity_on_node() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO node_capacity (node_id) VALUES (NEW.id);
    END IF;
    UPDATE node_capacity SET
        node_family = NEW.node_family,
        region_code = NEW.region_code,
        gpu_count = NEW.gpu_count,
        slice_schedulable = node_takes_slices(NEW.admin_state, NEW.profile_intent),
        baremetal_schedulable = node_takes_baremetal(NEW.admin_state, NEW.profile_intent),
        baremetal_intent = (NEW.profile_intent = 'baremetal')
    WHERE node_id = NEW.id;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER node_capacity_on_node
    AFTER INSERT OR UPDATE OF node_family, region_code, gpu_count, admin_state, profile_intent
    ON nodes FOR EACH ROW EXECUTE FUNCTION node_capacity_on_node();

-- Slot counters per node: statement-level, so a placement writes each node's counter
-- row once, whatever the number of slots it changed (new rows add, old rows subtract).
CREATE OR REPLACE FUNCTION node_capacity_apply_slots() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE node_capacity c SET free_slots = c.free_slots + d.free_slots,
            free_gpus = c.free_gpus + d.free_gpus, busy_slots = c.busy_slots + d.busy_slots
        FROM (SELECT r.node_id,
                     sum(slot_free(r.status, r.health_state, r.wipe_required)::int) AS free_slots,
                     sum(slot_free(r.status, r.health_state, r.wipe_required)::int
                         * r.gpu_count) AS free_gpus,
                     sum(slot_busy(r.status, r.wipe_required)::int) AS busy_slots
              FROM new_rows r GROUP BY r.node_id) d
        WHERE c.node_id = d.node_id AND (d.free_slots, d.free_gpus, d.busy_slots) <> (0, 0, 0);
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE node_capacity c SET free_slots = c.free_slots - d.free_slots,
            free_gpus = c.free_gpus - d.free_gpus, busy_slots = c.busy_slots - d.busy_slots
        FROM (SELECT r.node_id,
                     sum(slot_free(r.status, r.health_state, r.wipe_required)::int) AS free_slots,
                     sum(slot_free(r.status, r.health_state, r.wipe_required)::int
                         * r.gpu_count) AS free_gpus,
                     sum(slot_busy(r.status, r.wipe_required)::int) AS busy_slots
              FROM old_rows r GROUP BY r.node_id) d
        WHERE c.node_id = d.node_id AND (d.free_slots, d.free_gpus, d.busy_slots) <> (0, 0, 0);
    ELSE
        UPDATE node_capacity c SET free_slots = c.free_slots + d.free_slots,
            free_gpus = c.free_gpus + d.free_gpus, busy_slots = c.busy_slots + d.busy_slots
        FROM (SELECT r.node_id,
                     sum(r.sign * slot_free(r.status, r.health_state, r.wipe_required)::int)
                         AS free_slots,
                     sum(r.sign * slot_free(r.status, r.health_state, r.wipe_required)::int
                         * r.gpu_count) AS free_gpus,
                     sum(r.sign * slot_busy(r.status, r.wipe_required)::int) AS busy_slots
              FROM (SELECT 1 AS sign, n.node_id, n.status, n.health_state, n.wipe_required,
                           n.gpu_count
                    FROM new_rows n
                    UNION ALL
                    SELECT -1, o.node_id, o.status, o.health_state, o.wipe_required, o.gpu_count
                    FROM old_rows o) r
              GROUP BY r.node_id) d
        WHERE c.node_id = d.node_id AND (d.free_slots, d.free_gpus, d.busy_slots) <> (0, 0, 0);
    END IF;
    RETURN NULL;
END
$$;
-- Transition tables allow one event per trigger.
CREATE OR REPLACE TRIGGER node_capacity_apply_slots_insert AFTER INSERT ON node_resource_slots
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_apply_slots();
CREATE OR REPLACE TRIGGER node_capacity_apply_slots_update AFTER UPDATE ON node_resource_slots
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_apply_slots();
CREATE OR REPLACE TRIGGER node_capacity_apply_slots_delete AFTER DELETE ON node_resource_slots
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_apply_slots();

-- Active claims per node, by kind; a CHECK on node_capacity keeps the kinds apart.
CREATE OR REPLACE FUNCTION node_capacity_apply_claims() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = public, pg_temp AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        UPDATE node_capacity c SET slot_claims = c.slot_claims + d.slot_claims,
            exclusive_claims = c.exclusive_claims + d.exclusive_claims
        FROM (SELECT r.node_id,
                     count(*) FILTER (WHERE r.state = 'active' AND r.claim_kind = 'slot')
                         AS slot_claims,
                     count(*) FILTER (WHERE r.state = 'active'
                                      AND r.claim_kind = 'node_exclusive') AS exclusive_claims
              FROM new_rows r GROUP BY r.node_id) d
        WHERE c.node_id = d.node_id AND (d.slot_claims, d.exclusive_claims) <> (0, 0);
    ELSIF TG_OP = 'DELETE' THEN
        UPDATE node_capacity c SET slot_claims = c.slot_claims - d.slot_claims,
            exclusive_claims = c.exclusive_claims - d.exclusive_claims
        FROM (SELECT r.node_id,
                     count(*) FILTER (WHERE r.state = 'active' AND r.claim_kind = 'slot')
                         AS slot_claims,
                     count(*) FILTER (WHERE r.state = 'active'
                                      AND r.claim_kind = 'node_exclusive') AS exclusive_claims
              FROM old_rows r GROUP BY r.node_id) d
        WHERE c.node_id = d.node_id AND (d.slot_claims, d.exclusive_claims) <> (0, 0);
    ELSE
        UPDATE node_capacity c SET slot_claims = c.slot_claims + d.slot_claims,
            exclusive_claims = c.exclusive_claims + d.exclusive_claims
        FROM (SELECT r.node_id,
                     sum(r.sign * (r.state = 'active' AND r.claim_kind = 'slot')::int)
                         AS slot_claims,
                     sum(r.sign * (r.state = 'active' AND r.claim_kind = 'node_exclusive')::int)
                         AS exclusive_claims
              FROM (SELECT 1 AS sign, n.node_id, n.state, n.claim_kind FROM new_rows n
                    UNION ALL
                    SELECT -1, o.node_id, o.state, o.claim_kind FROM old_rows o) r
              GROUP BY r.node_id) d
        WHERE c.node_id = d.node_id AND (d.slot_claims, d.exclusive_claims) <> (0, 0);
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER node_capacity_apply_claims_insert
    AFTER INSERT ON allocation_resource_claims
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_apply_claims();
CREATE OR REPLACE TRIGGER node_capacity_apply_claims_update
    AFTER UPDATE ON allocation_resource_claims
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_apply_claims();
CREATE OR REPLACE TRIGGER node_capacity_apply_claims_delete
    AFTER DELETE ON allocation_resource_claims
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_apply_claims();

-- Only the triggers above (or a node's deletion cascading) may write node_capacity: the
-- claim-kind CHECK reads it, so a hand-edited counter would open a double booking.
CREATE OR REPLACE FUNCTION node_capacity_written_by_triggers() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    -- Depth 1 is a statement issued directly against node_capacity.
    IF pg_trigger_depth() < 2 THEN
        RAISE EXCEPTION 'node_capacity is kept by triggers: % refused', TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NULL;
END
$$;
CREATE OR REPLACE TRIGGER node_capacity_written_by_triggers
    BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON node_capacity
    FOR EACH STATEMENT EXECUTE FUNCTION node_capacity_written_by_triggers();

-- A released tenant disk returns to service only with a passed wipe proof for that slot.
CREATE OR REPLACE FUNCTION slot_wipe_needs_proof() RETURNS trigger LANGUAGE plpgsql AS $$
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
CREATE OR REPLACE TRIGGER slot_wipe_needs_proof
    BEFORE UPDATE OF wipe_required ON node_resource_slots
    FOR EACH ROW WHEN (OLD.wipe_required AND NOT NEW.wipe_required)
    EXECUTE FUNCTION slot_wipe_needs_proof();
