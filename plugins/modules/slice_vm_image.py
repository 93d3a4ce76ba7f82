#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: slice_vm_image
short_description: Verify a cached slice image and clone it onto the slot's raw disk
version_added: "0.1.0"
description:
  - Verifies the cached image's sha256 against the catalog digest, re-checks the target
    disk (stable identity resolving to a whole block device, nothing mounted on it or its
    partitions, no holders or users, no libvirt domain using it, raw), then clones the
    image with C(qemu-img convert -O raw) onto it and returns progress samples, timing and
    throughput.
  - Writes a clone record into O(state_dir); a second run for the same allocation, disk
    and digest changes nothing. It refuses to clone when the allocation's domain already
    exists without a record, so a tenant disk is never overwritten.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.stable_dirs
  - gpuaas.fleet.libvirt
options:
  allocation_id:
    description: Allocation UUID (names the domain that must not exist yet).
    type: str
    required: true
  image:
    description: Image file in the node image cache (raw or qcow2).
    type: path
    required: true
  sha256:
    description: Catalog digest of the image.
    type: str
    required: true
  device:
    description: Target raw disk by stable identity (the allocation's first slot disk).
    type: str
    required: true
  state_dir:
    description: The allocation's state directory, where the clone record is kept.
    type: path
    required: true
  verify_digest:
    description: Hash the image before cloning.
    type: bool
    default: true
  verified:
    description:
      - An earlier verification of the same image in this provision, as
        M(gpuaas.fleet.slice_vm_preflight) returns it (the C(digest) of its C(image) check).
        When it matched O(sha256) and the file is still the one that was hashed (same device,
        inode, size, modification and change time), the image is not hashed again; otherwise
        it is.
    type: dict
  timeout:
    description: Seconds the clone may take.
    type: int
    default: 3600
attributes:
  check_mode:
    description: Verifies and inspects, reports the command it would run, writes nothing.
    support: full
  diff_mode:
    description: The clone is reported in C(record), not as a diff.
    support: none
  platform:
    description: Linux hosts with qemu-utils and libvirt.
    support: full
    platforms: posix
requirements:
  - libvirt-python
  - lxml
"""

EXAMPLES = r"""
- name: Clone the slice image onto the boot disk
  gpuaas.fleet.slice_vm_image:
    allocation_id: 158ea147-0115-407f-bbd5-1850c32b9517
    image: /var/lib/gpuaas/slice-images/ubuntu-24.04-h200-cuda.raw
    sha256: "{{ image_sha256 }}"
    device: /dev/disk/by-id/nvme-eui.000000000000000100a075244a103331
    state_dir: /var/lib/gpuaas/slices/gpuaas-slice-158ea1470115407fbbd51850c32b9517
"""

RETURN = r"""
changed:
  description: Whether the image was (or in check mode would be) written to the disk.
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
skipped_reason:
  description: Why nothing was done, when the clone record already matches.
  returned: when the clone already happened
  type: str
plan:
  description: The qemu-img command, image format/virtual size and device size.
  returned: when a clone is due
  type: dict
digest:
  description:
    - Digest verification (path, expected, actual, seconds, the file's identity when it was
      hashed), with C(reused=true) when it is O(verified)'s for the unchanged file.
  returned: when a clone is due and O(verify_digest) is true
  type: dict
record:
  description:
    - Clone record (device, resolved device, image digest, bytes, seconds, throughput in
      MiB/s, progress samples, finish time).
  returned: when cloned or already cloned
  type: dict
disk:
  description: The disk inspection (resolved path, size, raw, problems).
  returned: when a clone is due
  type: dict
failure:
  description: Phase C(image), code and message of a refusal or failure.
  returned: failure
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible_collections.gpuaas.fleet.plugins.module_utils import (
    common_args,
    vm_common,
    vm_domain,
    vm_image,
    vm_libvirt,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            allocation_id=dict(type="str", required=True),
            image=dict(type="path", required=True),
            sha256=dict(type="str", required=True),
            device=dict(type="str", required=True),
            stable_dirs=common_args.stable_dirs_spec(),
            state_dir=dict(type="path", required=True),
            verify_digest=dict(type="bool", default=True),
            verified=dict(type="dict"),
            timeout=dict(type="int", default=3600),
            libvirt_uri=common_args.libvirt_uri_spec(),
        ),
        supports_check_mode=True,
    )
    vm_common.fail_missing_libraries(
        module,
        missing_required_lib,
        **{"libvirt-python": vm_libvirt.LIBVIRT_IMPORT_ERROR, "lxml": vm_domain.LXML_IMPORT_ERROR},
    )
    vm_common.run_module(module, vm_image.run)


if __name__ == "__main__":
    main()
