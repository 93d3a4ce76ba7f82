"""The admission rule for host actions on one node (docs/operations.md, "Concurrency")."""

from __future__ import annotations

import pytest

from controlplane.enums import NodeTaskKind as K
from controlplane.services.tasks import EXCLUSIVE_KINDS, job_refusal, refusal


def test_shared_actions_fill_the_node_up_to_its_limit():
    assert refusal(K.VM_PROVISION, [], 2) is None
    assert refusal(K.VM_PROVISION, [K.VM_RELEASE], 2) is None
    assert refusal(K.DISK_WIPE, [K.VM_RELEASE, K.VM_PROVISION], 2) == (
        "2 host actions are running, the node's limit is 2"
    )


@pytest.mark.parametrize("alone", sorted(EXCLUSIVE_KINDS))
def test_host_wide_actions_run_alone(alone):
    assert refusal(alone, [], 1) is None
    assert refusal(alone, [K.HOST_PARITY], 8) == (
        f"{alone.value} runs alone and 1 host action(s) are running"
    )
    assert refusal(K.HOST_PARITY, [alone], 8) == f"{alone.value} is running and runs alone"
    assert refusal(alone, [alone], 8) is not None


def test_probes_and_vm_actions_share_the_node():
    shared = set(K) - EXCLUSIVE_KINDS
    assert {K.VM_PROVISION, K.VM_RELEASE, K.DISK_WIPE, K.HOST_PARITY, K.RECONCILE} <= shared
    assert {K.HOST_BOOTSTRAP, K.HOST_NETWORK, K.STORAGE_TRANSITION} == EXCLUSIVE_KINDS


def test_a_job_is_refused_when_any_of_its_actions_finds_no_room():
    # Each action of the job counts beside the ones before it.
    assert job_refusal([K.TOPOLOGY_DISCOVER, K.HOST_PARITY], [K.VM_PROVISION], 3) is None
    assert job_refusal([K.TOPOLOGY_DISCOVER, K.HOST_PARITY], [K.VM_PROVISION], 2) == (
        "2 host actions are running, the node's limit is 2"
    )
    assert job_refusal([K.TOPOLOGY_DISCOVER, K.HOST_PARITY], [K.HOST_BOOTSTRAP], 8) == (
        f"{K.HOST_BOOTSTRAP.value} is running and runs alone"
    )
    # A quiet action first, on a quiet node; after another action of its own job, not.
    assert job_refusal([K.HOST_HEALTH, K.HOST_PARITY], [], 4) is None
    assert job_refusal([K.HOST_PARITY, K.HOST_HEALTH], [], 4) is not None
