#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_vm_preflight
short_description: Check every precondition of a slice VM provision, then clone its image
version_added: "0.1.0"
description:
  - Read-only checks for one GPU slice allocation, run before the image clone or any
    other write. Fails with the first unmet precondition as C(failure) and every check's
    result in C(checks).
  - Refuses duplicate GPU, fabric VF or disk entries across the allocation's slots; a
    missing C(/dev/kvm) unless O(emulation) is selected; a missing Linux or Open vSwitch
    bridge; NUMA nodes the host does not have; too few free hugepages when the profile
    needs hugepage backing; GPUs or fabric VFs absent from the host or passed through to
    another libvirt domain.
  - Each slot disk must resolve from its stable identity to a real whole block device
    with nothing mounted on it or any child partition, no holders, no swap, no other
    process using it and no other libvirt domain using it, and must be raw (wiped) before
    the first provision. The allocation's own running domain may hold it (a second run).
  - Verifies the cached image's sha256 against the catalog digest.
  - With O(clone), once every check passed, clones the verified image onto the first slot's
    disk in the same process, as M(gpuaas.fleet.slice_vm_image) does (refusals, clone
    record, a second run is a no-op), without hashing the unchanged image again. The clone
    reports under RV(image) with when it finished, so a role times it as its own phase.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.stable_dirs
  - gpuaas.fleet.libvirt
options:
  allocation_id:
    description: Allocation UUID; the domain is named C(gpuaas-slice-<id hex>).
    type: str
    required: true
  slots:
    description: The allocation's approved slots.
    type: list
    elements: dict
    required: true
    suboptions:
      gpu_pci_address:
        description: GPU PCI address, for example C(0000:1b:00.0).
        type: str
        required: true
      fabric_vf_pci_address:
        description: The slot's own fabric VF PCI address.
        type: str
        required: true
      nvme_device:
        description: Raw disk by stable identity, for example C(/dev/disk/by-id/nvme-eui.*).
        type: str
        required: true
      numa_node:
        description: NUMA node of the slot's devices.
        type: int
  mac_address:
    description: Reserved management MAC of the VM.
    type: str
    required: true
  bridge:
    description: Bridge the VM's vNIC attaches to.
    type: str
    required: true
  bridge_type:
    description: Linux bridge or Open vSwitch bridge.
    type: str
    default: linux
    choices: [linux, openvswitch]
  profile:
    description: Runtime profile.
    type: dict
    required: true
    suboptions:
      vcpus:
        description: Virtual CPUs.
        type: int
        required: true
      memory_mib:
        description: Memory in MiB.
        type: int
        required: true
      hugepages:
        description: Back the memory with hugepages.
        type: bool
        default: false
      hugepage_size_kib:
        description: Hugepage size in KiB.
        type: int
        default: 1048576
      bandwidth:
        description:
          - Rates of the management vNIC (libvirt C(<bandwidth>); on an Open vSwitch port
            libvirt applies them as the port's policing and shaping). Absent means unshaped.
          - Negative, zero or absurd rates (above 100 Gbit/s, a burst above 1 GiB) and a
            peak below its average fail the module before anything changes.
        type: dict
        suboptions:
          inbound:
            description: Traffic the VM receives.
            type: dict
            suboptions:
              average:
                description: Average rate in kilobytes per second (1 to 12500000).
                type: int
                required: true
              peak:
                description: Peak rate in kilobytes per second, not below the average.
                type: int
              burst:
                description: Kilobytes that may go at the peak rate (1 to 1048576).
                type: int
          outbound:
            description: Traffic the VM sends.
            type: dict
            suboptions:
              average:
                description: Average rate in kilobytes per second (1 to 12500000).
                type: int
                required: true
              peak:
                description: Peak rate in kilobytes per second, not below the average.
                type: int
              burst:
                description: Kilobytes that may go at the peak rate (1 to 1048576).
                type: int
  image:
    description: Cached slice image.
    type: dict
    required: true
    suboptions:
      path:
        description: Image file in the node image cache.
        type: path
        required: true
      sha256:
        description: Catalog digest.
        type: str
        required: true
  emulation:
    description: Use QEMU emulation (domain type C(qemu)) instead of KVM; for test hosts.
    type: bool
    default: false
  pci_passthrough:
    description:
      - Pass the GPUs and fabric VFs through with VFIO. Only test hosts without VFIO set
        this to false.
    type: bool
    default: true
  kvm_device:
    description: The KVM device node that must exist unless O(emulation) is true.
    type: path
    default: /dev/kvm
  clone:
    description:
      - Clone the verified image onto the first slot's disk once every check passed.
        Absent means the module only checks and writes nothing.
    type: dict
    suboptions:
      state_dir:
        description: The allocation's state directory; the clone record is written there.
        type: path
        required: true
      timeout:
        description: Seconds the clone may take.
        type: int
        default: 3600
attributes:
  check_mode:
    description: Runs the same checks; with O(clone), reports the clone's plan and writes nothing.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
  platform:
    description: Linux hosts with libvirt.
    support: full
    platforms: posix
requirements:
  - libvirt-python
notes:
  - "Failure codes include C(duplicate_device), C(kvm_missing), C(bridge_missing),
    C(not_a_bridge), C(numa_node_missing), C(hugepages_insufficient),
    C(pci_device_missing), C(pci_in_use_by_domain), C(libvirt_unavailable),
    C(disk_in_use_by_domain), C(disk_not_raw), C(image_missing), C(image_digest_mismatch)
    and the disk codes of the blockdev inspection (C(not_stable_identity),
    C(not_block_device), C(mounted), C(child_mounted), C(device_busy), ...)."
  - "A failed clone fails with phase C(image) and the clone's codes (C(domain_exists),
    C(image_larger_than_disk), C(clone_failed), ...), with RV(checks) and RV(checked_at)."
