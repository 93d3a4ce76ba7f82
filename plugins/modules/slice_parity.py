#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_parity
short_description: Check a GPU slice host against the provisioning parity target
version_added: "0.1.0"
description:
  - Runs one check per condition of the slice host parity target (docs/slice-host.md) and
    returns PASS, FAIL or WARN with a detail and a remediation for each.
  - Checks behaviour, not package presence. V(vfio) loaded VFIO modules, V(kvm)
    C(/dev/kvm), V(iommu) IOMMU groups, V(sriov_vfs) each PF in the bootstrap's
    C(/etc/gpuaas/sriov-vfs.json) has its VF count, every VF an IOMMU group and, when it has
    a vfio-pci override, the vfio-pci driver (PASS when no counts are configured),
    V(ipoib_netplan) C(/etc/netplan/60-ipoib.yaml)
    parsed as netplan YAML that gives an C(ibp*) interface an IPv4 address (inside
    O(fabric_subnet) when set), V(fabric_address) an up C(ibp*) interface that owns an IPv4
    address (inside O(fabric_subnet) when set) with a route reaching it, V(fabric_route) a
    route over C(ibp*) (covering O(fabric_subnet) when set), V(bridge) the bridge is an up
    Linux or Open vSwitch bridge that owns the subnet gateway address, V(dnsmasq) a live
    dnsmasq in this network namespace with a DHCP range in the GPU subnet that itself holds
    the UDP port 67 socket, V(libvirt) a libvirt socket that accepts connections,
    V(vnic_bandwidth) each running slice VM's vNIC rates as libvirt applied them (from its
    status XML under C(/run/libvirt/qemu)) and shaped by the kernel on its tap (a shaping
    root qdisc for inbound, a police action on its ingress for outbound, read with C(tc));
    PASS listing them, FAIL naming a rate the kernel does not apply, WARN when a status or
    tap is unreadable, V(nat) a MASQUERADE rule for the subnet, V(ip_forward) IPv4
    forwarding, V(slice_isolation) slice guests contained on the node (docs/security.md),
    judged by running a guest's probe packets through the live filter table
    (C(iptables-save -t filter)), so a rule another tool put first counts as what it does -
    FORWARD from the bridge drops each of O(infra_networks) and slice to slice and accepts
    NAT egress, INPUT from the bridge drops everything (sshd, libvirt, exporters, on the
    gateway and the node's other addresses) but DHCP and DNS to the gateway, IPv6 is
    disabled on the bridge, and guests are kept apart at layer 2 (the OpenFlow rules on Open
    vSwitch, the ebtables jump on a Linux bridge); a FAIL names each missing part,
    V(tmfifo) the BF3 management address (WARN when absent),
    V(historical_network_service) WARN when the historical
    C(gpuaas-slice-host-net-baseline) unit exists or still runs (active or enabled under
    systemd, else a live pidfile or a process running its script),
    V(api_topology) fresh topology evidence without hard blocker (WARN when none is given).
  - Also returns the machine-readable lines
    C(GPUAAS_SLICE_PARITY status=... check=... detail=... remediation=...) with spaces
    escaped, and a final C(GPUAAS_SLICE_PARITY_SUMMARY) line with C(failures=N).
  - Fails the host when any check fails unless O(fail_on_failures=false).
  - Given O(nonce), RV(results) are signed with the node's evidence signing key
    (RV(attestation)); the control plane makes a node schedulable only on a parity result
    the node signed for that run.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.attestation
options:
  root:
    description:
      - Filesystem root for the file-based checks (modules, C(/dev/kvm), IOMMU groups,
        netplan, systemd units). Network checks always read the live namespace.
    type: path
    default: /
  bridge:
    description: Bridge that must own the first address of O(slice_subnet).
    type: str
    default: ovsbr0
  slice_subnet:
    description: The node's GPU slice subnet.
    type: str
    default: 10.100.0.0/24
  tmfifo_interface:
    description: BF3 RShim management interface.
    type: str
    default: tmfifo_net0
  fabric_subnet:
    description:
      - Site IPoIB subnet. V(fabric_address) and V(ipoib_netplan) need an C(ibp*) address
        inside it, V(fabric_route) a route over C(ibp*) that covers it.
      - When unset, any C(ibp*) IPv4 address and any route over an C(ibp*) interface pass.
    type: str
  infra_networks:
    description:
      - The operator's infrastructure ranges slice guests must not reach (V(slice_isolation));
        the same list the node's network baseline was given.
    type: list
    elements: str
    default: [10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 169.254.0.0/16, 100.64.0.0/10]
  libvirt_sockets:
    description: libvirt daemon sockets to try, in order.
    type: list
    elements: path
    default: [/run/libvirt/virtqemud-sock, /run/libvirt/libvirt-sock]
  topology_evidence:
    description:
      - Topology evidence for this node, at least C(collected_at) and C(blockers) (for
        example the map returned by M(gpuaas.fleet.slice_topology) in the same run).
      - Takes precedence over O(topology_collected_at); a map discovered by O(discover)
        takes precedence over it.
    type: dict
  topology_collected_at:
    description:
      - ISO 8601 time of the node's newest topology evidence stored in the control plane
        (the C(gpuaas_topology_collected_at) host variable of the control-plane inventory).
      - An empty string means the control plane holds none, which fails V(api_topology).
      - Without this and O(topology_evidence), V(api_topology) reports WARN (local checks
        only).
    type: str
  topology_blockers:
    description:
      - Blockers of that stored evidence (the C(gpuaas_topology_blockers) host variable);
        a hard one fails V(api_topology).
    type: list
    elements: raw
    default: []
  topology_max_age:
    description:
      - Topology evidence older than this fails V(api_topology).
      - Seconds, or a number with a unit C(s), C(m), C(h) or C(d) (V(90m), V(24h), V(7d)).
    type: str
    default: 24h
  checks:
    description: Run only these checks (default all, in the parity target's order).
    type: list
    elements: str
    choices:
      - vfio
      - kvm
      - iommu
      - sriov_vfs
      - ipoib_netplan
      - fabric_address
      - fabric_route
      - bridge
      - dnsmasq
      - libvirt
      - vnic_bandwidth
      - nat
      - ip_forward
      - slice_isolation
      - tmfifo
      - historical_network_service
      - api_topology
  fail_on_failures:
    description: Fail the host when at least one check reports FAIL.
    type: bool
    default: true
  discover:
    description:
      - Discover the host's topology first, in the same module run, as
        M(gpuaas.fleet.slice_topology) does with these options and O(root), O(bridge),
        O(slice_subnet) and O(tmfifo_interface); the map is returned as RV(topology) and is
        the evidence V(api_topology) judges, before O(topology_evidence) and
        O(topology_collected_at).
      - A fleet sweep's discovery and parity then cost one task per host instead of two
        (docs/operations.md, "Fleet sweeps").
      - A discovery that fails fails the host before any check runs, with a message that
        begins with C(topology discovery failed).
    type: dict
    suboptions:
      node:
        description:
          - As M(gpuaas.fleet.slice_topology)'s O(gpuaas.fleet.slice_topology#module:node).
        type: str
      network_mode:
        description:
          - As M(gpuaas.fleet.slice_topology)'s
            O(gpuaas.fleet.slice_topology#module:network_mode).
        type: str
        default: private-nat
        choices: [private-nat, private-routed, public-nat, tailscale-overlay]
      collect_network:
        description:
          - As M(gpuaas.fleet.slice_topology)'s
            O(gpuaas.fleet.slice_topology#module:collect_network).
        type: bool
        default: true
      fabric_link_layer:
        description:
          - As M(gpuaas.fleet.slice_topology)'s
            O(gpuaas.fleet.slice_topology#module:fabric_link_layer).
        type: str
        default: InfiniBand
        choices: [InfiniBand, Ethernet]
attributes:
  check_mode:
    description: Read-only; runs the same checks in check mode.
    support: full
  diff_mode:
    description: Read-only; there is nothing to diff.
    support: none
  platform:
    description: Linux hosts (sysfs, procfs, iproute2, iptables).
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Check slice parity, report but do not fail
  gpuaas.fleet.slice_parity:
    fail_on_failures: false
  register: parity

- name: Print the machine-readable lines
  ansible.builtin.debug:
    msg: "{{ parity.lines }}"

- name: Gate on parity with fresh topology evidence from this run
  gpuaas.fleet.slice_parity:
    topology_evidence: "{{ discovery.topology }}"
    topology_max_age: 15m

- name: Discover the topology and check parity against it, in one module run
  gpuaas.fleet.slice_parity:
    discover:
      node: "{{ inventory_hostname }}"
  register: checked

- name: The map discovered, as gpuaas.fleet.slice_topology returns it
  ansible.builtin.debug:
    msg: "{{ checked.topology.summary }}"

- name: Gate on the control plane's stored topology evidence (control-plane inventory)
  gpuaas.fleet.slice_parity:
    fabric_subnet: 172.16.0.0/16
    topology_collected_at: "{{ gpuaas_topology_collected_at | default('') }}"
    topology_blockers: "{{ gpuaas_topology_blockers | default([]) }}"
"""

RETURN = r"""
results:
  description: One result per check, in the parity target's order.
  returned: always
  type: list
  elements: dict
  contains:
    check:
      description: Check name.
      type: str
      returned: always
    status:
      description: PASS, FAIL or WARN.
      type: str
      returned: always
    ok:
      description: False only for FAIL (the result type shared with the VM preflight).
      type: bool
      returned: always
    code:
      description: Machine-readable failure code where the check has one (for example
        C(kvm_missing), C(not_a_bridge)); empty otherwise.
      type: str
      returned: always
    detail:
      description: What was observed.
      type: str
      returned: always
    remediation:
      description: What to do about a FAIL or WARN (empty for PASS).
      type: str
      returned: always
lines:
  description: The results as GPUAAS_SLICE_PARITY lines plus the summary line.
  returned: always
  type: list
  elements: str
  sample:
    - GPUAAS_SLICE_PARITY status=PASS check=kvm detail=/dev/kvm\ present
    - GPUAAS_SLICE_PARITY status=FAIL check=ip_forward detail=net.ipv4.ip_forward=0
      remediation=sysctl\ -w\ net.ipv4.ip_forward=1\ and\ persist\ it\ in\ /etc/sysctl.d
    - GPUAAS_SLICE_PARITY_SUMMARY status=FAIL checks=2 passed=1 failures=1 warnings=0
failures:
  description: Number of FAIL results.
  returned: always
  type: int
warning_count:
  description:
    - Number of WARN results (C(warnings) itself is reserved by Ansible for warning
      messages; the count is also in RV(summary.warnings)).
  returned: always
  type: int
summary:
  description: Overall status and the counts of checks, passed, failures and warnings.
  returned: always
  type: dict
  contains:
    status:
      description: FAIL if any check failed, else WARN if any warned, else PASS.
      type: str
      returned: always
    checks:
      description: Number of checks run.
      type: int
      returned: always
    passed:
      description: Number of PASS results.
      type: int
      returned: always
    failures:
      description: Number of FAIL results.
      type: int
      returned: always
    warnings:
      description: Number of WARN results.
      type: int
      returned: always
topology:
  description:
    - The gpuaas.topology/v1 map discovered in this run, exactly as
      M(gpuaas.fleet.slice_topology) returns it
      (its RV(gpuaas.fleet.slice_topology#module:topology)).
  returned: when O(discover) was given
  type: dict
attestation:
  description:
    - The node's signature over RV(results) (an object with the single key C(results)) for
      the control plane's nonce - C(statement), C(signature), C(key_fingerprint)
      (docs/trust.md).
  returned: when O(nonce) was given and the signing key could be used
  type: dict
attestation_error:
  description: Why the results could not be signed.
  returned: when O(nonce) was given and signing failed
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    common_args,
    evidence_signing,
    netstate,
    parity,
    sysfs,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner
from ansible_collections.gpuaas.fleet.plugins.module_utils.topology import TopologyError


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/"),
            bridge=dict(type="str", default="ovsbr0"),
            slice_subnet=dict(type="str", default="10.100.0.0/24"),
            tmfifo_interface=dict(type="str", default="tmfifo_net0"),
            fabric_subnet=dict(type="str"),
            infra_networks=dict(
                type="list", elements="str", default=list(netstate.DEFAULT_INFRA_NETWORKS)
            ),
            libvirt_sockets=dict(
                type="list", elements="path", default=list(parity.LIBVIRT_SOCKETS)
            ),
            topology_evidence=dict(type="dict"),
            topology_collected_at=dict(type="str"),
            topology_blockers=dict(type="list", elements="raw", default=[]),
            topology_max_age=dict(type="str", default=parity.DEFAULT_TOPOLOGY_MAX_AGE),
            checks=dict(type="list", elements="str", choices=list(parity.CHECKS)),
            fail_on_failures=dict(type="bool", default=True),
            discover=dict(type="dict", options=common_args.topology_discovery_spec()),
            **common_args.attestation_spec(),
        ),
        required_by=common_args.ATTESTATION_REQUIRED_BY,
        supports_check_mode=True,
    )
    params = module.params
    try:
        max_age_seconds = parity.parse_duration(params["topology_max_age"])
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    context = parity.ParityContext(
        host=sysfs.HostRoot(params["root"]),
        bridge=params["bridge"],
        slice_subnet=params["slice_subnet"],
        tmfifo_interface=params["tmfifo_interface"],
        fabric_subnet=params["fabric_subnet"],
        infra_networks=tuple(params["infra_networks"]),
        libvirt_sockets=tuple(params["libvirt_sockets"]),
        topology_evidence=params["topology_evidence"],
        topology_collected_at=params["topology_collected_at"],
        topology_blockers=params["topology_blockers"],
        max_age_seconds=max_age_seconds,
        runner=module_runner(module),
    )
    try:
        output = parity.check_host(context, params["checks"], params["discover"])
    except TopologyError as exc:
        module.fail_json(msg=f"topology discovery failed: {exc}")
    except ValueError as exc:
        module.fail_json(msg=str(exc))
    output.update(evidence_signing.attest_field(params, "parity", output, "results"))
    if output["failures"] and params["fail_on_failures"]:
        failed = [r["check"] for r in output["results"] if r["status"] == parity.FAIL]
        module.fail_json(msg=f"slice parity failed: {', '.join(failed)}", **output)
    module.exit_json(**output)


if __name__ == "__main__":
    main()
