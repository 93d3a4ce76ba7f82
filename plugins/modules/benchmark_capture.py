#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: benchmark_capture
short_description: Capture the fixed benchmark probe set of a bare-metal node or a slice VM
version_added: "0.1.0"
description:
  - Runs one fixed probe set, with the same commands and options on every host, so a
    bare-metal node's document and a slice VM's compare metric by metric
    (C(gpuaas bench compare)).
  - "Probes: CPU (sysbench cpu, one thread), memory read and write bandwidth (sysbench
    memory), storage random 4 KiB read IOPS and sequential 1 MiB read bandwidth (fio with
    C(--readonly), only on O(storage_target) when it is in O(approved_storage_targets)),
    network throughput to and from O(network_peer) (iperf3, then its reverse mode), RDMA
    write bandwidth (ib_write_bw, with O(rdma_peer) and O(rdma_device)), the GPUs
    nvidia-smi lists and DCGM's quick diagnostic."
  - Each probe reports its value and unit, the exact command and the tool's version, or
    C(skipped) with the reason (tool or device absent, no peer, target not approved), or
    C(failed) with the tool's error. Nothing is written to any disk.
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  label:
    description: The host's name in the document (default the host's node name).
    type: str
  kind:
    description: What the host is.
    type: str
    choices: [baremetal, slice-vm]
    required: true
  profile:
    description: The named tuning profile the host runs (for example C(hugepages-on)).
    type: str
  storage_target:
    description: Block device or file the storage probes read.
    type: path
  approved_storage_targets:
    description: The targets an operator approved for read benchmarks.
    type: list
    elements: path
    default: []
  network_peer:
    description: Address of an iperf3 server.
    type: str
  network_port:
    description: Port of the iperf3 server.
    type: int
    default: 5201
  rdma_peer:
    description: Address of an ib_write_bw server.
    type: str
  rdma_device:
    description: RDMA device, for example C(mlx5_0).
    type: str
attributes:
  check_mode:
    description: The probes only measure; check mode runs them as well.
    support: full
  diff_mode:
    description: Nothing changes.
    support: none
"""

EXAMPLES = r"""
- name: Capture a bare-metal node
  gpuaas.fleet.benchmark_capture:
    kind: baremetal
    storage_target: /dev/disk/by-id/nvme-eui.0025388b9133a1b2
    approved_storage_targets: [/dev/disk/by-id/nvme-eui.0025388b9133a1b2]
    network_peer: 10.0.0.10
  register: baseline
"""

RETURN = r"""
benchmark:
  description: The C(gpuaas.benchmark/v1) document (schema, harness_version, host, kind,
    profile, captured_at, seconds, host_facts, and probes, each with name, unit,
    higher_is_better, status, value, command, tool, tool_version and reason).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import benchmark


def main():
    module = AnsibleModule(
        argument_spec=dict(
            label=dict(type="str"),
            kind=dict(type="str", choices=["baremetal", "slice-vm"], required=True),
            profile=dict(type="str"),
            storage_target=dict(type="path"),
            approved_storage_targets=dict(type="list", elements="path", default=[]),
            network_peer=dict(type="str"),
            network_port=dict(type="int", default=5201),
            rdma_peer=dict(type="str"),
            rdma_device=dict(type="str"),
        ),
        supports_check_mode=True,
    )
    document = benchmark.capture(module.params, module.run_command, module.get_bin_path)
    module.exit_json(changed=False, benchmark=document)


if __name__ == "__main__":
    main()