"""

EXAMPLES = r"""
- name: Preflight a one-GPU slice
  gpuaas.fleet.slice_vm_preflight:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    slots:
      - gpu_pci_address: "0000:1b:00.0"
        fabric_vf_pci_address: "0000:1a:00.1"
        nvme_device: /dev/disk/by-id/nvme-eui.000000000000000100a075244a103331
        numa_node: 0
    mac_address: "52:54:00:3f:a2:10"
    bridge: ovsbr0
    bridge_type: openvswitch
    profile: {vcpus: 24, memory_mib: 65536, hugepages: true}
    image:
      path: /var/lib/gpuaas/slice-images/ubuntu-24.04-h200-cuda.raw
      sha256: "{{ image_sha256 }}"

- name: Check every precondition, then clone the image onto the boot disk
  gpuaas.fleet.slice_vm_preflight:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    slots:
      - gpu_pci_address: "0000:1b:00.0"
        fabric_vf_pci_address: "0000:1a:00.1"
        nvme_device: /dev/disk/by-id/nvme-eui.000000000000000100a075244a103331
    mac_address: "52:54:00:3f:a2:10"
    bridge: br-slice
    profile: {vcpus: 24, memory_mib: 65536}
    image:
      path: /var/lib/gpuaas/slice-images/ubuntu-24.04-h200-cuda.raw
      sha256: "{{ image_sha256 }}"
    clone:
      state_dir: /var/lib/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517
"""

RETURN = r"""
changed:
  description:
    - Whether the clone wrote (or in check mode would write) the disk; always false
      without O(clone), the checks change nothing.
  returned: always
  type: bool
checked_at:
  description:
    - When every check had passed, in seconds since the epoch; the end of the preflight phase.
  returned: success, and on a failed clone
  type: float
  sample: 1763889999.990
image:
  description:
    - The clone's result, the return values of M(gpuaas.fleet.slice_vm_image) (C(changed),
      C(skipped_reason), C(plan), C(digest), C(record), C(disk)) and C(finished_at), when it
      finished.
  returned: with O(clone), when every check passed
  type: dict
