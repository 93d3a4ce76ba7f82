#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_dhcp_reservation
short_description: Reserve (or remove) a slice VM's MAC to IP mapping in the node's dnsmasq
version_added: "0.1.0"
description:
  - Keeps one C(MAC,IP,name) line in dnsmasq's C(--dhcp-hostsfile) and sends dnsmasq
    C(SIGHUP) (read from its pidfile) so it reloads the file.
  - The control plane owns MAC/IP intent, so a line giving this IP or host name to another
    MAC, or this MAC another IP, is stale (left by an earlier attempt) and is replaced;
    removed lines are returned.
  - Stale leases are ended with a DHCPRELEASE sent to dnsmasq through O(interface) (a
    running dnsmasq keeps leases in memory and rewrites its leasefile). With
    O(state=present) these are leases that bind this IP to another MAC or this MAC to
    another IP, with O(state=absent) every lease of this MAC or IP. When dnsmasq is not running, the
    leasefile is rewritten instead.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  mac_address:
    description: The VM's reserved MAC.
    type: str
    required: true
  ip_address:
    description: The reserved private IPv4 address.
    type: str
    required: true
  hostname:
    description: Host name dnsmasq hands out with the lease.
    type: str
    default: ""
  state:
    description: Whether the reservation should exist.
    type: str
    default: present
    choices: [present, absent]
  hostsfile:
    description: dnsmasq C(--dhcp-hostsfile).
    type: path
    required: true
  leasefile:
    description: dnsmasq C(--dhcp-leasefile).
    type: path
    required: true
  pidfile:
    description: dnsmasq C(--pid-file).
    type: path
    required: true
  interface:
    description: Interface dnsmasq serves the slice subnet on (the bridge), for DHCPRELEASE.
    type: str
  release_timeout:
    description: Seconds to wait for dnsmasq to drop a released lease.
    type: float
    default: 5.0
attributes:
  check_mode:
    description: Reports the hostsfile change and the stale leases; changes nothing.
    support: full
  diff_mode:
    description: The hostsfile before and after.
    support: full
  platform:
    description: Linux hosts running dnsmasq.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Reserve the slot's address
  gpuaas.fleet.slice_dhcp_reservation:
    mac_address: "52:54:00:3f:a2:10"
    ip_address: 10.100.0.10
    hostname: gpuaas-slice-158ea1470115407fbbd51850c32b9517
    hostsfile: /etc/gpuaas/dnsmasq/slice-hosts
    leasefile: /var/lib/misc/dnsmasq.leases
    pidfile: /run/dnsmasq/dnsmasq.pid
    interface: ovsbr0
"""

RETURN = r"""
changed:
  description: Whether the hostsfile or the leases changed (or would).
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
reservation:
  description: The reservation (mac, ip, name).
  returned: always
  type: dict
added:
  description: Hostsfile lines added.
  returned: always
  type: list
  elements: str
removed_stale_reservations:
  description: Hostsfile lines removed because they clash with this reservation.
  returned: always
  type: list
  elements: str
stale_leases:
  description: Leases found stale (expiry, mac, ip, hostname, client_id).
  returned: always
  type: list
  elements: dict
released_leases:
  description: Leases ended, with the method (C(dhcprelease) or C(leasefile_rewrite)).
  returned: always
  type: list
  elements: dict
dnsmasq_pid:
  description: The running dnsmasq's pid, null when it is not running.
  returned: always
  type: int
reloaded:
  description: Whether dnsmasq was sent SIGHUP.
  returned: always
  type: bool
failure:
  description: Phase C(dhcp), code and message of a failure.
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_dhcp


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mac_address=dict(type="str", required=True),
            state=dict(type="str", default="present", choices=["present", "absent"]),
            **vm_dhcp.reservation_spec(),
        ),
        supports_check_mode=True,
    )
    vm_common.run_module(module, vm_dhcp.run)


if __name__ == "__main__":
    main()
