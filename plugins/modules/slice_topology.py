#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_topology
short_description: Discover a GPU host's slice topology as a gpuaas.topology/v1 map
version_added: "0.1.0"
description:
  - Reads GPUs (PCI vendor 0x10de), fabric devices (C(/sys/class/infiniband), PF/VF
    relations), NVMe disks by stable C(/dev/disk/by-id) identity with child partitions,
    mounts and filesystem signatures, and host virtualization state (KVM, IOMMU, VFIO,
    hugepages, pending reboot) under O(root).
  - Pairs each GPU with a raw NVMe disk and a fabric VF by NUMA locality,
    deterministically, and suggests a MAC (locally administered unicast, 46 bits of
    sha256 of C(<node>:<slot_index>)) and a private IP (.10 + slot index of
    O(slice_subnet)) per slot. The control plane keeps the MAC it first stored for a slot.
  - Collects slice network evidence (bridge, IPv4 forwarding, NAT MASQUERADE rule, default
    route uplink, tmfifo) from the live network namespace the module runs in.
  - Reports blockers with machine-readable codes. Candidate slots are advisory; the control
    plane approves them.
  - Read-only. Never changes anything, so check mode is always safe.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  root:
    description:
      - Filesystem root under which C(/sys), C(/proc), C(/dev/disk/by-id) and
        C(/run/udev/data) are read. A recorded host tree for tests and demos.
      - Paths in the result are always as the host sees them, without this prefix.
    type: path
    default: /
  node:
    description:
      - Node identity used for the deterministic per-slot MAC addresses.
      - Defaults to C(/etc/hostname) under O(root).
    type: str
  slice_subnet:
    description: Node-local slice subnet; slot I(i) gets host address .10+I(i).
    type: str
    default: 10.100.0.0/24
  bridge:
    description: Bridge the slice VMs attach to; it must own the subnet's first address.
    type: str
    default: ovsbr0
  network_mode:
    description:
      - Slice network mode. In V(private-nat) a missing NAT rule or disabled IPv4
        forwarding is a hard blocker.
    type: str
    default: private-nat
    choices: [private-nat, private-routed, public-nat, tailscale-overlay]
  tmfifo_interface:
    description: BF3 RShim management interface whose IPv4 address is evidence only.
    type: str
    default: tmfifo_net0
  collect_network:
    description:
      - Collect live network evidence with C(ip), C(iptables-save) and
        C(/proc/sys/net/ipv4/ip_forward).
      - When false, the map carries a hard C(network_evidence_missing) blocker.
    type: bool
    default: true
  fabric_link_layer:
    description: Link layer of the RDMA devices that form the workload fabric.
    type: str
    default: InfiniBand
    choices: [InfiniBand, Ethernet]
attributes:
  check_mode:
    description: Runs in check mode and returns the same map.
    support: full
  diff_mode:
    description: Read-only; there is nothing to diff.
    support: none
  platform:
    description: Linux hosts (sysfs, procfs, iproute2, iptables).
    support: full
    platforms: posix
notes:
  - Blocker codes include C(nat_missing), C(ip_forward_disabled), C(bridge_missing),
    C(bridge_down), C(bridge_address_missing), C(mounted_child_partition), C(disk_mounted),
    C(os_disk), C(filesystem_signature), C(no_vf_for_slot), C(duplicate_fabric_device),
    C(kvm_missing), C(iommu_disabled), C(vfio_modules_missing),
    C(no_stable_disk_identity), C(network_evidence_missing), C(tmfifo_missing).
"""

EXAMPLES = r"""
- name: Discover this host's slice topology
  gpuaas.fleet.slice_topology:
    node: "{{ inventory_hostname }}"
  register: discovery

- name: Discover a recorded host tree without network evidence
  gpuaas.fleet.slice_topology:
    root: /srv/hosttrees/j22u15
    node: j22u15
    collect_network: false
  register: recorded
"""

RETURN = r"""
topology:
  description: The gpuaas.topology/v1 candidate map.
  returned: always
  type: dict
  contains:
    schema:
      description: Always C(gpuaas.topology/v1).
      type: str
      returned: always
    node:
      description: Node identity used for the MAC addresses.
      type: str
      returned: always
    collected_at:
      description: UTC time of collection, ISO 8601 with a Z suffix.
      type: str
      returned: always
    host:
      description: KVM, IOMMU groups, IOMMU kernel argument, VFIO modules, 1 GiB
        hugepages free and in total (the pool placement weighs a hugepage SKU against)
        and whether a reboot is pending.
      type: dict
      returned: always
    gpus:
      description: NVIDIA GPUs with PCI address, IDs, NUMA node, IOMMU group and driver.
      type: list
      elements: dict
      returned: always
    fabric_devices:
      description:
        - RDMA PCI functions and their VFs (kind, physfn, ib_device, link layer, driver).
        - Kind C(pf) (SR-IOV capable physical function), C(vf), or C(hca) (a whole
          InfiniBand adapter without SR-IOV, such as a ConnectX HCA; inventoried, never a
          slot's fabric VF or a whole-device fallback).
      type: list
      elements: dict
      returned: always
    nvme_devices:
      description: NVMe disks by stable path with kernel name (advisory), size, NUMA node,
        OS disk flag, mount state, signatures and partitions.
      type: list
      elements: dict
      returned: always
    slice_network:
      description:
        - Live bridge evidence (C(bridge_present) only for a Linux or Open vSwitch bridge,
          its kind and up state), forwarding, NAT, uplink and tmfifo evidence.
      type: dict
      returned: always
    candidate_slots:
      description: One advisory slot per GPU with its disk, fabric VF, MAC, private IP,
        complete flag, missing bindings and the codes of its blockers.
      type: list
      elements: dict
      returned: always
    blockers:
      description: Blockers with code, severity (hard or advisory), detail and, when they
        concern one slot or device, slot_index and device.
      type: list
      elements: dict
      returned: always
    summary:
      description: Counts of GPUs, fabric devices, disks, slots and hard blockers.
      type: dict
      returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import common_args
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner
from ansible_collections.gpuaas.fleet.plugins.module_utils.topology import (
    TopologyError,
    discover,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            slice_subnet=dict(type="str", default="10.100.0.0/24"),
            bridge=dict(type="str", default="ovsbr0"),
            tmfifo_interface=dict(type="str", default="tmfifo_net0"),
            **common_args.topology_discovery_spec(),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        topology = discover(
            root=params["root"],
            node=params["node"],
            slice_subnet=params["slice_subnet"],
            bridge=params["bridge"],
            network_mode=params["network_mode"],
            tmfifo_interface=params["tmfifo_interface"],
            collect_network=params["collect_network"],
            fabric_link_layer=params["fabric_link_layer"],
            runner=module_runner(module),
        )
    except TopologyError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=False, topology=topology)


if __name__ == "__main__":
    main()
