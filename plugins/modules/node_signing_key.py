#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: node_signing_key
short_description: Ensure the node's evidence signing key exists and report its public half
version_added: "0.1.0"
description:
  - Creates the node's Ed25519 evidence signing key when it is absent (PEM, mode C(0600),
    owned by root) and returns its public half as an OpenSSH C(ssh-ed25519) line, which
    the control plane pins for the node. An existing key is never replaced.
  - Results the control plane acts on (disk wipe proofs) are signed with it; see
    M(gpuaas.fleet.disk_wipe).
  - Refuses a key file that someone other than root could read.
author:
  - gpuaas fleet engineering (@gpuaas)
requirements:
  - cryptography (python3-cryptography on Debian)
options:
  path:
    description: Where the private key lives on the node.
    type: path
    default: /etc/gpuaas/evidence-signing.key
notes:
  - Check mode reports whether the key would be created.
"""

EXAMPLES = r"""
- name: Ensure the evidence signing key
  gpuaas.fleet.node_signing_key:
  register: signing_key
"""

RETURN = r"""
path:
  description: The private key's path on the node.
  returned: always
  type: str
public_key:
  description: The public half (C(ssh-ed25519 AAAA... gpuaas-evidence)); null in check mode
    before the key exists.
  returned: always
  type: str
fingerprint:
  description: The public key's OpenSSH C(SHA256:) fingerprint; null when RV(public_key) is.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing, hostfile


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", default=evidence_signing.DEFAULT_KEY_PATH)),
        supports_check_mode=True,
    )
    if not evidence_signing.HAS_CRYPTOGRAPHY:
        module.fail_json(msg=missing_required_lib("cryptography"))
    try:
        result = evidence_signing.ensure_key(module.params["path"], module.check_mode)
    except (evidence_signing.SigningError, hostfile.HostFileError) as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
