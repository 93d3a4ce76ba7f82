"""A health check starts only on a quiet node (the admission rule, tasks.refusal): a
running provision, wipe or parity check would read as a fault; and a running health check
holds no other action back beyond the node's limit."""

from __future__ import annotations

import pytest

from controlplane.enums import NodeTaskKind
from controlplane.services.tasks import refusal

HEALTH = NodeTaskKind.HOST_HEALTH


def test_a_health_check_starts_on_a_quiet_node():
    assert refusal(HEALTH, [], limit=4) is None


@pytest.mark.parametrize(
    "running",
    [
        [NodeTaskKind.VM_PROVISION],
        [NodeTaskKind.DISK_WIPE],
        [NodeTaskKind.HOST_PARITY, NodeTaskKind.IMAGE_CACHE],
        [HEALTH],
        [NodeTaskKind.HOST_BOOTSTRAP],
    ],
)
def test_a_health_check_waits_for_any_running_host_action(running):
    reason = refusal(HEALTH, running, limit=4)
    assert reason == (
        f"host.health starts only on a quiet node and {len(running)} host action(s) are running"
    )


def test_other_actions_start_beside_a_running_health_check_within_the_limit():
    assert refusal(NodeTaskKind.VM_PROVISION, [HEALTH], limit=2) is None
    assert refusal(NodeTaskKind.VM_PROVISION, [HEALTH], limit=1) is not None
    assert refusal(NodeTaskKind.HOST_BOOTSTRAP, [HEALTH], limit=4) is not None
