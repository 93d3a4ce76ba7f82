#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: storage_transition
short_description: Turn infra-approved whole disks from host-share use into raw slice disks
version_added: "0.1.0"
description:
  - Converts whole disks named by stable identity (a name directly inside one of
    O(stable_dirs), such as C(/dev/disk/by-id/nvme-eui.*)) from host-share use to
    slice-owned raw disks.
  - Inspects every device first and refuses, changing nothing for any device, when one is
    refused. Refused are the OS disk and anything backing C(/), C(/boot), C(/boot/efi),
    C(/usr), C(/var), C(/home) or swap (directly, through a partition or through a dm/md
    holder); partitions; stacked devices; LVM physical volumes, md members and disks
    held by dm/md; devices open by another process or whose filesystems are in use;
    kernel names and other non-stable paths; devices not on O(approved_devices);
    O(apply=true) without an O(approval) reference or without O(approved_devices); and
    fstab entries whose C(UUID=),
    C(LABEL=) or C(PARTUUID=) also names a device outside the disk (cloned UUIDs, reused
    labels), since disabling them could drop the host's own mounts.
  - Mounts are matched by major:minor from C(/proc/self/mountinfo), so a mounted child
    partition is found even when the parent disk itself is not mounted. Another
    filesystem mounted inside or over one of the disk's mounts is refused
    (C(nested_mount)); a mountpoint holding the disk's filesystem twice is unmounted twice.
  - A loop device backed by the disk or one of its partitions is refused (C(device_busy));
    the kernel holds it without any open file descriptor or exclusive claim.
  - Copies of those mounts in other mount namespaces (read from C(/proc/<pid>/mountinfo))
    are refused with C(other_namespace_mount) unless mount propagation carries the umount
    to them (a peer or slave copy); any other copy keeps the disk in use after the umount.
  - With O(apply=true) it backs up O(fstab_path), unmounts the child mounts, claims each
    disk exclusively (a disk still in use stops the run before fstab is rewritten),
    comments out their fstab entries with the C(gpuaas-slice-storage-disabled) marker
    (matched by device path, C(UUID=), C(LABEL=), C(PARTUUID=), C(PARTLABEL=) and the
    C(/dev/disk/by-*) forms), runs C(wipefs --all) on the children then the parent,
    re-reads the partition table, runs C(blkdiscard) (falling back to
    C(blkdiscard --zeroout) when discard is unsupported, and recording it), verifies that
    no signature and no partition is left, and writes a JSON manifest.
  - fstab is rewritten atomically (temporary file, fsync, rename); the backup is taken first.
  - A failure part-way stops the run, keeps the fstab backup, writes the manifest with
    C(status=failed) and the error, and the message says what was already done (unmounted
    mountpoints, whether fstab was rewritten, which devices had signatures wiped). fstab is
    rewritten only after every disk has been unmounted and claimed exclusively, so a disk
    still in use, or an fstab that cannot be replaced, leaves fstab unchanged and every
    disk unwiped.
  - Disks that are already raw (no partitions, no signatures, no mounts, no fstab entry)
    are left alone, so a second run changes nothing.
  - Given O(nonce), RV(devices) are signed with the node's evidence signing key
    (RV(attestation)); the control plane counts a raw slice disk only on a manifest the
    node signed for that run.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.attestation
  - gpuaas.fleet.stable_dirs
options:
  devices:
    description:
      - Whole disks to transition, by stable identity.
      - Kernel names such as C(/dev/nvme0n1) are refused; they change across reboots.
    type: list
    elements: str
    required: true
  approved_devices:
    description:
      - The infra-approved storage profile (approved whole disks, by stable identity). When
        given, every entry of O(devices) must be on it (compared as normalized stable
        paths).
      - Required when O(apply=true); applying without it is refused with
        C(approved_devices_required). Plan mode works without it.
    type: list
    elements: str
  approval:
    description:
      - Reference of the infra approval for this destructive change (ticket, change id).
      - Required when O(apply=true); recorded in the manifest.
    type: str
  apply:
    description:
      - V(false) plans only and changes nothing. V(true) performs the transition.
    type: bool
    default: false
  fstab_path:
    description: fstab file whose entries for the disks are disabled.
    type: path
    default: /etc/fstab
  manifest_dir:
    description: Directory for the JSON manifest C(slice-storage-transition-<UTC>.json).
    type: path
    default: /var/log/gpuaas
  discard:
    description:
      - Discard the whole disk after wiping signatures. When the device does not support
        discard, it is zeroed with C(blkdiscard --zeroout) instead and the manifest says so.
    type: bool
    default: true
attributes:
  check_mode:
    description: Reports exactly what O(apply=true) would do, and refuses what it would refuse.
    support: full
  diff_mode:
    description: Returns the fstab before and after.
    support: full
  platform:
    description: Linux hosts with util-linux (wipefs, blkdiscard, blkid, umount).
    support: full
    platforms: posix
