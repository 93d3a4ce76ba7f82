#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_vm_seed
short_description: Write the NoCloud seed ISO (cidata) of one slice allocation
version_added: "0.1.0"
description:
  - Creates the node terminal relay key pair (ed25519, O(terminal_key_path)) when it is
    missing.
  - Renders C(user-data) (hostname, users with their SSH authorized keys, the node
    terminal relay public key always added to every user), C(meta-data) (C(instance-id) = the
    allocation id) and C(network-config) (DHCP on the NIC with the reserved MAC), and
    writes them as an ISO9660 image labelled C(cidata).
  - Compares the files inside an existing ISO with the desired ones; writes only when they
    differ (atomically).
  - With O(host_private_key) and O(host_public_key), user-data makes that ed25519 key the
    guest's only SSH host key (cloud-init C(ssh_keys), C(ssh_deletekeys), no generated
    keys), so the readiness gate can pin it. The private key is withheld from the result
    and the diff.
  - Rejects malformed user names, host names and public keys before writing anything.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  path:
    description: Where the seed ISO goes (in the allocation's state directory).
    type: path
    required: true
  allocation_id:
    description: Allocation UUID; becomes the cloud-init instance id.
    type: str
    required: true
  hostname:
    description: Guest host name.
    type: str
    required: true
  mac_address:
    description: Reserved MAC of the management NIC.
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
      - The node terminal relay private key (for example
        C(/var/lib/gpuaas/terminal/id_ed25519)), created with its C(.pub) when missing;
        the public key is added to every user's keys.
    type: path
  host_private_key:
    description:
      - The guest's SSH host private key (unencrypted OpenSSH format, ed25519), generated for
        this allocation by the control plane. Requires O(host_public_key).
    type: str
  host_public_key:
    description: Its public half (C(ssh-ed25519 ...)), which the readiness gate pins.
    type: str
attributes:
  check_mode:
    description: Reports whether the seed would change; writes nothing.
    support: full
  diff_mode:
    description: The seed files before and after.
    support: full
  platform:
    description: Hosts with pycdlib and ssh-keygen (OpenSSH client).
    support: full
    platforms: posix
requirements:
  - pycdlib
"""

EXAMPLES = r"""
- name: Seed for a slice
  gpuaas.fleet.slice_vm_seed:
    path: /var/lib/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517/seed.iso
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    hostname: slice-158ea147
    mac_address: "52:54:00:3f:a2:10"
    users:
      - name: gpuuser
        ssh_authorized_keys: ["{{ tenant_public_key }}"]
        sudo: "ALL=(ALL) NOPASSWD:ALL"
    terminal_key_path: /var/lib/gpuaas/terminal/id_ed25519
"""

RETURN = r"""
changed:
  description: Whether the ISO or the relay key was (or would be) written.
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
path:
  description: The seed ISO path.
  returned: always
  type: str
files:
  description: The seed files as written (user-data, meta-data, network-config), the
    guest's private host key replaced by C(<private host key withheld>).
  returned: always
  type: dict
host_key:
  description: The guest host public key the seed installs, or null.
  returned: always
  type: str
terminal_key:
  description: The relay key (path, created, public_key).
  returned: always
  type: dict
failure:
  description: Phase C(seed), code and message of a refusal.
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_common, vm_seed


def main():
    module = AnsibleModule(
        argument_spec=dict(
            allocation_id=dict(type="str", required=True),
            mac_address=dict(type="str", required=True),
            **vm_seed.seed_spec(),
        ),
        required_together=vm_seed.SEED_REQUIRED_TOGETHER,
        supports_check_mode=True,
    )
    vm_common.fail_missing_libraries(
        module, missing_required_lib, pycdlib=vm_seed.PYCDLIB_IMPORT_ERROR
    )
    vm_common.run_module(module, vm_seed.run)


if __name__ == "__main__":
    main()
