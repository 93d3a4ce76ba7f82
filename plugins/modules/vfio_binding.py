#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: vfio_binding
short_description: Persistent vfio-pci binding for the approved slice GPUs and fabric VFs
version_added: "0.1.0"
description:
  - Writes C(/etc/modules-load.d/gpuaas-vfio.conf) so the VFIO modules load at boot and,
    optionally, loads the missing ones now.
  - With O(manage_overrides=true), binds EXACTLY the approved PCI addresses in O(devices)
    (from the approved topology, never a fixed list) to vfio-pci persistently. Method
    V(driverctl) writes one C(/etc/driverctl.d/pci-<address>) override per device and
    removes vfio-pci overrides of addresses no longer approved; method V(modprobe_ids)
    writes C(options vfio-pci ids=...) and is refused when an unapproved device shares a
    vendor:device pair. Both add C(softdep) lines so vfio-pci loads before nvidia,
    nouveau or mlx5_core claim the devices.
  - Only NVIDIA GPUs and Mellanox fabric functions can be approved in O(devices); unknown
    addresses or other devices fail the module before anything is written. NVMe controllers
    passed through whole to a slice VM are listed on their own in O(nvme_controllers).
  - On the live host, a device behind which the host uses a block device (the root file
    system, a mount, swap, md/dm, an open handle) is refused whatever its kind, naming the
    use.
  - Devices not yet bound to vfio-pci make RV(reboot_required) true unless O(bind_now)
    rebinds them through sysfs (quiesce the host GPU services first).
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  devices:
    description: Approved PCI addresses (slot GPUs and fabric VFs).
    type: list
    elements: str
    default: []
  nvme_controllers:
    description:
      - Approved NVMe controllers (PCI class 0x010802) passed through whole to slice VMs.
        Kept apart from O(devices) so a typo there never binds a disk controller.
    type: list
    elements: str
    default: []
  manage_overrides:
    description:
      - Converge the persistent overrides to O(devices). When false, only the module
        loading configuration is managed and existing overrides are left alone.
    type: bool
    default: true
  method:
    description: How the binding is made persistent.
    type: str
    default: driverctl
    choices: [driverctl, modprobe_ids]
  modules:
    description: VFIO modules to load at boot.
    type: list
    elements: str
    default: [vfio, vfio_iommu_type1, vfio_pci]
  load_modules:
    description: Load missing modules now with C(modprobe) (live root only; failures are reported).
    type: bool
    default: true
  bind_now:
    description:
      - Rebind approved devices to vfio-pci now through sysfs, and hand devices whose
        override is removed back to the driver the kernel picks for them.
    type: bool
    default: false
  root:
    description: Filesystem root for sysfs reads and file writes (a recorded host tree in tests).
    type: path
    default: /
attributes:
  check_mode:
    description: Reports the file changes without writing, loading or binding.
    support: full
  diff_mode:
    description: Every managed file before and after.
    support: full
  platform:
    description: Linux hosts.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Bind the approved slot devices to vfio-pci at boot
  gpuaas.fleet.vfio_binding:
    devices: "{{ approved_slots | map(attribute='gpu_pci_address') | list
                 + approved_slots | map(attribute='fabric_vf_pci_address') | list }}"
  register: vfio

- name: Only make sure the VFIO modules load at boot
  gpuaas.fleet.vfio_binding:
    manage_overrides: false
"""

RETURN = r"""
method:
  description: The persistence method used.
  returned: always
  type: str
devices:
  description: >-
    The approved devices as inspected (pci_address, kind gpu, fabric or nvme, vendor_id,
    device_id, iommu_group, driver, group_peers_not_approved).
  returned: always
  type: list
  elements: dict
files_changed:
  description: Managed files written or removed (or that would be).
  returned: always
  type: list
  elements: str
stale_overrides:
  description: Addresses whose vfio-pci override was removed because they are no longer approved.
  returned: always
  type: list
  elements: str
modules_missing:
  description: VFIO modules still not loaded.
  returned: always
  type: list
  elements: str
modules_loaded:
  description: Modules loaded by this run.
  returned: always
  type: list
  elements: str
module_errors:
  description: modprobe errors per module.
  returned: always
  type: dict
rebind_required:
  description: Approved devices not on vfio-pci yet.
  returned: always
  type: list
  elements: str
bound_now:
  description: Devices rebound to vfio-pci by this run.
  returned: always
  type: list
  elements: str
released_now:
  description: Devices whose override was removed, released from vfio-pci by this run.
  returned: always
  type: list
  elements: str
reboot_required:
  description: Whether a reboot is needed for the binding to take effect.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile, vfio_binding
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            devices=dict(type="list", elements="str", default=[]),
            nvme_controllers=dict(type="list", elements="str", default=[]),
            manage_overrides=dict(type="bool", default=True),
            method=dict(type="str", default="driverctl", choices=list(vfio_binding.METHODS)),
            modules=dict(type="list", elements="str", default=list(vfio_binding.DEFAULT_MODULES)),
            load_modules=dict(type="bool", default=True),
            bind_now=dict(type="bool", default=False),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )

    runner = module_runner(module)
    try:
        result = vfio_binding.run(module.params, module.check_mode, runner)
    except (vfio_binding.VfioBindingError, hostfile.HostFileError) as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
