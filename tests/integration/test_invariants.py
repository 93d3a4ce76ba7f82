"""Every database invariant, attacked with raw SQL: the database itself must refuse."""

from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError

BY_ID = "/dev/disk/by-id/nvme-eui.00000000000000010000000000000"


def node(conn, hostname: str, subnet: str = "10.100.0.0/24") -> uuid.UUID:
    node_id = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO nodes (id, hostname, region_code, node_family, profile_intent,"
            " slice_subnet) VALUES (:id, :h, 'r1', 'h200-sxm', 'slice_vm', :s)"
        ),
        {"id": node_id, "h": hostname, "s": subnet},
    )
    return node_id


def slot(conn, node_id, index: int, status: str = "available", **overrides) -> uuid.UUID:
    slot_id = uuid.uuid4()
    values = {
        "id": slot_id,
        "node_id": node_id,
        "slot_index": index,
        "status": status,
        "gpu": f"0000:{0x1B + index:02x}:00.0",
        "numa": 0,
        "disk": f"{BY_ID}{index:03d}",
        "mac": f"52:54:00:{node_id.bytes[0]:02x}:{node_id.bytes[1]:02x}:{index:02x}",
        "ip": f"10.100.0.{10 + index}",
        "mode": "per_slot_vf",
        "vf": f"0000:{0x1A + index:02x}:00.1",
        "pf": f"0000:{0x1A + index:02x}:00.0",
    }
    values.update(overrides)
    conn.execute(
        text(
            "INSERT INTO node_resource_slots (id, node_id, slot_index, status, gpu_pci_address,"
            " numa_node, nvme_device, mac_address, private_ip, fabric_claim_mode,"
            " fabric_vf_pci_address, fabric_device)"
            " VALUES (:id, :node_id, :slot_index, :status, :gpu, :numa, :disk, :mac, :ip, :mode,"
            " :vf, :pf)"
        ),
        values,
    )
    return slot_id


def allocation(conn, node_id, shape: str = "gpu_slice") -> uuid.UUID:
    alloc_id = uuid.uuid4()
    conn.execute(
        text(
            "INSERT INTO allocations (id, capacity_shape, sku_id, gpu_count, state, node_id)"
            " VALUES (:id, CAST(:shape AS varchar),"
            " (SELECT id FROM skus WHERE capacity_shape = CAST(:shape AS varchar) LIMIT 1),"
            " 1, 'provisioning', :node)"
        ),
        {"id": alloc_id, "shape": shape, "node": node_id},
    )
    return alloc_id


def claim(conn, alloc_id, node_id, slot_id=None, kind: str = "slot", state: str = "active"):
    conn.execute(
        text(
            "INSERT INTO allocation_resource_claims (allocation_id, node_id, slot_id, claim_kind,"
            " state, released_at) VALUES (:a, :n, :s, :k, CAST(:st AS varchar),"
            " CASE WHEN CAST(:st AS varchar) = 'released' THEN now() END)"
        ),
        {"a": alloc_id, "n": node_id, "s": slot_id, "k": kind, "st": state},
    )


@pytest.fixture
def fleet(engine):
    with engine.begin() as conn:
        a = node(conn, "node-a")
        b = node(conn, "node-b")
        slots_a = [slot(conn, a, i) for i in range(4)]
        slots_b = [slot(conn, b, i) for i in range(2)]
    return {"a": a, "b": b, "slots_a": slots_a, "slots_b": slots_b}


def refused(engine, statement, constraint: str, error=IntegrityError):
    """The statement fails, and because of the named constraint (not some other reason)."""
    with pytest.raises(error) as excinfo, engine.begin() as conn:
        statement(conn)
    diag = excinfo.value.orig.diag
    assert constraint in (diag.constraint_name or diag.message_primary or ""), str(excinfo.value)


def test_at_most_one_active_claim_per_slot(engine, fleet):
    with engine.begin() as conn:
        first = allocation(conn, fleet["a"])
        claim(conn, first, fleet["a"], fleet["slots_a"][0])

    def second_claim(conn):
        other = allocation(conn, fleet["a"])
        claim(conn, other, fleet["a"], fleet["slots_a"][0])

    refused(engine, second_claim, "uq_allocation_resource_claims_active_slot")
    # A released claim does not count.
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE allocation_resource_claims SET state = 'released', released_at = now()")
        )
        second_claim(conn)


def test_at_most_one_active_exclusive_claim_per_node(engine, fleet):
    with engine.begin() as conn:
        first = allocation(conn, fleet["b"], "baremetal")
        claim(conn, first, fleet["b"], kind="node_exclusive")

    def second(conn):
        other = allocation(conn, fleet["b"], "baremetal")
        claim(conn, other, fleet["b"], kind="node_exclusive")

    refused(engine, second, "uq_allocation_resource_claims_active_exclusive_node")


