#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_host_state
short_description: Report the slice VMs, DHCP reservations and leases a host really has
version_added: "0.1.0"
description:
  - Lists the libvirt domains named C(gpuaas-slice-<allocation id hex>) with their state,
    disks, MAC addresses and vNIC rates, and the node dnsmasq's reservations and leases.
  - Read-only evidence for reconciliation; the control plane compares it with its
    allocations and claims and records drift. Never changes anything.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.libvirt
options:
  dnsmasq_hostsfile:
    description: dnsmasq C(--dhcp-hostsfile) holding the slice reservations.
    type: path
    default: /var/lib/gpuaas/dnsmasq/slice-hosts
  dnsmasq_leasefile:
    description: dnsmasq C(--dhcp-leasefile).
    type: path
    default: /var/lib/misc/dnsmasq.leases
requirements:
  - libvirt-python
  - lxml
attributes:
  check_mode:
    description: Read-only; runs the same in check mode.
    support: full
  diff_mode:
    description: Nothing to diff.
    support: none
  platform:
    description: Linux slice hosts.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: What does this host run?
  gpuaas.fleet.slice_host_state:
    libvirt_uri: qemu:///system
  register: host_state
"""

RETURN = r"""
changed:
  description: Always false.
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
domains:
  description: Slice domains on the host.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Domain name.
      type: str
      returned: always
    allocation_id:
      description: The allocation the name encodes.
      type: str
      returned: always
    state:
      description: Domain state, for example C(running) or C(shutoff).
      type: str
      returned: always
    disks:
      description: Disk sources (block devices or files).
      type: list
      elements: str
      returned: always
    macs:
      description: MAC addresses of the domain's interfaces.
      type: list
      elements: str
      returned: always
    interfaces:
      description:
        - Each vNIC's MAC and the rates libvirt shapes it to (C(bandwidth) with C(inbound) and
          C(outbound), each C(average) and C(peak) in kilobytes per second and C(burst) in
          kilobytes; empty when unshaped), from the running definition.
      type: list
      elements: dict
      returned: always
reservations:
  description: dnsmasq host reservations (C(mac), C(ip), C(name)).
  returned: always
  type: list
  elements: dict
leases:
  description: dnsmasq leases (C(mac), C(ip), C(expiry)).
  returned: always
  type: list
  elements: dict
failure:
  description: Phase C(inventory), code and message of a failure.
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    common_args,
    vm_common,
    vm_inventory,
    vm_libvirt,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            libvirt_uri=common_args.libvirt_uri_spec(),
            dnsmasq_hostsfile=dict(type="path", default="/var/lib/gpuaas/dnsmasq/slice-hosts"),
            dnsmasq_leasefile=dict(type="path", default="/var/lib/misc/dnsmasq.leases"),
        ),
        supports_check_mode=True,
    )
    vm_common.fail_missing_libraries(
        module,
        missing_required_lib,
        **{
            "libvirt-python": vm_libvirt.LIBVIRT_IMPORT_ERROR,
            "lxml": vm_inventory.LXML_IMPORT_ERROR,
        },
    )
    vm_common.run_module(module, vm_inventory.run)


if __name__ == "__main__":
    main()
