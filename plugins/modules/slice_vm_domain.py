#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_vm_domain
short_description: Define, start, stop and undefine the libvirt domain of one slice allocation
version_added: "0.1.0"
description:
  - The domain is named C(gpuaas-slice-<allocation id hex>) and uses the allocation id as
    its UUID.
  - Its XML has UEFI with Secure Boot and enrolled keys off, no TPM, no graphics, VNC or
    USB (the serial console goes to O(console_log) only), a VFIO C(hostdev) for every GPU
    and fabric VF, every slot disk as a raw virtio block device (the first boots), the
    seed ISO as a CD-ROM, a bridge or Open vSwitch vNIC with the reserved MAC, vCPUs and
    memory from the profile, vCPUs and emulator pinned to the slots' NUMA nodes and
    memory bound to them, and hugepage backing when the profile asks for it.
  - O(state=running) defines (or redefines when our properties differ) and starts it;
    O(state=defined) only defines it; a running domain whose definition changed reports
    C(restart_required) and keeps running.
  - O(state=absent) shuts the domain down gracefully (ACPI) for up to
    O(shutdown_timeout) seconds, hard-stops it if it is still running, and undefines it
    together with its UEFI NVRAM (a plain undefine fails on UEFI domains), retrying up to
    O(undefine_attempts) times. A domain that is already gone is not a change.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.libvirt
options:
  allocation_id:
    description: Allocation UUID.
    type: str
    required: true
  state:
    description: Desired domain state.
    type: str
    default: running
    choices: [running, defined, absent]
  slots:
    description: The allocation's slots; required unless O(state=absent).
    type: list
    elements: dict
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
        description: Raw disk by stable identity.
        type: str
        required: true
      numa_node:
        description: NUMA node of the slot's devices.
        type: int
  profile:
    description: Runtime profile; required unless O(state=absent).
    type: dict
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
  mac_address:
    description: Reserved management MAC; required unless O(state=absent).
    type: str
  bridge:
    description: Bridge of the vNIC; required unless O(state=absent).
    type: str
  bridge_type:
    description: Linux bridge or Open vSwitch (adds C(<virtualport type='openvswitch'/>)).
    type: str
    default: linux
    choices: [linux, openvswitch]
  seed_iso:
    description: NoCloud seed ISO attached as a read-only SATA CD-ROM.
    type: path
  console_log:
    description: File receiving the serial console.
    type: path
  emulation:
    description: Domain type C(qemu) (TCG emulation) instead of C(kvm); for test hosts.
    type: bool
    default: false
  pci_passthrough:
    description: Attach the GPUs and fabric VFs as VFIO hostdevs; false only on test hosts.
    type: bool
    default: true
  shutdown_timeout:
    description: Seconds to wait for a graceful shutdown before the hard stop.
    type: int
    default: 120
  undefine_attempts:
    description: Undefine attempts (with NVRAM) before giving up.
    type: int
    default: 3
  undefine_retry_delay:
    description: Seconds between undefine attempts.
    type: float
    default: 2.0
attributes:
  check_mode:
    description: Reports the actions it would take.
    support: full
  diff_mode:
    description: State and the compared domain properties before and after.
    support: full
  platform:
    description: Linux hosts with libvirt.
    support: full
    platforms: posix
requirements:
  - libvirt-python
  - lxml
"""

EXAMPLES = r"""
- name: Start the slice VM
  gpuaas.fleet.slice_vm_domain:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    slots: "{{ slots }}"
    profile: {vcpus: 24, memory_mib: 65536, hugepages: true}
    mac_address: "52:54:00:3f:a2:10"
    bridge: ovsbr0
    bridge_type: openvswitch
    seed_iso: /var/lib/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517/seed.iso
    console_log: /var/log/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517.log

- name: Release it
  gpuaas.fleet.slice_vm_domain:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    state: absent
    shutdown_timeout: 60
"""

RETURN = r"""
changed:
  description: Whether the domain was (or would be) defined, started, stopped or undefined.
  returned: always
  type: bool
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
name:
  description: Domain name.
  returned: always
  type: str
  sample: gpuaas-slice-158ea1470115407fbbd51850c32b9517
uuid:
  description: Domain UUID (the allocation id).
  returned: unless O(state=absent)
  type: str
state:
  description: Domain state after the run (running, shutoff, absent, ...).
  returned: always
  type: str
actions:
  description: What was (or would be) done, for example C([define, start]) or C([stop, undefine]).
  returned: always
  type: list
  elements: str
restart_required:
  description: The running domain's definition changed; it applies on the next boot.
  returned: unless O(state=absent)
  type: bool
xml:
  description: The desired domain XML.
  returned: unless O(state=absent)
  type: str
stop:
  description: How the domain stopped (C(graceful) or C(forced)), why it was forced, seconds.
  returned: when O(state=absent)
  type: dict
undefine_attempts:
  description: Each undefine attempt with its error.
  returned: when O(state=absent)
  type: list
  elements: dict
failure:
  description: Phase, code and message of a failure (for example C(undefine_failed)).
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    common_args,
    vm_common,
    vm_domain,
    vm_libvirt,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import PROFILE_SPEC, SLOT_SPEC


def main():
    module = AnsibleModule(
        argument_spec=dict(
            allocation_id=dict(type="str", required=True),
            state=dict(type="str", default="running", choices=["running", "defined", "absent"]),
            slots=dict(type="list", elements="dict", options=SLOT_SPEC),
            profile=dict(type="dict", options=PROFILE_SPEC),
            mac_address=dict(type="str"),
            bridge=dict(type="str"),
            bridge_type=dict(type="str", default="linux", choices=["linux", "openvswitch"]),
            seed_iso=dict(type="path"),
            console_log=dict(type="path"),
            emulation=dict(type="bool", default=False),
            pci_passthrough=dict(type="bool", default=True),
            shutdown_timeout=dict(type="int", default=120),
            undefine_attempts=dict(type="int", default=3),
            undefine_retry_delay=dict(type="float", default=2.0),
            libvirt_uri=common_args.libvirt_uri_spec(),
        ),
        required_if=[
            ("state", "running", ("slots", "profile", "mac_address", "bridge")),
            ("state", "defined", ("slots", "profile", "mac_address", "bridge")),
        ],
        supports_check_mode=True,
    )
    vm_common.fail_missing_libraries(
        module,
        missing_required_lib,
        **{"libvirt-python": vm_libvirt.LIBVIRT_IMPORT_ERROR, "lxml": vm_domain.LXML_IMPORT_ERROR},
    )
    vm_common.run_module(module, vm_domain.run)


if __name__ == "__main__":
    main()
