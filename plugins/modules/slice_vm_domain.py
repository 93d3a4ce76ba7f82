#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_vm_domain
short_description: Define, start, stop and undefine the libvirt domain of one slice allocation
version_added: "0.1.0"
description:
  - The domain is named C(gpuaas-slice-<allocation id hex>) and uses the allocation id as
    its UUID.
  - Its XML has UEFI with Secure Boot and enrolled keys off, no TPM, no graphics, VNC or
    USB (the serial console goes to O(console_log) only), a VFIO C(hostdev) for every GPU
    and fabric VF, every slot disk as a raw virtio block device (the first boots), the
    seed ISO as a CD-ROM, a bridge or Open vSwitch vNIC with the reserved MAC, vCPUs and
    memory from the profile, vCPUs and emulator pinned to the slots' NUMA nodes and
    memory bound to them, and hugepage backing when the profile asks for it.
  - O(state=running) defines (or redefines when our properties differ) and starts it;
    O(state=defined) only defines it; a running domain whose definition changed reports
    C(restart_required) and keeps running.
  - O(state=absent) shuts the domain down gracefully (ACPI) for up to
    O(shutdown_timeout) seconds, hard-stops it if it is still running, and undefines it
    together with its UEFI NVRAM (a plain undefine fails on UEFI domains), retrying up to
    O(undefine_attempts) times. A domain that is already gone is not a change.
  - With O(seed), the NoCloud seed is written first (as M(gpuaas.fleet.slice_vm_seed)
    writes it) and attached; with O(reservation), the VM's DHCP reservation is kept (as
    M(gpuaas.fleet.slice_dhcp_reservation) keeps it) before the domain is defined, and
    removed after it is undefined with O(state=absent). The three always go together in a
    provision and a release, so one module process does them (docs/slice-host.md,
    "Provision phases"); each part's result is returned under its own key, and a failure
    names the part (C(failure.phase) V(seed), V(dhcp) or V(domain)).
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.libvirt
options:
  allocation_id:
    description: Allocation UUID.
    type: str
    required: true
  state:
    description: Desired domain state.
    type: str
    default: running
    choices: [running, defined, absent]
  slots:
    description: The allocation's slots; required unless O(state=absent).
    type: list
    elements: dict
    suboptions:
      gpu_pci_address:
        description: GPU PCI address, for example C(0000:1b:00.0).
        type: str
        required: true
      fabric_vf_pci_address:
        description: The slot's own fabric VF PCI address.
        type: str
        required: true
      nvme_device:
        description: Raw disk by stable identity.
        type: str
        required: true
      numa_node:
        description: NUMA node of the slot's devices.
        type: int
  profile:
    description: Runtime profile; required unless O(state=absent).
    type: dict
    suboptions:
      vcpus:
        description: Virtual CPUs.
        type: int
        required: true
      memory_mib:
        description: Memory in MiB.
        type: int
        required: true
      hugepages:
        description: Back the memory with hugepages.
        type: bool
        default: false
      hugepage_size_kib:
        description: Hugepage size in KiB.
        type: int
        default: 1048576
      bandwidth:
        description:
          - Rates of the management vNIC (libvirt C(<bandwidth>); on an Open vSwitch port
            libvirt applies them as the port's policing and shaping). Absent means unshaped.
          - Negative, zero or absurd rates (above 100 Gbit/s, a burst above 1 GiB) and a
            peak below its average fail the module before anything changes.
        type: dict
        suboptions:
          inbound:
            description: Traffic the VM receives.
            type: dict
            suboptions:
              average:
                description: Average rate in kilobytes per second (1 to 12500000).
                type: int
                required: true
              peak:
                description: Peak rate in kilobytes per second, not below the average.
                type: int
              burst:
                description: Kilobytes that may go at the peak rate (1 to 1048576).
                type: int
          outbound:
            description: Traffic the VM sends.
            type: dict
            suboptions:
              average:
                description: Average rate in kilobytes per second (1 to 12500000).
                type: int
                required: true
              peak:
                description: Peak rate in kilobytes per second, not below the average.
                type: int
              burst:
                description: Kilobytes that may go at the peak rate (1 to 1048576).
                type: int
  mac_address:
    description: Reserved management MAC; required unless O(state=absent).
    type: str
  bridge:
    description: Bridge of the vNIC; required unless O(state=absent).
    type: str
  bridge_type:
    description: Linux bridge or Open vSwitch (adds C(<virtualport type='openvswitch'/>)).
    type: str
    default: linux
    choices: [linux, openvswitch]
  seed_iso:
    description:
      - NoCloud seed ISO attached as a read-only SATA CD-ROM.
      - Mutually exclusive with O(seed), whose O(seed.path) it then is.
    type: path
  seed:
    description:
      - The NoCloud seed to write before the domain is defined, and attach (ignored with
        O(state=absent)). Its instance id is O(allocation_id), its NIC O(mac_address).
      - Creates the node terminal relay key pair when it is missing, and rejects malformed
        user names, host names and public keys before writing anything.
    type: dict
    suboptions:
      path:
        description: Where the seed ISO goes (in the allocation's state directory).
        type: path
        required: true
      hostname:
        description: Guest host name.
        type: str
        required: true
      users:
        description: Guest users.
        type: list
        elements: dict
        required: true
        suboptions:
          name:
            description: User name.
            type: str
            required: true
          ssh_authorized_keys:
            description: OpenSSH public keys.
            type: list
            elements: str
            default: []
          shell:
            description: Login shell.
            type: str
            default: /bin/bash
          sudo:
            description: cloud-init sudo rule, for example C(ALL=(ALL) NOPASSWD:ALL).
            type: str
      terminal_key_path:
        description:
          - Private key of the node terminal relay (ed25519), created when missing; its
            public key is added to every user.
        type: path
      host_private_key:
        description:
          - The guest's ed25519 SSH host key (OpenSSH private key format); withheld from
            the result and the diff.
        type: str
      host_public_key:
        description: Its public half (OpenSSH format); required with O(seed.host_private_key).
        type: str
  reservation:
    description:
      - The VM's DHCP reservation in the node's dnsmasq, a C(MAC,IP,name) line in its
        hostsfile for O(mac_address). It is kept before the domain is defined, and removed
        with the stale lease after the domain is undefined with O(state=absent).
    type: dict
    suboptions:
      ip_address:
        description: Reserved IPv4 address.
        type: str
        required: true
      hostname:
        description: Host name in the reservation line; empty for none.
        type: str
        default: ""
      hostsfile:
        description: dnsmasq C(--dhcp-hostsfile).
        type: path
        required: true
      leasefile:
        description: dnsmasq leasefile.
        type: path
        required: true
      pidfile:
        description: dnsmasq pidfile (SIGHUP after an edit).
        type: path
        required: true
      interface:
        description: Bridge a stale lease's DHCPRELEASE is sent on.
        type: str
      release_timeout:
        description: Seconds to wait for dnsmasq to drop a released lease.
        type: float
        default: 5.0
  console_log:
    description: File receiving the serial console.
    type: path
  emulation:
    description: Domain type C(qemu) (TCG emulation) instead of C(kvm); for test hosts.
    type: bool
    default: false
  pci_passthrough:
    description: Attach the GPUs and fabric VFs as VFIO hostdevs; false only on test hosts.
    type: bool
    default: true
  shutdown_timeout:
    description: Seconds to wait for a graceful shutdown before the hard stop.
    type: int
    default: 120
  undefine_attempts:
    description: Undefine attempts (with NVRAM) before giving up.
    type: int
    default: 3
  undefine_retry_delay:
    description: Seconds between undefine attempts.
    type: float
    default: 2.0
attributes:
  check_mode:
    description: Reports the actions it would take.
    support: full
  diff_mode:
    description: State and the compared domain properties before and after.
    support: full
  platform:
    description: Linux hosts with libvirt.
    support: full
    platforms: posix
requirements:
  - libvirt-python
  - lxml
"""

EXAMPLES = r"""
- name: Start the slice VM
  gpuaas.fleet.slice_vm_domain:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    slots: "{{ slots }}"
    profile: {vcpus: 24, memory_mib: 65536, hugepages: true}
    mac_address: "52:54:00:3f:a2:10"
    bridge: ovsbr0
    bridge_type: openvswitch
    seed_iso: /var/lib/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517/seed.iso
    console_log: /var/log/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517.log

- name: Release it
  gpuaas.fleet.slice_vm_domain:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    state: absent
    shutdown_timeout: 60

- name: Write its seed, reserve its address and start it, in one module process
  gpuaas.fleet.slice_vm_domain:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    slots: "{{ slots }}"
    profile: {vcpus: 24, memory_mib: 65536}
    mac_address: "52:54:00:3f:a2:10"
    bridge: ovsbr0
    bridge_type: openvswitch
    seed:
      path: /var/lib/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517/seed.iso
      hostname: trainer-0
      users:
        - name: gpuuser
          ssh_authorized_keys: ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB3b tenant"]
      terminal_key_path: /var/lib/gpuaas/terminal/id_ed25519
    reservation:
      ip_address: 10.100.0.17
      hostname: trainer-0
      hostsfile: /var/lib/gpuaas/dnsmasq/slice-hosts
      leasefile: /var/lib/misc/dnsmasq.leases
      pidfile: /run/dnsmasq/dnsmasq.pid
      interface: ovsbr0

- name: Release it and its reservation
  gpuaas.fleet.slice_vm_domain:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    state: absent
    mac_address: "52:54:00:3f:a2:10"
    reservation:
      ip_address: 10.100.0.17
      hostsfile: /var/lib/gpuaas/dnsmasq/slice-hosts
      leasefile: /var/lib/misc/dnsmasq.leases
      pidfile: /run/dnsmasq/dnsmasq.pid
      interface: ovsbr0
"""

RETURN = r"""
changed:
  description: Whether the domain was (or would be) defined, started, stopped or undefined.
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
name:
  description: Domain name.
  returned: always
  type: str
  sample: gpuaas-slice-158ea1470115407fbbd51850c32b9517
uuid:
  description: Domain UUID (the allocation id).
  returned: unless O(state=absent)
  type: str
state:
  description: Domain state after the run (running, shutoff, absent, ...).
  returned: always
  type: str
actions:
  description: What was (or would be) done, for example C([define, start]) or C([stop, undefine]).
  returned: always
  type: list
  elements: str
restart_required:
  description: The running domain's definition changed; it applies on the next boot.
  returned: unless O(state=absent)
  type: bool
xml:
  description: The desired domain XML.
  returned: unless O(state=absent)
  type: str
stop:
  description: How the domain stopped (C(graceful) or C(forced)), why it was forced, seconds.
  returned: when O(state=absent)
  type: dict
undefine_attempts:
  description: Each undefine attempt with its error.
  returned: when O(state=absent)
  type: list
  elements: dict
seed:
  description:
    - What M(gpuaas.fleet.slice_vm_seed) returns for the seed written or compared (C(changed),
      C(path), C(files), C(host_key), C(terminal_key)), with its C(finished_at).
  returned: when O(seed) was given, O(state) is not V(absent) and the seed part ran
  type: dict
reservation:
  description:
    - What M(gpuaas.fleet.slice_dhcp_reservation) returns for the reservation kept or
      removed (C(changed), C(reservation), C(added), C(removed_stale_reservations),
      C(stale_leases), C(released_leases), C(dnsmasq_pid), C(reloaded)), with its
      C(finished_at).
  returned: when O(reservation) was given and the reservation part ran
  type: dict
diff:
  description:
    - With O(seed) or O(reservation), a list of each part's diff in the order they ran
      (the seed's, the reservation's, the domain's; the domain's first for V(absent)).
  returned: diff mode
  type: raw
failure:
  description:
    - Phase (V(seed), V(dhcp) or V(domain)), code and message of a failure (for example
      C(undefine_failed)); the parts that finished before it are returned under their keys.
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    common_args,
    vm_common,
    vm_dhcp,
    vm_domain,
    vm_instance,
    vm_libvirt,
    vm_seed,
)
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import PROFILE_SPEC, SLOT_SPEC


def main():
    module = AnsibleModule(
        argument_spec=dict(
            allocation_id=dict(type="str", required=True),
            state=dict(type="str", default="running", choices=["running", "defined", "absent"]),
            slots=dict(type="list", elements="dict", options=SLOT_SPEC),
            profile=dict(type="dict", options=PROFILE_SPEC),
            mac_address=dict(type="str"),
            bridge=dict(type="str"),
            bridge_type=dict(type="str", default="linux", choices=["linux", "openvswitch"]),
            seed_iso=dict(type="path"),
            seed=dict(
                type="dict",
                options=vm_seed.seed_spec(),
                required_together=vm_seed.SEED_REQUIRED_TOGETHER,
            ),
            reservation=dict(type="dict", options=vm_dhcp.reservation_spec()),
            console_log=dict(type="path"),
            emulation=dict(type="bool", default=False),
            pci_passthrough=dict(type="bool", default=True),
            shutdown_timeout=dict(type="int", default=120),
            undefine_attempts=dict(type="int", default=3),
            undefine_retry_delay=dict(type="float", default=2.0),
            libvirt_uri=common_args.libvirt_uri_spec(),
        ),
        required_if=[
            ("state", "running", ("slots", "profile", "mac_address", "bridge")),
            ("state", "defined", ("slots", "profile", "mac_address", "bridge")),
        ],
        required_by={"reservation": ("mac_address",)},
        mutually_exclusive=[("seed", "seed_iso")],
        supports_check_mode=True,
    )
    libraries = {
        "libvirt-python": vm_libvirt.LIBVIRT_IMPORT_ERROR,
        "lxml": vm_domain.LXML_IMPORT_ERROR,
    }
    if module.params["seed"] and module.params["state"] != "absent":
        libraries["pycdlib"] = vm_seed.PYCDLIB_IMPORT_ERROR
    vm_common.fail_missing_libraries(module, missing_required_lib, **libraries)
    vm_common.run_module(module, vm_instance.run)


if __name__ == "__main__":
    main()