finished_at:
  description:
    - When the module finished, in seconds since the epoch (also on failure); the slice VM
      roles chain these into per-phase timings.
  returned: always
  type: float
  sample: 1763890000.123
started_at:
  description:
    - When the module's process started (interpreter start-up included), in seconds since
      the epoch (also on failure); the slice VM provision role times its first phase from it.
  returned: always
  type: float
  sample: 1763889999.871
checks:
  description: One result per check, in order.
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: Check name (allocation, kvm, bridge, numa, hugepages, libvirt, pci, disk, image).
      type: str
      returned: always
    status:
      description: PASS or FAIL (the result type shared with slice parity).
      type: str
      returned: always
    ok:
      description: Whether the precondition holds.
      type: bool
      returned: always
    code:
      description: Machine-readable failure code; empty when ok.
      type: str
      returned: always
    detail:
      description: Human-readable detail.
      type: str
      returned: always
    remediation:
      description: What to do about a failed check (empty when ok or when the detail says it).
      type: str
      returned: always
    digest:
      description:
        - The image check's digest verification (path, expected and actual sha256, seconds,
          the identity of the file that was hashed); M(gpuaas.fleet.slice_vm_image) takes it
          as O(gpuaas.fleet.slice_vm_image#module:verified).
      type: dict
      returned: on the image check, when the image was hashed
ok:
  description: Whether every check passed.
  returned: always
  type: bool
domain_name:
  description: The allocation's deterministic domain name.
  returned: always
  type: str
  sample: gpuaas-slice-158ea1470115407fbbd51850c32b9517
domain_state:
  description: The domain's current state (absent, running, shutoff, ...).
  returned: always
  type: str
host_cpuset:
  description: Host CPUs of the slots' NUMA nodes, empty without NUMA placement.
  returned: always
  type: str
failure:
  description: The first unmet precondition; null when every check passed.
  returned: always
  type: dict
  contains:
    phase:
      description: Always C(preflight).
      type: str
      returned: always
    code:
      description: Machine-readable failure code.
      type: str
      returned: always
    message:
      description: Why.
      type: str
      returned: always
    check:
      description: The check that failed first.
      type: str
      returned: always
failed_checks:
  description: Every check that failed, in order.
  returned: failure
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    common_args,
    vm_common,
    vm_domain,
    vm_libvirt,
    vm_preflight,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import (
    IMAGE_SPEC,
    PROFILE_SPEC,
    SLOT_SPEC,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            allocation_id=dict(type="str", required=True),
            slots=dict(type="list", elements="dict", required=True, options=SLOT_SPEC),
            mac_address=dict(type="str", required=True),
            bridge=dict(type="str", required=True),
            bridge_type=dict(type="str", default="linux", choices=["linux", "openvswitch"]),
            profile=dict(type="dict", required=True, options=PROFILE_SPEC),
            image=dict(type="dict", required=True, options=IMAGE_SPEC),
            emulation=dict(type="bool", default=False),
            pci_passthrough=dict(type="bool", default=True),
            kvm_device=dict(type="path", default="/dev/kvm"),
            stable_dirs=common_args.stable_dirs_spec(),
            libvirt_uri=common_args.libvirt_uri_spec(),
            clone=dict(
                type="dict",
                options=dict(
                    state_dir=dict(type="path", required=True),
                    timeout=dict(type="int", default=3600),
                ),
            ),
        ),
        supports_check_mode=True,
    )
    vm_common.fail_missing_libraries(
        module,
        missing_required_lib,
        **{"libvirt-python": vm_libvirt.LIBVIRT_IMPORT_ERROR, "lxml": vm_domain.LXML_IMPORT_ERROR},
    )
    vm_common.run_module(module, vm_preflight.run)


if __name__ == "__main__":
    main()
