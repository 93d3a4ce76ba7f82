"""NVMe secure-erase selection from recorded `nvme id-ctrl -o json` output, method chains,
marker and sample placement (pure, no devices needed).

The JSON files under data/ follow nvme-cli 2.x's `-o json` field names and encodings
(integers, or hex strings as some versions print them); they are representative documents,
not captures from the fleet's drives.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import disk_wipe
from ansible_collections.gpuaas.fleet.plugins.module_utils.disk_wipe import (
    SES_CRYPTO,
    SES_USER_DATA,
    choose_nvme_format,
    current_lbaf,
    marker_offsets,
    method_chain,
    probe_nvme_format,
    sample_offsets,
)

DATA = Path(__file__).parent / "data"


def doc(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_crypto_erase_when_fna_bit2_is_set():
    choice = choose_nvme_format(
        "/dev/nvme3n1", doc("id-ctrl-pm9a3-crypto.json"), doc("id-ns-lbaf1.json"), 1
    )
    assert choice.applicable
    assert choice.ses == SES_CRYPTO
    assert choice.lbaf == 1
    assert choice.argv == [
        "nvme",
        "format",
        "/dev/nvme3n1",
        "--ses=2",
        "--lbaf=1",
        "--timeout=1800000",
        "--force",
    ]
    assert "cryptographic" in choice.reason


def test_user_data_erase_without_crypto_support():
    choice = choose_nvme_format(
        "/dev/nvme0n1", doc("id-ctrl-no-crypto.json"), doc("id-ns-lbaf0.json"), 1
    )
    assert choice.applicable
    assert choice.ses == SES_USER_DATA
    assert "--ses=1" in choice.argv and "--lbaf=0" in choice.argv


def test_format_goes_to_the_controller_with_the_namespace_id_when_known():
    choice = choose_nvme_format(
        "/dev/nvme3n1",
        doc("id-ctrl-pm9a3-crypto.json"),
        doc("id-ns-lbaf1.json"),
        1,
        controller_path="/dev/nvme3",
        nsid=1,
    )
    assert choice.argv[:4] == ["nvme", "format", "/dev/nvme3", "--namespace-id=1"]


def test_refuses_format_that_would_erase_other_namespaces():
    ctrl = doc("id-ctrl-erase-all-namespaces.json")
    shared = choose_nvme_format("/dev/nvme1n1", ctrl, doc("id-ns-lbaf0.json"), 2)
    assert not shared.applicable and "other namespaces" in shared.reason
    unknown = choose_nvme_format("/dev/nvme1n1", ctrl, doc("id-ns-lbaf0.json"), None)
    assert not unknown.applicable and "unknown number" in unknown.reason
    alone = choose_nvme_format("/dev/nvme1n1", ctrl, doc("id-ns-lbaf0.json"), 1)
    assert alone.applicable and alone.ses == SES_CRYPTO


def test_not_applicable_without_format_nvm_support():
    choice = choose_nvme_format(
        "/dev/nvme9n1", doc("id-ctrl-no-format.json"), doc("id-ns-lbaf0.json"), 1
    )
    assert not choice.applicable and "Format NVM" in choice.reason


@pytest.mark.parametrize(("flbas", "index"), [(0, 0), (1, 1), ("0x10", 0), (0x63, 51), (0x2F, 31)])
def test_current_lbaf_uses_low_and_extended_bits(flbas, index):
    assert current_lbaf({"flbas": flbas}) == index


def test_probe_is_not_applicable_on_non_nvme_names():
    choice, commands = probe_nvme_format("loop7", "/dev/loop7")
    assert not choice.applicable
    assert "not an NVMe namespace" in choice.reason
    assert commands == []
    assert not probe_nvme_format("nvme4c4n1", "/dev/nvme4c4n1")[0].applicable


def test_method_chains():
    assert method_chain("auto") == ["nvme_format", "blkdiscard", "write_zeroes", "zero"]
    assert method_chain("blkdiscard") == ["blkdiscard", "write_zeroes", "zero"]
    assert method_chain("blkdiscard", allow_fallback=False) == ["blkdiscard"]
    assert method_chain("zero") == ["zero"]
    with pytest.raises(disk_wipe.WipeError):
        method_chain("shred")


def test_marker_and_sample_offsets_cover_start_middle_end_aligned():
    size = 64 * 1024 * 1024
    markers = [{"offset": o} for o in marker_offsets(size)]
    assert [m["offset"] for m in markers] == [0, size // 2, size - 4096]
    offsets = sample_offsets(size, 16, 1024 * 1024, markers)
    assert len(offsets) == 16
    assert all(o % 4096 == 0 and o + 1024 * 1024 <= size for o in offsets)
    assert 0 in offsets and size - 1024 * 1024 in offsets and size // 2 in offsets


def test_sample_offsets_on_a_tiny_device_terminate():
    offsets = sample_offsets(8192, 16, 4096, [])
    assert offsets == [0, 4096]