def test_no_slot_claim_beside_an_exclusive_claim(engine, fleet):
    with engine.begin() as conn:
        bm = allocation(conn, fleet["a"], "baremetal")
        claim(conn, bm, fleet["a"], kind="node_exclusive")

    def slice_claim(conn):
        sl = allocation(conn, fleet["a"])
        claim(conn, sl, fleet["a"], fleet["slots_a"][1])

    refused(engine, slice_claim, "ck_node_capacity_claim_kinds_apart")


def test_no_exclusive_claim_beside_a_slot_claim(engine, fleet):
    with engine.begin() as conn:
        sl = allocation(conn, fleet["a"])
        claim(conn, sl, fleet["a"], fleet["slots_a"][1])

    def exclusive(conn):
        bm = allocation(conn, fleet["a"], "baremetal")
        claim(conn, bm, fleet["a"], kind="node_exclusive")

    refused(engine, exclusive, "ck_node_capacity_claim_kinds_apart")


def test_opposite_claim_kinds_racing_on_one_node(engine, fleet):
    """Two open transactions claim one node both ways: the one that commits second fails.

    The check lives on the trigger-kept counter row, so the second claimer waits for the
    first's row lock and then sees its committed claim (no snapshot can hide it).
    """
    slice_conn = engine.connect()
    slice_tx = slice_conn.begin()
    sl = allocation(slice_conn, fleet["a"])
    claim(slice_conn, sl, fleet["a"], fleet["slots_a"][1])
    outcome: list[BaseException | None] = []

    def exclusive_claimer() -> None:
        try:
            with engine.begin() as conn:
                bm = allocation(conn, fleet["a"], "baremetal")
                claim(conn, bm, fleet["a"], kind="node_exclusive")
            outcome.append(None)
        except IntegrityError as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=exclusive_claimer)
    waiter.start()
    waiter.join(timeout=1.0)
    assert waiter.is_alive(), "the second claimer must wait for the first's counter row"
    slice_tx.commit()
    slice_conn.close()
    waiter.join(timeout=30)
    assert len(outcome) == 1 and isinstance(outcome[0], IntegrityError)
    assert outcome[0].orig.diag.constraint_name == "ck_node_capacity_claim_kinds_apart"


def test_claim_cannot_span_nodes(engine, fleet):
    def foreign_slot(conn):
        alloc = allocation(conn, fleet["a"])
        claim(conn, alloc, fleet["a"], fleet["slots_b"][0])

    refused(engine, foreign_slot, "fk_allocation_resource_claims_slot_node")

    def allocation_elsewhere(conn):
        alloc = allocation(conn, fleet["b"])
        claim(conn, alloc, fleet["a"], fleet["slots_a"][2])

    refused(engine, allocation_elsewhere, "fk_allocation_resource_claims_allocation_node")


def test_slot_claim_needs_a_slot_and_exclusive_claim_none(engine, fleet):
    def slot_claim_without_slot(conn):
        alloc = allocation(conn, fleet["a"])
        claim(conn, alloc, fleet["a"], None, kind="slot")

    refused(engine, slot_claim_without_slot, "ck_allocation_resource_claims_slot_claim_has_slot")


def test_mac_unique_across_the_fleet(engine, fleet):
    with engine.begin() as conn:
        slot(conn, fleet["b"], 7, "disabled", mac="52:54:00:AA:BB:CC")
    refused(
        engine,
        lambda c: slot(c, fleet["a"], 7, "disabled", mac="52:54:00:aa:bb:cc"),
        "uq_node_resource_slots_mac_address",
    )


@pytest.mark.parametrize("field", ["ip", "vf", "gpu", "disk"])
def test_ip_vf_gpu_disk_unique_per_node(engine, fleet, field):
    values = {
        "ip": "10.100.0.10",
        "vf": "0000:1a:00.1",
        "gpu": "0000:1b:00.0",
        "disk": f"{BY_ID}000",
    }
    column = {"ip": "private_ip", "vf": "fabric_vf_pci_address", "gpu": "gpu_pci_address"}
    constraint = f"uq_node_resource_slots_node_id_{column.get(field, 'nvme_device')}"
    refused(
        engine, lambda c: slot(c, fleet["a"], 9, "disabled", **{field: values[field]}), constraint
    )
    # The same value on another node is fine (except MAC, which is fleet-wide).
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM node_resource_slots WHERE node_id = :b"), {"b": fleet["b"]})
        slot(conn, fleet["b"], 9, "disabled", **{field: values[field]})


