"""How flow artifacts put store facts into words (flows/artifacts.py)."""

from __future__ import annotations

from flows.artifacts import describe_blockers


def test_each_blocker_code_once_in_words_with_the_slots_it_affects():
    blockers = [
        {"code": "no_vf_for_slot", "detail": "no free VF on the GPU's NUMA node", "slot_index": 3},
        {"code": "kvm_missing", "detail": "/dev/kvm is missing: enable VT-x/VMX in firmware"},
        {"code": "no_vf_for_slot", "detail": "no free VF on the GPU's NUMA node", "slot_index": 1},
    ]
    assert describe_blockers(blockers) == (
        "no_vf_for_slot (slots 1, 3): no free VF on the GPU's NUMA node"
        " | kvm_missing: /dev/kvm is missing: enable VT-x/VMX in firmware"
    )


def test_one_slot_many_details_and_no_detail():
    blockers = [
        {"code": "disk_mounted", "detail": "/dev/nvme1n1 is mounted at /a", "slot_index": 2},
        {"code": "disk_mounted", "detail": "/dev/nvme2n1 is mounted at /b", "slot_index": 2},
        {"code": "disk_mounted", "detail": "/dev/nvme3n1 is mounted at /c", "slot_index": 2},
        {"code": "bare"},
    ]
    assert describe_blockers(blockers) == (
        "disk_mounted (slot 2): /dev/nvme1n1 is mounted at /a; /dev/nvme2n1 is mounted at /b;"
        " and 1 more | bare"
    )
    assert describe_blockers([]) == ""
