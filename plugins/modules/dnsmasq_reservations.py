#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: dnsmasq_reservations
short_description: Keep exactly the approved slice DHCP reservations in the node's dnsmasq
version_added: "0.1.0"
description:
  - Renders dnsmasq's C(--dhcp-hostsfile) (lines C(MAC,IP[,name])) with one line per
    approved slot and nothing else. Lines for other MACs or IPs are stale and removed; a
    line whose MAC and IP match an approved slot is kept as it is, so the host name the VM
    provisioning set survives.
  - Removes legacy per-slice dnsmasq files matching O(legacy_globs) (stale reservations of
    failed lab attempts); dnsmasq reads those only at start, so RV(restart_required) is then
    true.
  - Sends C(SIGHUP) to the running dnsmasq (from O(pidfile)) when the hostsfile changed.
  - Invalid input (bad MAC or IP, an IP outside the subnet or equal to the gateway,
    duplicates) fails the module before anything is written.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  reservations:
    description: Approved slot reservations.
    type: list
    elements: dict
    required: true
    suboptions:
      mac:
        description: The slot VM's MAC.
        type: str
        required: true
      ip:
        description: The slot's private IPv4 address.
        type: str
        required: true
      name:
        description: Host name handed out with the lease (optional).
        type: str
  subnet:
    description: The node's slice subnet; every IP must be a host address in it.
    type: str
    required: true
  hostsfile:
    description: dnsmasq C(--dhcp-hostsfile).
    type: path
    required: true
  pidfile:
    description: dnsmasq C(--pid-file), to reload it.
    type: path
  leasefile:
    description: dnsmasq C(--dhcp-leasefile), to report leases that are not approved.
    type: path
  legacy_globs:
    description: Glob patterns of legacy per-slice dnsmasq files to remove.
    type: list
    elements: str
    default: []
  root:
    description: Filesystem root the paths are under (tests); dnsmasq is reloaded only for C(/).
    type: path
    default: /
attributes:
  check_mode:
    description: Reports what would be added and removed; changes nothing.
    support: full
  diff_mode:
    description: The hostsfile and removed legacy files before and after.
    support: full
  platform:
    description: Linux hosts running dnsmasq.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Reserve exactly the approved slots
  gpuaas.fleet.dnsmasq_reservations:
    reservations:
      - {mac: "52:54:00:3f:a2:10", ip: 10.100.0.10}
      - {mac: "52:54:00:9c:01:7e", ip: 10.100.0.11}
    subnet: 10.100.0.0/24
    hostsfile: /var/lib/gpuaas/dnsmasq/slice-hosts
    pidfile: /run/dnsmasq/dnsmasq.pid
    legacy_globs: [/etc/dnsmasq.d/gpuaas-gpuaas-slice-*.conf]
"""

RETURN = r"""
hostsfile:
  description: The hostsfile path.
  returned: always
  type: str
reservations:
  description: The validated approved reservations (mac, ip, name), in IP order.
  returned: always
  type: list
  elements: dict
kept:
  description: Existing lines kept unchanged.
  returned: always
  type: list
  elements: str
added:
  description: Lines added.
  returned: always
  type: list
  elements: str
removed_stale:
  description: Reservation lines removed because no approved slot owns them.
  returned: always
  type: list
  elements: str
legacy_files_removed:
  description: Legacy per-slice dnsmasq files removed.
  returned: always
  type: list
  elements: str
unapproved_leases:
  description: Leases (mac, ip, name) of MACs or IPs that are not approved.
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
restart_required:
  description: Whether dnsmasq must be restarted (legacy files removed).
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import dnsmasq_reservations, hostfile


def main():
    module = AnsibleModule(
        argument_spec=dict(
            reservations=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    mac=dict(type="str", required=True),
                    ip=dict(type="str", required=True),
                    name=dict(type="str"),
                ),
            ),
            subnet=dict(type="str", required=True),
            hostsfile=dict(type="path", required=True),
            pidfile=dict(type="path"),
            leasefile=dict(type="path"),
            legacy_globs=dict(type="list", elements="str", default=[]),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )
    try:
        result = dnsmasq_reservations.run(module.params, module.check_mode)
    except (dnsmasq_reservations.ReservationError, hostfile.HostFileError) as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
