#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: sriov_vfs
short_description: Give each fabric PF the number of SR-IOV virtual functions the profile asks
version_added: "0.1.0"
description:
  - Sets C(sriov_numvfs) of each physical function in O(pfs), named by PCI address or by a
    stable match (vendor and device id, optionally the PCI Device Serial Number and the
    function number), never by kernel interface name. Every PF a match finds gets the
    entry's count.
  - When the count differs, 0 is written first (the kernel refuses one non-zero count
    straight after another), then the new count, and the PF is read back.
  - Fails before writing anything when a PF is absent, matches nothing, is a VF, is not
    SR-IOV capable (no C(sriov_totalvfs)), is asked for more than its C(sriov_totalvfs), has
    no driver to configure its VFs, is asked for two different counts, or (live host) has a
    VF a process holds through VFIO (a running slice VM).
  - The count does not survive a reboot by itself; the C(gpuaas.fleet.slice_host_bootstrap)
    role installs C(gpuaas-sriov-vfs.service), which runs the same code at boot.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  pfs:
    description: The PFs and their VF counts.
    type: list
    elements: dict
    required: true
    suboptions:
      pci_address:
        description: The PF's PCI address (mutually exclusive with a match).
        type: str
      vendor_id:
        description: PCI vendor id of the PFs to match, like C(0x15b3).
        type: str
      device_id:
        description: PCI device id of the PFs to match, like C(0xa2dc).
        type: str
      serial:
        description: PCI Device Serial Number (as lspci prints it) the matched PFs must carry.
        type: str
      function:
        description: PCI function number (0-7) the matched PFs must have.
        type: int
      numvfs:
        description: Number of VFs the PF must have (0 removes them).
        type: int
        required: true
  root:
    description: Filesystem root for sysfs reads and writes (a recorded host tree in tests).
    type: path
    default: /
attributes:
  check_mode:
    description: Plans and reports the writes without making them.
    support: full
  diff_mode:
    description: Each PF's sriov_numvfs before and after.
    support: full
  platform:
    description: Linux hosts.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Eight VFs on each port of the BlueField-3 with this serial number
  gpuaas.fleet.sriov_vfs:
    pfs:
      - vendor_id: "0x15b3"
        device_id: "0xa2dc"
        serial: b8-3f-d2-03-00-a1-b2-c3
        numvfs: 8

- name: Four VFs on one PF by address
  gpuaas.fleet.sriov_vfs:
    pfs:
      - pci_address: "0000:1a:00.0"
        numvfs: 4
"""

RETURN = r"""
pfs:
  description: >-
    Each PF as planned and left (pci_address, vendor_id, device_id, driver, sriov_totalvfs,
    numvfs_before, numvfs_wanted, numvfs_after, vfs_before, vfs (the VF addresses after; in
    check mode, empty when the count would change), matched_by).
  returned: always
  type: list
  elements: dict
writes:
  description: The sysfs writes made (or, in check mode, that would be), in order (path, value).
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import sriov_vfs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            pfs=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    pci_address=dict(type="str"),
                    vendor_id=dict(type="str"),
                    device_id=dict(type="str"),
                    serial=dict(type="str"),
                    function=dict(type="int"),
                    numvfs=dict(type="int", required=True),
                ),
            ),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    try:
        result = sriov_vfs.run(module.params, check_mode=module.check_mode)
    except sriov_vfs.SriovError as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