@pytest.mark.parametrize(
    ("table", "column", "value"),
    [
        ("node_resource_slots", "status", "free"),
        ("node_resource_slots", "health_state", "unhealthy"),
        ("node_resource_slots", "fabric_claim_mode", "shared"),
        ("node_resource_slots", "sharing_mechanism", "mig"),
        ("nodes", "admin_state", "maintenance"),
        ("nodes", "profile_intent", "gpu"),
        ("allocations", "state", "running"),
        ("allocations", "capacity_shape", "gpu_partition"),
        ("allocation_resource_claims", "claim_kind", "gpu"),
    ],
)
def test_enumerations_are_checked(engine, fleet, table, column, value):
    with engine.begin() as conn:
        alloc = allocation(conn, fleet["a"])
        claim(conn, alloc, fleet["a"], fleet["slots_a"][3])
        conn.execute(text("UPDATE node_resource_slots SET status = 'disabled'"))
    enum_name = {
        "status": "slot_status",
        "state": "allocation_state",
        "capacity_shape": "capacity_shape",
    }.get(column, column)
    refused(
        engine,
        lambda c: c.execute(text(f"UPDATE {table} SET {column} = :v"), {"v": value}),
        f"ck_{table}_{enum_name}",
    )


def test_health_state_from_the_seed_story_is_refused(engine, fleet):
    """A cleanup path once wrote health 'unhealthy'; the schema accepts only the four states."""
    refused(
        engine,
        lambda c: c.execute(text("UPDATE node_resource_slots SET health_state = 'unhealthy'")),
        "ck_node_resource_slots_health_state",
    )


@pytest.mark.parametrize(
    "overrides",
    [
        {"disk": "/dev/nvme0n1"},
        {"mac": None},
        {"ip": None},
        {"vf": None},
        {"mode": "shared_device"},
        {"gpu": None},
    ],
)
def test_incomplete_slot_cannot_be_available(engine, fleet, overrides):
    refused(
        engine,
        lambda c: slot(c, fleet["b"], 5, "available", **overrides),
        "ck_node_resource_slots_available_is_complete",
    )


def test_slot_awaiting_wipe_cannot_be_available(engine, fleet):
    with engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE node_resource_slots SET status = 'cleanup', wipe_required = true"
                " WHERE id = :s"
            ),
            {"s": fleet["slots_a"][0]},
        )
    refused(
        engine,
        lambda c: c.execute(
            text("UPDATE node_resource_slots SET status = 'available' WHERE id = :s"),
            {"s": fleet["slots_a"][0]},
        ),
        "ck_node_resource_slots_available_needs_no_wipe",
    )


def test_malformed_pci_mac_ip_are_refused(engine, fleet):
    refused(
        engine,
        lambda c: slot(c, fleet["b"], 6, "disabled", gpu="1b:00.0"),
        "ck_node_resource_slots_gpu_pci_address_format",
    )
    refused(
        engine,
        lambda c: slot(c, fleet["b"], 6, "disabled", mac="52:54:zz:00:00:01"),
        "invalid input syntax for type macaddr",
        DBAPIError,
    )
    refused(
        engine,
        lambda c: slot(c, fleet["b"], 6, "disabled", ip="10.100.0.999"),
        "invalid input syntax for type inet",
        DBAPIError,
    )


def test_failed_allocation_needs_a_reason(engine, fleet):
    with engine.begin() as conn:
        alloc = allocation(conn, fleet["a"])
    refused(
        engine,
        lambda c: c.execute(
            text("UPDATE allocations SET state = 'failed' WHERE id = :a"), {"a": alloc}
        ),
        "ck_allocations_failed_has_reason",
    )


def test_evidence_is_append_only(engine, fleet):
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO evidence (kind, passed, summary, recorded_by, node_id)"
                " VALUES ('wipe_proof', true, 'wiped', 'test', :n)"
            ),
            {"n": fleet["a"]},
        )
    for statement in (
        "UPDATE evidence SET passed = false",
        "DELETE FROM evidence",
        "TRUNCATE evidence CASCADE",
    ):
        refused(
            engine,
            lambda c, sql=statement: c.execute(text(sql)),
            "evidence is append-only",
            DBAPIError,
        )
    with engine.connect() as conn:
        assert conn.execute(text("SELECT passed FROM evidence")).scalar_one() is True


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        (
            "INSERT INTO skus (slug, display_name, capacity_shape, node_family, gpu_model,"
            " allowed_gpu_counts) VALUES ('x', 'x', 'gpu_partition', 'f', 'm', '{1}')",
            "ck_skus_capacity_shape",
        ),
        ("UPDATE nodes SET slice_network_mode = 'public'", "ck_nodes_slice_network_mode"),
        (
            "INSERT INTO node_tasks (node_id, kind) SELECT id, 'slice.reboot' FROM nodes",
            "ck_node_tasks_node_task_kind",
        ),
        (
            "INSERT INTO node_tasks (node_id, kind, state) SELECT id, 'host.parity', 'done'"
            " FROM nodes",
            "ck_node_tasks_node_task_state",
        ),
        (
            "INSERT INTO evidence (kind, passed, summary, recorded_by)"
            " VALUES ('hunch', true, 's', 'test')",
            "ck_evidence_evidence_kind",
        ),
        (
            "INSERT INTO os_images (slug, status) VALUES ('img', 'published')",
            "ck_os_images_image_status",
        ),
        (
            "INSERT INTO os_images (slug, driver_strategy) VALUES ('img', 'magic')",
            "ck_os_images_driver_strategy",
        ),
        (
            "INSERT INTO node_image_cache (node_id, image_id, status)"
            " SELECT n.id, i.id, 'warm' FROM nodes n, os_images i LIMIT 1",
            "ck_node_image_cache_image_cache_status",
        ),
    ],
    ids=[
        "sku_shape",
        "network_mode",
        "task_kind",
        "task_state",
        "evidence_kind",
        "image_status",
        "driver_strategy",
        "cache_status",
    ],
)
def test_enumerations_of_tasks_evidence_and_images_are_checked(
    engine, fleet, statement, constraint
):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO os_images (slug) VALUES ('seeded')"))
    refused(engine, lambda c: c.execute(text(statement)), constraint)


