#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_network_baseline
short_description: Converge a GPU slice node's bridge, gateway, NAT, forwarding and isolation
version_added: "0.1.0"
description:
  - Observes the live network state in the host's network namespace, plans the changes,
    then applies them (check mode stops after planning).
  - The bridge is an Open vSwitch bridge (O(ovs_datapath_type=netdev) is the userspace
    datapath) or a Linux bridge. An existing link of the other kind is refused, never
    deleted. The bridge is brought up with the first address of O(subnet).
  - Adds C(-s SUBNET ! -d SUBNET -j MASQUERADE) to nat POSTROUTING (tagged with a comment;
    our rules for another subnet are removed) and enables IPv4 forwarding.
  - Contains the guests, deny by default (docs/security.md). Chain C(GPUAAS-SLICE-FWD),
    jumped to first from FORWARD, drops traffic routed from the bridge back into it,
    accepts replies, drops traffic from the bridge to O(infra_networks), accepts the
    subnet's other egress (NAT to the internet) and drops anything else from the bridge.
    Chain C(GPUAAS-SLICE-IN), jumped to first from INPUT, lets the node accept from the
    bridge only replies, DHCP (udp 67), DNS (udp and tcp 53) and ping to the gateway
    address. IPv6 is disabled on the bridge. Both chains are planned and diffed exactly;
    a jump that is not first is moved first.
  - With O(isolate_slices), guests cannot reach each other at layer 2 either. On Open
    vSwitch the bridge MAC is pinned (C(other-config:hwaddr)) and OpenFlow rules let guest
    ports send unicast only to it. On a Linux bridge, ebtables chain C(GPUAAS-SLICE) drops
    bridged frames from and to O(slot_macs).
  - Assigns O(tmfifo_address) to O(tmfifo_interface) when that BF3 RShim interface exists.
  - The same code runs at boot as C(gpuaas-slice-network-baseline) from the
    M(gpuaas.fleet.slice_network_baseline) role's service.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  bridge:
    description: Bridge name.
    type: str
    default: ovsbr0
  bridge_type:
    description: Open vSwitch or Linux bridge.
    type: str
    default: openvswitch
    choices: [openvswitch, linux]
  ovs_datapath_type:
    description: Open vSwitch datapath; V(netdev) where the kernel datapath is unavailable.
    type: str
    default: system
    choices: [system, netdev]
  subnet:
    description: The node's slice subnet; the bridge gets its first host address.
    type: str
    default: 10.100.0.0/24
  nat:
    description: Masquerade the subnet's traffic leaving the node.
    type: bool
    default: true
  ip_forward:
    description: Enable IPv4 forwarding.
    type: bool
    default: true
  isolate_slices:
    description: Deny traffic between slices (layer 2 and routed through the gateway).
    type: bool
    default: true
  slot_macs:
    description: Approved slot MACs (used for layer-2 isolation on a Linux bridge).
    type: list
    elements: str
    default: []
  infra_networks:
    description:
      - The operator's infrastructure ranges guests must not reach (management,
        out-of-band/BMC, storage, control plane, fabric), as IPv4 networks.
      - Refused, with nothing changed, when an entry is not an IPv4 network (host bits set
        included), when the list is empty, or when the ranges together cover every
        destination (no NAT egress left).
      - The node's own addresses are never reachable from the bridge, whatever the ranges.
    type: list
    elements: str
    default: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16, 100.64.0.0/10]
  dns_servers:
    description:
      - Resolvers handed to guests instead of the gateway; refused when one is inside
        O(infra_networks) (the guests' DNS would be dropped).
    type: list
    elements: str
    default: []
  tmfifo_interface:
    description: BF3 RShim management interface.
    type: str
    default: tmfifo_net0
  tmfifo_address:
    description: Address for O(tmfifo_interface) when it exists; empty leaves it alone.
    type: str
    default: 192.168.100.1/30
attributes:
  check_mode:
    description: Reports the planned actions without running them.
    support: full
  diff_mode:
    description: The observed network state before and after.
    support: full
  platform:
    description: Linux hosts with iproute2 and iptables (Open vSwitch or ebtables as chosen).
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Converge the slice network on the OVS bridge
  gpuaas.fleet.slice_network_baseline:
    bridge: ovsbr0
    subnet: 10.100.0.0/24

- name: Linux bridge with per-slot layer-2 isolation
  gpuaas.fleet.slice_network_baseline:
    bridge: slicebr0
    bridge_type: linux
    slot_macs: ["52:54:00:3f:a2:10", "52:54:00:9c:01:7e"]

- name: Infrastructure ranges of a site whose management network is public address space
  gpuaas.fleet.slice_network_baseline:
    infra_networks: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16,
                     100.64.0.0/10, 198.51.100.0/24]
"""

RETURN = r"""
actions:
  description: Actions run (or planned in check mode), each with a description and the command.
  returned: always
  type: list
  elements: dict
bridge:
  description: The bridge name.
  returned: always
  type: str
bridge_type:
  description: V(openvswitch) or V(linux).
  returned: always
  type: str
gateway:
  description: The address the bridge owns.
  returned: always
  type: str
  sample: 10.100.0.1/24
gateway_ip:
  description: The gateway address without prefix length.
  returned: always
  type: str
  sample: 10.100.0.1
subnet:
  description: The slice subnet.
  returned: always
  type: str
network_address:
  description: The subnet's network address.
  returned: always
  type: str
  sample: 10.100.0.0
netmask:
  description: The subnet's netmask.
  returned: always
  type: str
  sample: 255.255.255.0
tmfifo:
  description: V(present), V(absent) (no such interface here) or V(not managed).
  returned: always
  type: str
state:
  description: The observed network state after the run.
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import netstate, network_baseline
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            bridge=dict(type="str", default="ovsbr0"),
            bridge_type=dict(
                type="str", default="openvswitch", choices=list(network_baseline.BRIDGE_TYPES)
            ),
            ovs_datapath_type=dict(
                type="str", default="system", choices=list(network_baseline.DATAPATH_TYPES)
            ),
            subnet=dict(type="str", default="10.100.0.0/24"),
            nat=dict(type="bool", default=True),
            ip_forward=dict(type="bool", default=True),
            isolate_slices=dict(type="bool", default=True),
            slot_macs=dict(type="list", elements="str", default=[]),
            infra_networks=dict(
                type="list",
                elements="str",
                default=list(netstate.DEFAULT_INFRA_NETWORKS),
            ),
            dns_servers=dict(type="list", elements="str", default=[]),
            tmfifo_interface=dict(type="str", default="tmfifo_net0"),
            tmfifo_address=dict(type="str", default="192.168.100.1/30"),
        ),
        supports_check_mode=True,
    )

    runner = module_runner(module)
    try:
        config = network_baseline.load_config(module.params)
        result = network_baseline.converge(config, module.check_mode, runner)
    except network_baseline.BaselineError as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    if result["state"].get("ovs_unreachable"):
        module.warn(
            "Open vSwitch is not reachable (" + result["state"]["ovs_unreachable"] + "); the "
            "plan assumes the bridge does not exist yet"
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