notes:
  - "Refusal codes: C(not_stable_identity), C(not_found), C(not_block_device),
    C(partition_not_whole_disk), C(stacked_device), C(os_disk), C(system_mount), C(swap),
    C(nested_mount), C(other_namespace_mount), C(lvm_member), C(md_member), C(dm_holder),
    C(device_busy), C(read_only), C(duplicate_device), C(not_approved), C(approval_required),
    C(approved_devices_required), C(ambiguous_fstab_entry), C(inspection_failed),
    C(no_devices)."
"""

EXAMPLES = r"""
- name: Plan the transition of two approved slice disks (changes nothing)
  gpuaas.fleet.storage_transition:
    devices:
      - /dev/disk/by-id/nvme-eui.000000000000000100a075244a103331
      - /dev/disk/by-id/nvme-eui.000000000000000100a075244a10dcab
  register: storage_plan

- name: Apply it under an infra approval
  gpuaas.fleet.storage_transition:
    devices: "{{ slice_disks }}"
    approved_devices: "{{ infra_storage_profile.slice_disks }}"
    approval: INFRA-4711
    apply: true
  register: storage_transition
"""

RETURN = r"""
changed:
  description: Whether anything changed (in check mode, whether it would).
  returned: always
  type: bool
plan:
  description: Per device, the actions it would take (or took) in order.
  returned: always
  type: list
  elements: dict
  contains:
    device:
      description: The stable path as given.
      type: str
      returned: always
    resolved_path:
      description: Kernel device it resolves to now, for example C(/dev/nvme3n1).
      type: str
      returned: always
    actions:
      description: The planned steps, in order.
      type: list
      elements: dict
      returned: always
      contains:
        action:
          description: C(umount), C(disable_fstab_entry), C(wipefs), C(blkdiscard) or
            C(verify_raw).
          type: str
          returned: always
        target:
          description: Mountpoint, device path, or the original fstab line.
          type: str
          returned: always
        line:
          description: fstab line number (1-based).
          type: int
          returned: for disable_fstab_entry
devices:
  description: Per device results; empty when anything was refused.
  returned: always
  type: list
  elements: dict
  contains:
    device:
      description: The stable path as given.
      type: str
      returned: always
    resolved_path:
      description: Kernel device path at the time of the run.
      type: str
      returned: always
    kernel_name:
      description: Kernel name at the time of the run.
      type: str
      returned: always
    size_bytes:
      description: Device size.
      type: int
      returned: always
    status:
      description: C(planned), C(would_transition), C(transitioned), C(raw) or C(failed).
      type: str
      returned: always
    before:
      description: What the disk held before.
      type: dict
      returned: always
      contains:
        partitions:
          description: C(kernel_name), C(path), C(major_minor), C(number), C(size_bytes)
            and C(identities) (C(UUID), C(LABEL), C(TYPE), C(PARTUUID), C(PARTLABEL)) of
            each partition.
          type: list
          elements: dict
          returned: always
        signatures:
          description: C(device), C(offset), C(type), C(uuid) and C(label) of each
            signature C(wipefs -n) found on the disk and its partitions.
          type: list
          elements: dict
          returned: always
        mounts:
          description: C(device), C(major_minor), C(mountpoint), C(fstype) and C(source) of
            each mount of the disk or its partitions.
          type: list
          elements: dict
          returned: always
    fstab_entries:
      description: fstab lines naming the disk or its partitions.
      type: list
      elements: dict
      returned: always
      contains:
        line:
          description: Line number (1-based).
          type: int
          returned: always
        original:
          description: The line as it was.
          type: str
          returned: always
        spec:
          description: Its first field, for example C(UUID=...) or C(/dev/nvme0n1p1).
          type: str
          returned: always
        mountpoint:
          description: Its second field.
          type: str
          returned: always
        device:
          description: The disk or partition it names.
          type: str
          returned: always
        matched_by:
          description: C(UUID), C(LABEL), C(PARTUUID), C(PARTLABEL) or C(path).
          type: str
          returned: always
    actions:
      description: Planned actions (as in RV(plan[].actions)), or the actions performed.
      type: list
      elements: dict
      returned: always
      contains:
        action:
          description: C(umount), C(claim_exclusive), C(disable_fstab_entry), C(wipefs),
            C(reread_partition_table), C(blkdiscard), C(zeroout_fallback),
            C(discard_skipped) or C(verify_raw).
          type: str
          returned: always
        target:
          description: Mountpoint, device path, or the original fstab line.
          type: str
          returned: always
        ok:
          description: Whether the step succeeded.
          type: bool
          returned: when applied
        error:
          description: Why it failed (empty when ok).
          type: str
          returned: when applied
        command:
          description: The command (or ioctl) run.
          type: str
          returned: for steps that run a command
        seconds:
          description: Duration of the command.
          type: float
          returned: for steps that run a command
        line:
          description: fstab line number.
          type: int
          returned: for disable_fstab_entry
        matched_by:
          description: How the fstab line named the device.
          type: str
          returned: for disable_fstab_entry when applied
        reason:
          description: Why discard was skipped, or the discard error a zeroing fallback
            followed.
          type: str
          returned: for discard_skipped and zeroout_fallback
    discard:
      description: How the disk was cleared after wipefs.
      type: dict
      returned: when applied
      contains:
        status:
          description: C(discarded), C(zeroed) (discard unsupported, zeroed instead),
            C(skipped) (O(discard=false)) or C(not_needed) (nothing to wipe).
          type: str
          returned: always
        discard_error:
          description: The C(blkdiscard) error that led to zeroing.
          type: str
          returned: when status is zeroed
    after:
      description: What the disk holds after the transition.
      type: dict
      returned: when applied
      contains:
        signatures:
          description: Signatures left (empty when raw).
          type: list
          elements: dict
          returned: always
        partitions:
          description: Partition kernel names left (empty when raw).
          type: list
          elements: str
          returned: always
        raw:
          description: True when no signature and no partition is left.
          type: bool
          returned: always
