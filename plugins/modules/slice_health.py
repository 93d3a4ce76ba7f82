#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_health
short_description: Report the health of a slice node's passthrough devices and of the node
version_added: "0.1.0"
description:
  - For every passthrough device of every slot in O(slots) (its GPU, its fabric VF, its
    NVMe disk, each once) - the PCI function is on the bus, bound to O(expected_driver)
    (GPUs and VFs), in an IOMMU group; its PCIe link runs at its maximum width, and at its
    maximum speed except for a GPU (a GPU lowers its link speed when idle); its AER
    counters (C(aer_dev_fatal), C(aer_dev_nonfatal), C(aer_dev_correctable)) show no
    fatal or non-fatal error and no more correctable ones than O(aer_correctable_threshold).
  - An NVMe disk is named by its stable path; its SMART log (C(nvme smart-log -o json))
    must show no critical warning and no more media errors than
    O(nvme_media_errors_threshold).
  - For the node - a fatal AER error on the root port above a checked device, EDAC memory
    controllers (C(ue_count) any, C(ce_count) above O(edac_correctable_threshold)), free
    hugepages below O(hugepages_1g_needed) or O(hugepages_2m_needed), and where the NVIDIA
    tools are installed, C(nvidia-smi -q -x) (volatile uncorrectable ECC errors, retired
    pages and remapped rows pending, a failed row remap) and C(dcgmi health -c -j) (DCGM's
    health per GPU, its XID errors). GPUs on vfio-pci do not answer these tools.
  - Each finding has a severity (C(critical) or C(warning)), a scope (C(device) or
    C(node)) and the slots it affects; RV(health.passed) is false when any is critical.
  - Read-only; never fails the host for a finding (the control plane judges the report).
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  root:
    description:
      - Filesystem root under which C(/sys) and C(/dev) are read (a recorded host tree in
        tests).
    type: path
    default: /
  node:
    description: The node's name in the report (default the host name under O(root)).
    type: str
  slots:
    description:
      - The node's slots as the control plane knows them (the C(gpuaas_slots) host variable
        of the control-plane inventory).
    type: list
    elements: dict
    default: []
    suboptions:
      slot_index:
        description: The slot's index on the node.
        type: int
        required: true
      gpu_pci_address:
        description: The slot's GPU.
        type: str
      nvme_device:
        description: The slot's NVMe disk by stable path (C(/dev/disk/by-id/...)).
        type: str
      fabric_vf_pci_address:
        description: The slot's fabric VF.
        type: str
  expected_driver:
    description: The driver the GPUs and VFs must be bound to.
    type: str
    default: vfio-pci
  aer_correctable_threshold:
    description: More correctable AER errors than this on a device is a warning.
    type: int
    default: 100
  nvme_media_errors_threshold:
    description: More media errors than this on an NVMe disk is a warning.
    type: int
    default: 0
  edac_correctable_threshold:
    description: More corrected memory errors than this on the node is a warning.
    type: int
    default: 100
  hugepages_1g_needed:
    description: Free 1 GiB hugepages the node's SKUs need (0 checks nothing).
    type: int
    default: 0
  hugepages_2m_needed:
    description: Free 2 MiB hugepages the node's SKUs need (0 checks nothing).
    type: int
    default: 0
  nvidia_tools:
    description: Read C(nvidia-smi -q -x) and C(dcgmi health -c -j) when they are installed.
    type: bool
    default: true
attributes:
  check_mode:
    description: Read-only; runs the same checks in check mode.
    support: full
  diff_mode:
    description: Read-only; there is nothing to diff.
    support: none
  platform:
    description: Linux hosts (sysfs, nvme-cli).
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Check the health of the node's slots (control-plane inventory)
  gpuaas.fleet.slice_health:
    slots: "{{ gpuaas_slots | default([]) }}"
    hugepages_1g_needed: 128
  register: health

- name: Show the findings
  ansible.builtin.debug:
    msg: "{{ health.health.findings }}"
"""

RETURN = r"""
changed:
  description: Always false.
  returned: always
  type: bool
health:
  description: The node's health report (schema C(gpuaas.health/v1)).
  returned: success
  type: dict
  contains:
    schema:
      description: C(gpuaas.health/v1).
      type: str
      returned: always
    node:
      description: The node.
      type: str
      returned: always
    collected_at:
      description: When the report was made (ISO 8601, UTC).
      type: str
      returned: always
    devices_checked:
      description: Passthrough devices checked (each once, however many slots share it).
      type: int
      returned: always
    passed:
      description: True when no finding is critical.
      type: bool
      returned: always
    findings:
      description: What is wrong, one entry per problem.
      type: list
      elements: dict
      returned: always
      contains:
        code:
          description:
            - What was found, for example C(device_missing), C(driver_mismatch),
              C(iommu_group_missing), C(pcie_link_width_degraded),
              C(pcie_link_speed_degraded), C(aer_fatal), C(aer_nonfatal),
              C(aer_correctable), C(root_port_aer_fatal), C(nvme_critical_warning),
              C(nvme_media_errors), C(nvme_smart_log_unreadable), C(edac_uncorrectable),
              C(edac_correctable), C(hugepages_short), C(gpu_ecc_uncorrectable),
              C(gpu_xid), C(gpu_dcgm_health), C(tool_missing).
          type: str
          returned: always
        severity:
          description: C(critical) or C(warning).
          type: str
          returned: always
        scope:
          description: C(device) (it affects RV(health.findings.slots)) or C(node).
          type: str
          returned: always
        device:
          description: The PCI address or NVMe stable path; null for a node finding without one.
          type: str
          returned: always
        slots:
          description: Slot indexes the finding affects (empty for node scope).
          type: list
          elements: int
          returned: always
        detail:
          description: What was observed, in words.
          type: str
          returned: always
        observed:
          description: The observed value.
          type: raw
          returned: always
        expected:
          description: The value expected.
          type: raw
          returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import health, sysfs
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner

SLOT_OPTIONS = dict(
    slot_index=dict(type="int", required=True),
    gpu_pci_address=dict(type="str"),
    nvme_device=dict(type="str"),
    fabric_vf_pci_address=dict(type="str"),
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            node=dict(type="str"),
            slots=dict(type="list", elements="dict", default=[], options=SLOT_OPTIONS),
            expected_driver=dict(type="str", default=sysfs.VFIO_DRIVER),
            aer_correctable_threshold=dict(type="int", default=100),
            nvme_media_errors_threshold=dict(type="int", default=0),
            edac_correctable_threshold=dict(type="int", default=100),
            hugepages_1g_needed=dict(type="int", default=0),
            hugepages_2m_needed=dict(type="int", default=0),
            nvidia_tools=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    host = sysfs.HostRoot(params["root"])
    context = health.HealthContext(
        host=host,
        node=params["node"] or host.read("/etc/hostname") or host.read("/proc/sys/kernel/hostname"),
        slots=params["slots"],
        expected_driver=params["expected_driver"],
        thresholds=health.Thresholds(
            aer_correctable=params["aer_correctable_threshold"],
            nvme_media_errors=params["nvme_media_errors_threshold"],
            edac_correctable=params["edac_correctable_threshold"],
        ),
        hugepages_needed={"1g": params["hugepages_1g_needed"], "2m": params["hugepages_2m_needed"]},
        nvidia_tools=params["nvidia_tools"],
        runner=health.tool_runner(module_runner(module), module.get_bin_path),
    )
    try:
        report = health.probe(context)
    except health.HealthError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, health=report)


if __name__ == "__main__":
    main()