@pytest.mark.parametrize(
    "attack",
    [
        "DELETE FROM node_capacity WHERE node_id = :n",
        "UPDATE node_capacity SET slot_claims = 0 WHERE node_id = :n",
        "INSERT INTO node_capacity (node_id) VALUES (gen_random_uuid())",
        "TRUNCATE node_capacity",
    ],
    ids=["delete_row", "zero_counter", "insert_row", "truncate"],
)
def test_node_counters_cannot_be_written_by_hand(engine, fleet, attack):
    """The claim-kind rule reads these counters: forging them would let kinds mix."""
    with engine.begin() as conn:
        sl = allocation(conn, fleet["a"])
        claim(conn, sl, fleet["a"], fleet["slots_a"][1])
    refused(
        engine,
        lambda c: c.execute(text(attack), {"n": fleet["a"]}),
        "node_capacity is kept by triggers",
        DBAPIError,
    )

    def exclusive(conn):
        bm = allocation(conn, fleet["a"], "baremetal")
        claim(conn, bm, fleet["a"], kind="node_exclusive")

    refused(engine, exclusive, "ck_node_capacity_claim_kinds_apart")
    with engine.connect() as conn:
        counters = conn.execute(
            text("SELECT slot_claims, exclusive_claims FROM node_capacity WHERE node_id = :n"),
            {"n": fleet["a"]},
        ).one()
    assert tuple(counters) == (1, 0)


def _awaiting_wipe(conn, slot_id) -> None:
    conn.execute(
        text(
            "UPDATE node_resource_slots SET status = 'cleanup', wipe_required = true WHERE id = :s"
        ),
        {"s": slot_id},
    )


def _evidence(conn, slot_id, kind: str = "wipe_proof", passed: bool = True) -> int:
    return conn.execute(
        text(
            "INSERT INTO evidence (kind, passed, summary, recorded_by, slot_id)"
            " VALUES (:k, :p, 'wipe', 'test', :s) RETURNING id"
        ),
        {"k": kind, "p": passed, "s": slot_id},
    ).scalar_one()


@pytest.mark.parametrize(
    "proof",
    ["none", "failed", "other_slot", "other_kind"],
)
def test_wipe_required_clears_only_with_a_passed_proof_for_the_slot(engine, fleet, proof):
    target, other = fleet["slots_a"][0], fleet["slots_a"][1]
    with engine.begin() as conn:
        _awaiting_wipe(conn, target)
        proof_id = {
            "none": None,
            "failed": lambda: _evidence(conn, target, passed=False),
            "other_slot": lambda: _evidence(conn, other),
            "other_kind": lambda: _evidence(conn, target, kind="parity"),
        }[proof]
        proof_id = proof_id() if proof_id else None
    refused(
        engine,
        lambda c: c.execute(
            text(
                "UPDATE node_resource_slots SET wipe_required = false, status = 'available',"
                " last_wipe_proof_id = :p WHERE id = :s"
            ),
            {"s": target, "p": proof_id},
        ),
        "needs a new passed wipe_proof",
        DBAPIError,
    )
    with engine.begin() as conn:
        good = _evidence(conn, target)
        conn.execute(
            text(
                "UPDATE node_resource_slots SET wipe_required = false, status = 'available',"
                " last_wipe_proof_id = :p WHERE id = :s"
            ),
            {"s": target, "p": good},
        )
    # The same proof cannot clear the next tenant's wipe.
    with engine.begin() as conn:
        _awaiting_wipe(conn, target)
    refused(
        engine,
        lambda c: c.execute(
            text("UPDATE node_resource_slots SET wipe_required = false WHERE id = :s"),
            {"s": target},
        ),
        "needs a new passed wipe_proof",
        DBAPIError,
    )
