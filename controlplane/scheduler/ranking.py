"""Placement ranking: pure, deterministic functions of a snapshot.

Nothing here touches the database. Given the same snapshot, request and salt, every
function returns the same ordered choices. The salt (the allocation id) only breaks ties
between equally good nodes, so concurrent requests spread over equivalent nodes instead
of all racing for the first one.
"""

from __future__ import annotations

import hashlib
import random
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from itertools import combinations
from operator import itemgetter
from typing import NamedTuple

# Ids are opaque here: the scheduler passes their text form (cheaper to hash and compare
# than uuid.UUID), and the tie-break hashes the same text for either.
Id = str | uuid.UUID


class Policy(StrEnum):
    BEST_FIT = "best_fit"
    FIRST_FIT = "first_fit"
    RANDOM = "random"


class SlotView(NamedTuple):
    slot_id: Id
    slot_index: int
    numa_node: int
    gpu_count: int = 1


@dataclass(frozen=True)
class SliceNode:
    """A node's eligible free slots, and whether the node is clean (baremetal-able)."""

    node_id: Id
    hostname: str
    clean: bool
    slots: tuple[SlotView, ...]

    @cached_property
    def free_gpus(self) -> int:
        return sum(s.gpu_count for s in self.slots)


@dataclass(frozen=True)
class BaremetalNode:
    node_id: Id
    hostname: str
    baremetal_intent: bool
    approved_free_slots: int


@dataclass(frozen=True)
class SliceChoice:
    node_id: Id
    hostname: str
    slot_ids: tuple[Id, ...]
    numa_span: int


def tiebreak(salt: str, node_id: Id) -> str:
    return hashlib.sha256(f"{salt}:{node_id}".encode()).hexdigest()


def best_slot_set(node: SliceNode, gpus: int) -> tuple[tuple[SlotView, ...], int] | None:
    """The slots spanning the fewest NUMA nodes for ``gpus`` GPUs.

    Among equal spans, the NUMA group left with the fewest free GPUs wins (best fit inside
    the node keeps the larger holes for larger requests), then the lowest slot indexes.
    """
    by_numa: dict[int, list[SlotView]] = defaultdict(list)
    for slot in sorted(node.slots, key=itemgetter(1)):
        by_numa[slot.numa_node].append(slot)
    if all(s.gpu_count == 1 for s in node.slots):
        # Whole-GPU slots (v1): the single NUMA group with the fewest free that still fits.
        fitting = [slots for slots in by_numa.values() if len(slots) >= gpus]
        if fitting:
            pool = min(fitting, key=lambda slots: (len(slots), slots[0].slot_index))
            return tuple(pool[:gpus]), 1
    free = {numa: sum(s.gpu_count for s in slots) for numa, slots in by_numa.items()}
    for span in range(1, len(by_numa) + 1):
        best: tuple[tuple[int, ...], tuple[SlotView, ...]] | None = None
        for group in combinations(sorted(by_numa), span):
            available = sum(free[numa] for numa in group)
            if available < gpus:
                continue
            chosen: list[SlotView] = []
            taken = 0
            for slot in (s for numa in group for s in by_numa[numa]):
                if taken >= gpus:
                    break
                chosen.append(slot)
                taken += slot.gpu_count
            if taken != gpus:
                continue
            key = (available - gpus, *(s.slot_index for s in chosen))
            if best is None or key < best[0]:
                best = (key, tuple(chosen))
        if best is not None:
            return best[1], span
    return None


def rank_slice_nodes(
    snapshot: Sequence[SliceNode], gpus: int, salt: str, policy: Policy = Policy.BEST_FIT
) -> list[SliceChoice]:
    """Ordered same-node choices for a ``gpus``-GPU slice.

    best_fit: partially sliced nodes before clean ones (clean nodes stay free for
    baremetal), then the least waste (free GPUs left over), then the fewest NUMA nodes
    spanned, then a stable salted tie-break.
    first_fit: nodes in host name order, lowest slot indexes.
    random: a salted shuffle (a baseline for benchmarks).
    """
    choices: list[tuple[tuple, SliceChoice]] = []
    for node in snapshot:
        if node.free_gpus < gpus:
            continue
        if policy is Policy.BEST_FIT:
            picked = best_slot_set(node, gpus)
        else:
            ordered = tuple(sorted(node.slots, key=lambda s: s.slot_index)[:gpus])
            picked = (ordered, len({s.numa_node for s in ordered}))
        if picked is None:
            continue
        slots, span = picked
        choice = SliceChoice(node.node_id, node.hostname, tuple(s.slot_id for s in slots), span)
        if policy is Policy.BEST_FIT:
            key = (node.clean, node.free_gpus - gpus, span, tiebreak(salt, node.node_id))
        else:
            key = (node.hostname,)
        choices.append((key, choice))
    choices.sort(key=lambda item: item[0])
    ranked = [choice for _, choice in choices]
    if policy is Policy.RANDOM:
        random.Random(salt).shuffle(ranked)
    return ranked


def rank_baremetal_nodes(
    snapshot: Sequence[BaremetalNode], salt: str, policy: Policy = Policy.BEST_FIT
) -> list[BaremetalNode]:
    """best_fit: baremetal-intent nodes first, then the fewest approved slice slots lost."""
    if policy is Policy.FIRST_FIT:
        return sorted(snapshot, key=lambda n: n.hostname)
    if policy is Policy.RANDOM:
        ranked = sorted(snapshot, key=lambda n: n.hostname)
        random.Random(salt).shuffle(ranked)
        return ranked
    return sorted(
        snapshot,
        key=lambda n: (not n.baremetal_intent, n.approved_free_slots, tiebreak(salt, n.node_id)),
    )
