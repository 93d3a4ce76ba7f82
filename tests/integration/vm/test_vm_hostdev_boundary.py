"""The VFIO boundary of this machine, named: GPU/VF hostdevs are defined, not started.

There are no GPUs, fabric VFs or IOMMU groups here, so a domain with VFIO hostdevs cannot
start. What can be proven is that libvirt's daemon accepts the production XML (hostdevs,
UEFI with Secure Boot off, NUMA and hugepage placement) as a definition, that our
fingerprint reads libvirt's normalized copy back as identical (so a second run is a no-op),
that starting it fails on the missing PCI devices, and that removal undefines it with
its NVRAM. The real-VM tests boot the same XML without hostdevs.
"""

from __future__ import annotations

import uuid

import pytest
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_domain

pytestmark = [pytest.mark.root]


def test_libvirt_accepts_the_hostdev_domain_but_cannot_start_it_here(linux_lab, tmp_path):
    lab = linux_lab
    disks = [lab.disk(), lab.disk()]
    params = {
        "allocation_id": str(uuid.uuid4()),
        "state": "defined",
        "slots": [
            {
                "gpu_pci_address": "0000:1b:00.0",
                "fabric_vf_pci_address": "0000:1a:00.1",
                "nvme_device": disks[0].stable_path,
                "numa_node": None,
            },
            {
                "gpu_pci_address": "0000:3d:00.0",
                "fabric_vf_pci_address": "0000:1a:00.2",
                "nvme_device": disks[1].stable_path,
                "numa_node": None,
            },
        ],
        "profile": {"vcpus": 2, "memory_mib": 1024, "hugepages": True},
        "mac_address": "52:54:00:5a:00:30",
        "bridge": lab.bridge,
        "bridge_type": "linux",
        "seed_iso": str(tmp_path / "seed.iso"),
        "console_log": str(tmp_path / "console.log"),
        "emulation": True,
        "pci_passthrough": True,
        "libvirt_uri": lab.libvirt_uri_outside,
    }
    name = vm_common.domain_name(params["allocation_id"])
    try:
        defined = vm_domain.run(params, check_mode=False)
        assert defined["changed"] and defined["actions"] == ["define"]
        xml = lab.virsh("dumpxml", "--inactive", name).stdout
        fingerprint = vm_domain.domain_fingerprint(xml)
        assert fingerprint["hostdevs"] == [
            "0000:1b:00.0",
            "0000:1a:00.1",
            "0000:3d:00.0",
            "0000:1a:00.2",
        ]
        assert fingerprint["secure_boot"] is False and fingerprint["tpm"] == 0
        assert fingerprint["hugepage_kib"] == 1048576
        assert not vm_domain.run(params, check_mode=False)["changed"]

        started = lab.virsh("start", name, check=False)
        assert started.returncode != 0
        assert "doesn't support VFIO PCI passthrough" in started.stderr, started.stderr

        removed = vm_domain.run(
            {
                **params,
                "state": "absent",
                "shutdown_timeout": 5,
                "undefine_attempts": 2,
                "undefine_retry_delay": 0.2,
            },
            False,
        )
        assert removed["changed"] and removed["actions"] == ["undefine"]
        assert name not in lab.virsh("list", "--all", "--name").stdout
        gone = vm_domain.run(
            {
                **params,
                "state": "absent",
                "shutdown_timeout": 5,
                "undefine_attempts": 2,
                "undefine_retry_delay": 0.2,
            },
            False,
        )
        assert not gone["changed"]
    finally:
        lab.virsh("undefine", "--nvram", name, check=False)
