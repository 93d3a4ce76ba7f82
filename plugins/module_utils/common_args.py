# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs several modules share, documented once in plugins/doc_fragments/."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.gpuaas.fleet.plugins.module_utils import evidence_signing
from ansible_collections.gpuaas.fleet.plugins.module_utils.blockdev import DEFAULT_STABLE_DIRS
from ansible_collections.gpuaas.fleet.plugins.module_utils.topology import NETWORK_MODES
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import DEFAULT_LIBVIRT_URI


def libvirt_uri_spec():
    return dict(type="str", default=DEFAULT_LIBVIRT_URI)


def attestation_spec():
    """nonce, node and signing_key: documented in doc_fragments/attestation.py; modules
    pass ``required_by=ATTESTATION_REQUIRED_BY``."""
    return dict(
        node=dict(type="str"),
        nonce=dict(type="str"),
        signing_key=dict(type="path", default=evidence_signing.DEFAULT_KEY_PATH),
    )


ATTESTATION_REQUIRED_BY = dict(nonce="node")


def stable_dirs_spec():
    return dict(type="list", elements="path", default=list(DEFAULT_STABLE_DIRS))


def topology_discovery_spec():
    """The discovery inputs slice_topology takes beside those parity shares (root, bridge,
    slice_subnet, tmfifo_interface): slice_topology's options, and the suboptions of
    slice_parity's ``discover``."""
    return dict(
        node=dict(type="str"),
        network_mode=dict(type="str", default="private-nat", choices=list(NETWORK_MODES)),
        collect_network=dict(type="bool", default=True),
        fabric_link_layer=dict(
            type="str", default="InfiniBand", choices=["InfiniBand", "Ethernet"]
        ),
    )