refused:
  description: Why the run was refused; any entry means nothing changed for any device.
  returned: always
  type: list
  elements: dict
  contains:
    device:
      description: The device as given (empty for a request-wide reason).
      type: str
      returned: always
    code:
      description: Machine-readable reason (see notes).
      type: str
      returned: always
    message:
      description: Human-readable detail.
      type: str
      returned: always
manifest_path:
  description: Path of the JSON manifest written; null when nothing was applied.
  returned: always
  type: str
manifest:
  description: The manifest written; null when nothing was applied.
  returned: always
  type: dict
  contains:
    schema:
      description: Always C(gpuaas.storage_transition/v1).
      type: str
      returned: when applied
    status:
      description: C(completed) or C(failed).
      type: str
      returned: when applied
    error:
      description: Why the run stopped; null when completed.
      type: str
      returned: when applied
    approval:
      description: The O(approval) reference.
      type: str
      returned: when applied
    host:
      description: Host name.
      type: str
      returned: when applied
    started_at:
      description: UTC start, ISO 8601 with Z.
      type: str
      returned: when applied
    finished_at:
      description: UTC end, ISO 8601 with Z.
      type: str
      returned: when applied
    fstab_path:
      description: The O(fstab_path).
      type: str
      returned: when applied
    fstab_backup:
      description: The fstab backup; null when no fstab line named the disks.
      type: str
      returned: when applied
    fstab_rewritten:
      description: Whether fstab was rewritten with disabled entries.
      type: bool
      returned: when applied
    marker:
      description: The marker of disabled fstab lines, C(gpuaas-slice-storage-disabled).
      type: str
      returned: when applied
    discard_requested:
      description: The O(discard) option.
      type: bool
      returned: when applied
    devices:
      description: Every device's result, as in RV(devices).
      type: list
      elements: dict
      returned: when applied
fstab_backup:
  description: Path of the fstab backup; null when fstab was not changed.
  returned: always
  type: str
msg:
  description: Summary; after a part-way failure, what had been done before it.
  returned: always
  type: str
attestation:
  description:
    - The node's signature over RV(devices) (an object with the single key C(devices)) for
      the control plane's nonce - C(statement), C(signature), C(key_fingerprint)
      (docs/trust.md).
  returned: when O(nonce) was given and the signing key could be used
  type: dict
attestation_error:
  description: Why the manifest could not be signed.
  returned: when O(nonce) was given and signing failed
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import common_args, evidence_signing
from ansible_collections.gpuaas.fleet.plugins.module_utils.storage_transition import (
    TransitionRequest,
    run_transition,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            devices=dict(type="list", elements="str", required=True),
            stable_dirs=common_args.stable_dirs_spec(),
            approved_devices=dict(type="list", elements="str"),
            approval=dict(type="str"),
            apply=dict(type="bool", default=False),
            fstab_path=dict(type="path", default="/etc/fstab"),
            manifest_dir=dict(type="path", default="/var/log/gpuaas"),
            discard=dict(type="bool", default=True),
            **common_args.attestation_spec(),
        ),
        required_by=common_args.ATTESTATION_REQUIRED_BY,
        supports_check_mode=True,
    )
    signing = {key: module.params.pop(key) for key in common_args.attestation_spec()}
    params = dict(module.params, check_mode=module.check_mode)
    result = run_transition(TransitionRequest(**params))
    result.update(evidence_signing.attest_field(signing, "storage_manifest", result, "devices"))
    if not module._diff:
        result.pop("diff", None)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
