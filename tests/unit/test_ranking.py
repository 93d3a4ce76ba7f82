"""The placement ranking is a pure, deterministic function of a snapshot."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from controlplane.scheduler.ranking import (
    BaremetalNode,
    Policy,
    SliceNode,
    SlotView,
    best_slot_set,
    rank_baremetal_nodes,
    rank_slice_nodes,
)


def node(
    name: str, free: dict[int, int], clean: bool = True, numa_of=lambda i: i // 4
) -> SliceNode:
    """A node with free slots at the given indexes (index -> gpu_count)."""
    node_id = uuid.uuid5(uuid.NAMESPACE_DNS, name)
    slots = tuple(
        SlotView(uuid.uuid5(node_id, str(i)), i, numa_of(i), gpus)
        for i, gpus in sorted(free.items())
    )
    return SliceNode(node_id, name, clean, slots)


def free(*indexes: int) -> dict[int, int]:
    return dict.fromkeys(indexes, 1)


def test_same_snapshot_same_choice():
    snapshot = [node(f"n{i}", free(*range(8))) for i in range(20)]
    first = rank_slice_nodes(snapshot, 2, "req-1")
    assert first == rank_slice_nodes(list(reversed(snapshot)), 2, "req-1")
    assert [c.hostname for c in first] == [
        c.hostname for c in rank_slice_nodes(snapshot, 2, "req-1")
    ]


def test_salt_spreads_ties_but_never_beats_a_better_node():
    equal = [node(f"n{i}", free(*range(8))) for i in range(20)]
    better = node("partial", free(0, 1, 2, 3), clean=False)
    winners = {rank_slice_nodes([*equal, better], 1, f"req-{k}")[0].hostname for k in range(30)}
    assert winners == {"partial"}
    spread = {rank_slice_nodes(equal, 1, f"req-{k}")[0].hostname for k in range(30)}
    assert len(spread) > 5


def test_partially_sliced_nodes_before_clean_ones():
    clean_tight = node("clean", free(0, 1), clean=True)
    sliced_loose = node("sliced", free(*range(6)), clean=False)
    assert rank_slice_nodes([clean_tight, sliced_loose], 2, "r")[0].hostname == "sliced"


def test_best_fit_leaves_the_least_waste():
    nodes = [
        node("six", free(*range(6)), clean=False),
        node("two", free(0, 4), clean=False),
        node("four", free(0, 1, 2, 3), clean=False),
    ]
    assert [c.hostname for c in rank_slice_nodes(nodes, 2, "r")] == ["two", "four", "six"]


def test_fewest_numa_nodes_within_a_node():
    spread = node("n", free(2, 3, 4, 5, 6))
    choice = rank_slice_nodes([spread], 3, "r")[0]
    assert choice.numa_span == 1
    indexes = sorted(i for i, s in enumerate(spread.slots) if s.slot_id in choice.slot_ids)
    assert [spread.slots[i].slot_index for i in indexes] == [4, 5, 6]


def test_numa_span_breaks_ties_between_nodes_with_equal_waste():
    split = node("split", free(2, 3, 4, 5), clean=False)
    local = node("local", free(0, 1, 2, 3), clean=False)
    assert rank_slice_nodes([split, local], 4, "r")[0].hostname == "local"


def test_best_fit_inside_the_node_keeps_the_large_numa_hole():
    n = node("n", free(0, 1, 2, 3, 7))
    slots, span = best_slot_set(n, 1)
    assert span == 1 and [s.slot_index for s in slots] == [7]


def test_nodes_without_enough_free_gpus_are_skipped():
    assert rank_slice_nodes([node("n", free(0, 1, 2))], 4, "r") == []


def test_first_fit_and_random_baselines():
    nodes = [node(name, free(*range(8))) for name in ("c", "a", "b")]
    assert [c.hostname for c in rank_slice_nodes(nodes, 1, "r", Policy.FIRST_FIT)] == [
        "a",
        "b",
        "c",
    ]


def test_random_baseline_is_a_salted_shuffle_not_name_order():
    nodes = [node(f"n{i:02d}", free(*range(8))) for i in range(12)]
    by_name = [n.hostname for n in nodes]
    orders = {
        salt: [c.hostname for c in rank_slice_nodes(nodes, 1, salt, Policy.RANDOM)]
        for salt in (f"req-{k}" for k in range(10))
    }
    for salt, order in orders.items():
        assert sorted(order) == by_name
        reversed_input = rank_slice_nodes(list(reversed(nodes)), 1, salt, Policy.RANDOM)
        assert [c.hostname for c in reversed_input] == order
    assert all(order != by_name for order in orders.values())
    assert len({order[0] for order in orders.values()}) > 3


def test_baremetal_prefers_baremetal_intent_then_fewest_slice_slots_lost():
    nodes = [
        BaremetalNode(uuid.uuid4(), "slice8", False, 8),
        BaremetalNode(uuid.uuid4(), "slice0", False, 0),
        BaremetalNode(uuid.uuid4(), "bm", True, 0),
    ]
    assert [n.hostname for n in rank_baremetal_nodes(nodes, "r")] == ["bm", "slice0", "slice8"]


@given(
    layout=st.lists(
        st.tuples(st.booleans(), st.sets(st.integers(0, 7), max_size=8)), min_size=1, max_size=12
    ),
    gpus=st.sampled_from([1, 2, 4, 8]),
    salt=st.text(max_size=8),
)
def test_choices_are_valid_same_node_sets_and_deterministic(layout, gpus, salt):
    snapshot = [node(f"n{i}", free(*idx), clean) for i, (clean, idx) in enumerate(layout)]
    ranked = rank_slice_nodes(snapshot, gpus, salt)
    assert ranked == rank_slice_nodes(snapshot, gpus, salt)
    by_id = {n.node_id: n for n in snapshot}
    for choice in ranked:
        owner = by_id[choice.node_id]
        assert len(set(choice.slot_ids)) == gpus
        assert set(choice.slot_ids) <= {s.slot_id for s in owner.slots}
    eligible = {n.node_id for n in snapshot if n.free_gpus >= gpus}
    assert {c.node_id for c in ranked} == eligible
    keys = [(by_id[c.node_id].clean, by_id[c.node_id].free_gpus - gpus) for c in ranked]
    assert keys == sorted(keys)


def test_text_ids_rank_like_uuids():
    """The scheduler passes ids as text; the ranking and its tie-break do not change."""
    layout = [free(*range(8)), free(0, 1, 2), free(4, 5, 6, 7), free(1, 6)] * 5
    by_uuid = [node(f"n{i}", idx, clean=len(idx) == 8) for i, idx in enumerate(layout)]
    by_text = [
        SliceNode(
            str(n.node_id),
            n.hostname,
            n.clean,
            tuple(s._replace(slot_id=str(s.slot_id)) for s in n.slots),
        )
        for n in by_uuid
    ]
    for gpus in (1, 2, 4, 8):
        expected = [
            (str(c.node_id), tuple(map(str, c.slot_ids)), c.numa_span)
            for c in rank_slice_nodes(by_uuid, gpus, "req-7")
        ]
        ranked = rank_slice_nodes(by_text, gpus, "req-7")
        got = [(c.node_id, c.slot_ids, c.numa_span) for c in ranked]
        assert got == expected
