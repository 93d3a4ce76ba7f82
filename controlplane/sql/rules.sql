-- The slot and node rules: the one definition of when a slot is in use, free, busy or
-- complete, when a node takes slices or a baremetal tenant and when its hugepages back a
-- hugepage SKU's VM. Triggers, CHECK constraints, the audit, the scheduler, occupancy
-- and diagnosis all call these.
-- The tenancy rules below them are the one definition of when a reservation is live or
-- lets a project in, what a quota covers and what a claim holds toward it.
-- LANGUAGE sql, IMMUTABLE (STABLE where they read now()) and a single expression: the
-- planner inlines them, so a predicate written with them costs what the spelled-out
-- expression costs and can use the same indexes. See docs/architecture.md, "Where each
-- rule lives".

-- A tenant holds the slot: reserved for, provisioning, running or releasing a VM.
CREATE OR REPLACE FUNCTION slot_in_use(status text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT status IN ('reserved', 'provisioning', 'active', 'releasing') $$;

-- Capacity a placement may take (the node_capacity free counters count these rows).
CREATE OR REPLACE FUNCTION slot_free(status text, health_state text, wipe_required boolean)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT status = 'available' AND health_state = 'healthy' AND NOT wipe_required $$;

-- The slot holds or may still hold a tenant's data, so the node cannot go whole to a
-- baremetal tenant (the node_capacity busy counter counts these rows).
CREATE OR REPLACE FUNCTION slot_busy(status text, wipe_required boolean) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT status NOT IN ('available', 'disabled') OR wipe_required $$;

-- Every runtime-critical binding a slice VM needs: GPU, NUMA node, a stable by-id disk,
-- MAC, IP and its own fabric VF. An available slot must be complete (a CHECK).
CREATE OR REPLACE FUNCTION slot_complete(
    gpu_pci_address text, numa_node integer, nvme_device text, mac_address macaddr,
    private_ip inet, fabric_claim_mode text, fabric_vf_pci_address text
) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT gpu_pci_address IS NOT NULL AND numa_node IS NOT NULL
    AND nvme_device LIKE '/dev/disk/by-id/%'
    AND mac_address IS NOT NULL AND private_ip IS NOT NULL
    AND fabric_claim_mode = 'per_slot_vf' AND fabric_vf_pci_address IS NOT NULL
$$;

CREATE OR REPLACE FUNCTION node_takes_slices(admin_state text, profile_intent text)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT admin_state = 'schedulable' AND profile_intent = 'slice_vm' $$;

-- A slice host may also go whole to a baremetal tenant when nothing of anyone is on it.
CREATE OR REPLACE FUNCTION node_takes_baremetal(admin_state text, profile_intent text)
    RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT admin_state = 'schedulable' AND profile_intent IN ('baremetal', 'slice_vm') $$;

-- The node's 1 GiB hugepage pool as discovery reported it (nodes.hugepages_1g, NULL
-- before a topology import) can back a hugepage SKU's slice VM of `gpus` GPUs: the VM's
-- memory is all 1 GiB pages (plugins/module_utils/vm_domain.py). The whole pool, not
-- what is free now: the health check keeps enough free for every available slot.
CREATE OR REPLACE FUNCTION node_backs_hugepages(
    hugepages_1g integer, memory_gib_per_gpu integer, gpus integer
) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT coalesce(hugepages_1g, 0) >= memory_gib_per_gpu * gpus $$;

-- A node's slice fabric (nodes.fabric_link_layer, the link layer discovery found for its
-- slots' VFs; NULL when unknown or mixed) meets a SKU's requirement (skus.fabric): a
-- workload that expects InfiniBand never lands on an Ethernet (RoCE) slot, nor the other
-- way round; `any` takes either.
CREATE OR REPLACE FUNCTION fabric_fits(link_layer text, required text) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT required = 'any' OR link_layer IS NOT DISTINCT FROM required $$;

-- The tenancy rules (docs/store-invariants.md, "Projects, quotas and policy" and
-- "Reserved capacity"): the scheduler, occupancy, the project commands, the quota
-- triggers and the audit call these rather than spell them out.

-- A reservation (or the node_capacity mark it leaves: reserved_until) holds its nodes
-- until it ends; NULL: until it is released. STABLE, not IMMUTABLE: it reads now().
CREATE OR REPLACE FUNCTION reservation_live(ends_at timestamptz) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT ends_at IS NULL OR ends_at > now() $$;

-- A node's reservation mark (node_capacity.reserved_for and reserved_until) lets
-- `project` place there: no reservation, the project's own, or one that has ended.
CREATE OR REPLACE FUNCTION reservation_admits(
    reserved_for text, reserved_until timestamptz, project text
) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT reserved_for IS NULL OR reserved_for = project
              OR NOT reservation_live(reserved_until) $$;

-- A quota's scope (NULL: every SKU, shape or region) covers a claim of this SKU, shape
-- and region: its usage counts the claim, and its limit binds it.
CREATE OR REPLACE FUNCTION quota_covers(
    quota_sku integer, quota_shape text, quota_region text,
    sku integer, shape text, region text
) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT (quota_sku IS NULL OR quota_sku = sku)
    AND (quota_shape IS NULL OR quota_shape = shape)
    AND (quota_region IS NULL OR quota_region = region)
$$;

-- The GPUs an active claim holds toward a quota: a slot claim one (a slot holds one GPU,
-- ck_node_resource_slots_one_gpu_per_slot), a node_exclusive claim its allocation's.
CREATE OR REPLACE FUNCTION claim_gpus(claim_kind text, allocation_gpus integer)
    RETURNS integer
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$ SELECT CASE WHEN claim_kind = 'slot' THEN 1 ELSE allocation_gpus END $$;
