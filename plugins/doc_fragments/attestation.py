# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The options of the modules whose results the control plane only believes signed
    # (module_utils/common_args.py, module_utils/evidence_signing.py, docs/trust.md).
    DOCUMENTATION = r"""
options:
  nonce:
    description:
      - The control plane's nonce for this run (its node task id). When given, the result
        carries an C(attestation) signed with O(signing_key) over the node, the nonce, the
        time and the digest of what the control plane acts on; without a usable key it
        carries C(attestation_error) instead, and the control plane does not believe it.
    type: str
  node:
    description: The node's name in the control plane, bound into the attestation.
      Required with O(nonce).
    type: str
  signing_key:
    description: The node's evidence signing key (see M(gpuaas.fleet.node_signing_key)).
    type: path
    default: /etc/gpuaas/evidence-signing.key
"""
