# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a slice host actually runs: slice domains and DHCP reservations and leases.

Read-only evidence for reconciliation: the control plane compares it with its claims
and allocations and records drift. Runs on target hosts: stdlib, lxml and libvirt-python.
"""

from __future__ import absolute_import, annotations, division, print_function

import uuid

from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_dhcp, vm_libvirt
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import read_bandwidth
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_domain import domain_state

try:
    from lxml import etree

    LXML_IMPORT_ERROR = None
except ImportError as exc:  # reported by the module with missing_required_lib
    etree = None
    LXML_IMPORT_ERROR = exc


def allocation_of(name: str) -> str | None:
    """The allocation id a slice domain name encodes, or None for foreign domains."""
    if not name.startswith(vm_common.DOMAIN_PREFIX):
        return None
    try:
        return str(uuid.UUID(hex=name[len(vm_common.DOMAIN_PREFIX) :]))
    except ValueError:
        return None


def describe(xml: str) -> dict:
    """Disks, MACs and each vNIC's rates (libvirt's <bandwidth>) of a domain from its XML."""
    root = etree.fromstring(xml.encode("utf-8"))
    return {
        "interfaces": [
            {
                "mac": (
                    nic.find("mac").get("address", "") if nic.find("mac") is not None else ""
                ).lower(),
                "bandwidth": read_bandwidth(nic),
            }
            for nic in root.findall("./devices/interface")
        ],
        "disks": sorted(
            source.get("dev") or source.get("file") or ""
            for source in root.findall("./devices/disk/source")
        ),
        "macs": sorted(
            mac.get("address", "").lower() for mac in root.findall("./devices/interface/mac")
        ),
    }


def domains(conn) -> list:
    found = []
    for dom in conn.listAllDomains():
        allocation_id = allocation_of(dom.name())
        if allocation_id is None:
            continue
        found.append(
            {
                "name": dom.name(),
                "allocation_id": allocation_id,
                "state": domain_state(dom),
                **describe(dom.XMLDesc(0)),
            }
        )
    return sorted(found, key=lambda d: d["name"])


def run(params: dict, check_mode: bool) -> dict:
    conn = vm_libvirt.open_libvirt(params["libvirt_uri"], phase="inventory")
    try:
        found = domains(conn)
    finally:
        conn.close()
    reservations = [
        vm_dhcp.parse_reservation(line) for line in vm_dhcp.read_lines(params["dnsmasq_hostsfile"])
    ]
    return {
        "changed": False,
        "domains": found,
        "reservations": [
            {"mac": r.mac, "ip": r.ip, "name": r.name} for r in reservations if r is not None
        ],
        "leases": [
            {"mac": lease.mac, "ip": lease.ip, "expiry": lease.expiry}
            for lease in vm_dhcp.read_leases(params["dnsmasq_leasefile"])
        ],
    }
