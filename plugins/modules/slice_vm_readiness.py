#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_vm_readiness
short_description: Gate a slice provision on the reserved DHCP lease and SSH
version_added: "0.1.0"
description:
  - Waits, within O(timeout) seconds, for a dnsmasq lease of the VM's MAC (its IP must be
    the expected one; a different IP fails at once), then for an SSH banner on the expected
    IP, then, with O(ssh_probe_key), for a successful SSH login running
    O(ssh_probe_command) (proving the guest applied the seed's keys).
  - Returns C(readiness) with C({mac, expected_ip, actual_ip, lease_state, ssh_ready}) and
    per-phase timings. A VM that is created but not reachable fails the module with the
    phase that timed out and the tail of the serial console log.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  mac_address:
    description: The VM's reserved MAC.
    type: str
    required: true
  expected_ip:
    description: The reserved private IP.
    type: str
    required: true
  leasefile:
    description: dnsmasq C(--dhcp-leasefile).
    type: path
    required: true
  timeout:
    description: Seconds for the whole gate (lease, SSH banner and login).
    type: int
    default: 300
  poll_interval:
    description: Seconds between probes.
    type: float
    default: 1.0
  ssh_port:
    description: Guest SSH port.
    type: int
    default: 22
  ssh_probe_user:
    description: User for the login probe.
    type: str
    default: gpuuser
  ssh_probe_key:
    description: Private key for the login probe (normally the node terminal relay key).
    type: path
  ssh_probe_command:
    description: Command the login probe runs; its output is returned.
    type: str
    default: hostname
  host_public_key:
    description:
      - The guest's SSH host public key (the one M(gpuaas.fleet.slice_vm_seed) installed).
        The login probe then accepts only that key; a guest presenting another fails at
        once with C(host_key_mismatch), naming both fingerprints. Without it any key is
        accepted.
    type: str
  console_log:
    description: Serial console log whose tail is returned when the gate fails.
    type: path
attributes:
  check_mode:
    description: Probes once without waiting and reports; never fails on readiness.
    support: full
  diff_mode:
    description: Nothing changes.
    support: none
  platform:
    description: The slice host (reaches the private subnet), with an OpenSSH client.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Wait for the slice to answer SSH with the relay key
  gpuaas.fleet.slice_vm_readiness:
    mac_address: "52:54:00:3f:a2:10"
    expected_ip: 10.100.0.10
    leasefile: /var/lib/misc/dnsmasq.leases
    ssh_probe_user: gpuuser
    ssh_probe_key: /var/lib/gpuaas/terminal/id_ed25519
    timeout: 600
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
ready:
  description: Whether the gate passed (false in check mode).
  returned: success
  type: bool
readiness:
  description: The readiness report.
  returned: always
  type: dict
  contains:
    mac:
      description: The VM's MAC.
      type: str
      returned: always
    expected_ip:
      description: The reserved IP.
      type: str
      returned: always
    actual_ip:
      description: The leased IP, null without a lease.
      type: str
      returned: always
    lease_state:
      description: C(missing), C(matched) or C(mismatch).
      type: str
      returned: always
    ssh_ready:
      description: Whether the expected IP answered with an SSH banner.
      type: bool
      returned: always
    ssh_auth:
      description: C(ok), C(failed), C(host_key_refused), C(pending) or C(skipped) (no
        probe key).
      type: str
      returned: always
    host_key:
      description: C(pinned) when O(host_public_key) was given, else C(not pinned).
      type: str
      returned: always
    host_key_fingerprint:
      description: The pinned key's C(SHA256:) fingerprint, or null.
      type: str
      returned: always
    host_key_presented:
      description: C(type fingerprint) of each key the guest presented instead.
      type: list
      elements: str
      returned: on host_key_mismatch
    ssh_probe_output:
      description: Output of the probe command.
      type: str
      returned: always
    timings:
      description: Seconds per phase (lease, ssh, ssh_auth) and total.
      type: dict
      returned: always
    failed_phase:
      description: The phase that failed.
      type: str
      returned: failure
    console_tail:
      description: Tail of the serial console log.
      type: str
      returned: failure with O(console_log)
failure:
  description:
    - Phase C(readiness), code and message. Codes are C(lease_timeout), C(lease_mismatch),
      C(ssh_timeout) and C(ssh_auth_failed).
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_readiness


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mac_address=dict(type="str", required=True),
            expected_ip=dict(type="str", required=True),
            leasefile=dict(type="path", required=True),
            timeout=dict(type="int", default=300),
            poll_interval=dict(type="float", default=1.0),
            ssh_port=dict(type="int", default=22),
            ssh_probe_user=dict(type="str", default="gpuuser"),
            ssh_probe_key=dict(type="path", no_log=False),
            ssh_probe_command=dict(type="str", default="hostname"),
            host_public_key=dict(type="str", no_log=False),
            console_log=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    vm_common.run_module(module, vm_readiness.run)


if __name__ == "__main__":
    main()
