# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
name: controlplane
short_description: Nodes of the gpuaas control-plane store as an Ansible inventory
version_added: "0.1.0"
description:
  - Reads registered nodes from the gpuaas control plane (PostgreSQL) and groups them by
    region (C(region_<code>)), MAAS profile intent (C(intent_slice_vm), C(intent_baremetal))
    and derived occupancy posture (for example C(posture_fully_available),
    C(posture_cleanup_blocked), C(posture_unavailable)).
  - Every host carries the variables the roles need (C(gpuaas_node_id), the host name
    discovery names its map and seeds slot MACs with; C(gpuaas_node_uuid), the store's key;
    C(gpuaas_slice_subnet), C(gpuaas_slice_bridge), C(gpuaas_network_mode), ...), the node's
    non-secret host variables, and C(ansible_host) when a management address is known.
  - C(gpuaas_profile) (C(slice-vm) or C(baremetal), from the MAAS profile tag; absent for
    nodes without one) is what C(playbooks/bootstrap.yml) sorts hosts by.
  - C(gpuaas_slot_reservations) lists the approved slots' DHCP reservations (C(mac), C(ip),
    C(name)) and C(gpuaas_vfio_devices) their GPU and fabric VF PCI addresses, the inputs of
    the network baseline and host bootstrap roles.
  - SSH host key checking is always on for SSH hosts, against the keys the store pins
    (see O(known_hosts_file)).
  - C(gpuaas_topology_collected_at) (ISO 8601) and C(gpuaas_topology_blockers) come from the
    node's newest stored topology evidence, for parity's freshness check; absent before the
    first discovery.
  - Needs the C(gpuaas-fleet) Python distribution (package C(controlplane)) on the
    controller.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  plugin:
    description: Marks the file as a source for this plugin.
    required: true
    type: str
    choices: [gpuaas.fleet.controlplane]
  database_url:
    description:
      - SQLAlchemy or libpq URL of the control-plane store.
      - Without it the embedded PostgreSQL of the current user is used.
    type: str
    env:
      - name: GPUAAS_DATABASE_URL
  store_reached:
    description:
      - The process that wrote this source used the store a moment ago (the flows write
        one right after admitting a run), so a refused connection is taken as the store
        restarting and waited for (up to a minute), as the control plane's own
        connections are. Off, a store that cannot be reached fails the parse at once (a
        wrong address is not worth waiting for).
    type: bool
    default: false
  hostnames:
    description: Only these nodes.
    type: list
    elements: str
  region:
    description: Only nodes of this region.
    type: str
  profile_intent:
    description: Only nodes with this profile intent.
    type: str
    choices: [slice_vm, baremetal, unknown]
  known_hosts_file:
    description:
      - Where the SSH host keys the store pins for the fleet are written (the whole file is
        replaced on each parse). Hosts reached over SSH accept only their pinned keys
        (C(HostKeyAlias) of the node's name, strict checking, no other known-hosts file);
        a node without pinned keys is not reachable until an operator pins them
        (C(gpuaas node rekey)).
      - Defaults to C(gpuaas/known_hosts) under C($XDG_CACHE_HOME) (or C(~/.cache)).
    type: path
    env:
      - name: GPUAAS_KNOWN_HOSTS_FILE
"""

EXAMPLES = r"""
# inventories/controlplane.yml
plugin: gpuaas.fleet.controlplane
region: region-maas-1
profile_intent: slice_vm
"""

import os

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin


def default_known_hosts():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "gpuaas", "known_hosts")


class InventoryModule(BaseInventoryPlugin):
    NAME = "gpuaas.fleet.controlplane"

    def verify_file(self, path):
        return super(InventoryModule, self).verify_file(path) and path.endswith(
            ("controlplane.yml", "controlplane.yaml")
        )

    def parse(self, inventory, loader, path, cache=True):
        super(InventoryModule, self).parse(inventory, loader, path, cache)
        self._read_config_data(path)
        try:
            from controlplane.api import ControlPlane
            from controlplane.db import engine_for, normalize_url
        except ImportError as exc:
            raise AnsibleParserError(
                "the gpuaas.fleet.controlplane inventory needs the gpuaas-fleet Python "
                "package (controlplane) on the controller: %s" % exc
            ) from exc
        url = self.get_option("database_url")
        reached = self.get_option("store_reached")
        plane = ControlPlane(engine_for(normalize_url(url), reached=reached)) if url else None
        try:
            if plane is None:
                plane = ControlPlane.from_environment()
            data = plane.inventory(
                hostnames=self.get_option("hostnames"),
                region=self.get_option("region"),
                profile_intent=self.get_option("profile_intent"),
                known_hosts_file=self.get_option("known_hosts_file") or default_known_hosts(),
            )
        except Exception as exc:
            # SQLAlchemy repeats the driver's message with a link; the driver's first line
            # says what happened.
            reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
            message = "cannot read nodes from the control plane: %s" % reason
            raise AnsibleParserError(message) from exc
        for host, variables in data["all"]["hosts"].items():
            self.inventory.add_host(host)
            for key, value in variables.items():
                self.inventory.set_variable(host, key, value)
        for group, members in data["all"]["children"].items():
            self.inventory.add_group(group)
            for host in members["hosts"]:
                self.inventory.add_child(group, host)
