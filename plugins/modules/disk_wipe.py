#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: disk_wipe
short_description: Erase one tenant disk and return a verified wipe proof
version_added: "0.1.0"
description:
  - Erases the whole disk named by stable identity O(device) and returns a
    C(gpuaas.wipe_proof/v1) proof. The control plane returns a slot to C(available) only
    with a proof for that slot's disk that has C(verified=true).
  - Refuses, writing nothing, when the disk or any child partition is mounted, when it
    backs the OS (C(/), C(/boot), C(/boot/efi), C(/usr), C(/var), C(/home)) or swap, is held
    by dm/md, is open by another process (a VM still running, for example), is read-only,
    is a partition, or is not a stable identity. LVM and md signatures are tenant content
    and are erased.
  - Holds an exclusive (C(O_EXCL)) claim on the disk from the first write to the end of
    verification, so nothing can mount or claim it meanwhile.
  - Writes a marker at the start, middle and end, then erases with C(nvme format),
    C(blkdiscard), write-zeroes (C(blkdiscard --zeroout)) or full zeroing, in that order
    from O(method) on. A method that fails, or exits 0 but does not verify, falls back to
    the next; its entry in RV(proof.attempts) says why and the message names it.
  - For C(nvme format) the secure erase setting comes from C(nvme id-ctrl) - cryptographic
    erase when its FNA field says it is supported, else user data erase - and the method is
    skipped when the erase would reach other namespaces of the controller.
  - Verified means every marker is gone, C(wipefs -n) finds no signature, no partition is
    left, and every sampled region reads back zero (direct I/O, bypassing caches).
  - A verified proof is stored in O(proof_dir). Rerunning with the same O(approval) on a
    disk that was not written since (same diskseq and write counter) and still reads clean
    returns that proof with C(changed=false) instead of erasing again.
author:
  - gpuaas fleet engineering (@gpuaas)
extends_documentation_fragment:
  - gpuaas.fleet.attestation
  - gpuaas.fleet.stable_dirs
options:
  device:
    description: The whole disk, by stable identity (for example C(/dev/disk/by-id/nvme-eui.*)).
    type: str
    required: true
  method:
    description:
      - V(auto) tries C(nvme_format), C(blkdiscard), C(write_zeroes), C(zero) in order.
      - Any other value starts the chain at that method.
    type: str
    default: auto
    choices: [auto, nvme_format, blkdiscard, write_zeroes, zero]
  allow_fallback:
    description: When false, only the chosen O(method) is tried.
    type: bool
    default: true
  approval:
    description:
      - Reference authorizing this erase (release task, ticket). Required unless in check
        mode; recorded in the proof.
    type: str
  sample_count:
    description: Regions read back after the erase (first, last, each marker, then random).
    type: int
    default: 16
  sample_size:
    description: Bytes per sampled region.
    type: int
    default: 1048576
  proof_dir:
    description: Where the last verified proof per disk is kept on the host.
    type: path
    default: /var/lib/gpuaas/wipe-proofs
attributes:
  check_mode:
    description: Inspects, refuses or reports the methods it would try; writes nothing.
    support: full
  diff_mode:
    description:
      - C(before) is the signatures and partitions the inspection found; C(after) is probed
        afresh from the disk once the wipe ended, verified or not. In check mode C(after)
        is what a verified wipe leaves (nothing). No diff when a stored proof is reused.
    support: full
  platform:
    description: Linux hosts with util-linux; nvme-cli for NVMe format.
    support: full
    platforms: posix
notes:
  - "Refusal codes: C(not_stable_identity), C(not_found), C(not_block_device),
    C(partition_not_whole_disk), C(stacked_device), C(os_disk), C(system_mount), C(swap),
    C(mounted), C(child_mounted), C(nested_mount), C(other_namespace_mount) (mounted in
    another mount namespace), C(md_member) (active array),
    C(dm_holder), C(device_busy), C(read_only), C(approval_required)."
"""

EXAMPLES = r"""
- name: Wipe a released slot's disk and keep the proof
  gpuaas.fleet.disk_wipe:
    device: /dev/disk/by-id/nvme-eui.000000000000000100a075244a103331
    approval: "release-{{ allocation_id }}-slot-0"
  register: wipe

- name: Force full zeroing only
  gpuaas.fleet.disk_wipe:
    device: /dev/disk/by-id/nvme-eui.000000000000000100a075244a103331
    method: zero
    allow_fallback: false
    approval: INFRA-4712
"""

RETURN = r"""
changed:
  description: Whether the disk was written (markers and erase); false for a reused proof.
  returned: always
  type: bool
proof:
  description: The C(gpuaas.wipe_proof/v1) record; null when refused or in check mode.
  returned: always
  type: dict
  contains:
    schema:
      description: Always C(gpuaas.wipe_proof/v1).
      type: str
      returned: always
    device:
      description: The stable path as given.
      type: str
      returned: always
    resolved_path:
      description: Kernel device it resolved to.
      type: str
      returned: always
    kernel_name:
      description: Kernel name at the time of the wipe.
      type: str
      returned: always
    size_bytes:
      description: Device size.
      type: int
      returned: always
    host:
      description: Host name.
      type: str
      returned: always
    method:
      description: Method that erased and verified; null if none did.
      type: str
      returned: always
    requested_method:
      description: The O(method) option.
      type: str
      returned: always
    attempts:
      description: One entry per method tried, in order.
      type: list
      elements: dict
      returned: always
      contains:
        method:
          description: C(nvme_format), C(blkdiscard), C(write_zeroes) or C(zero).
          type: str
          returned: always
        ok:
          description: True only for the method whose erase verified.
          type: bool
          returned: always
        error:
          description: Why it failed, was not applicable, or did not verify (then it starts
            with C(verification failed)); empty when ok.
          type: str
          returned: always
        command:
          description: The erase command; null when the method was not applicable.
          type: str
          returned: always
        seconds:
          description: Duration of the erase command.
          type: float
          returned: always
        verify_seconds:
          description: Duration of the verification after it.
          type: float
          returned: when the erase command succeeded
        reread_partitions_error:
          description: Why re-reading the partition table after the erase failed.
          type: str
          returned: when that failed
        secure_erase:
          description: C(ses) (1 user data erase, 2 cryptographic erase), C(lbaf) and
            C(why), as chosen from C(nvme id-ctrl) and C(nvme id-ns).
          type: dict
          returned: for an nvme_format attempt that ran C(nvme format)
    commands:
      description: Every command and ioctl issued, in order (C(nvme id-ctrl), C(nvme id-ns)
        and C(nvme format) included).
      type: list
      elements: str
      returned: always
    started_at:
      description: UTC start, ISO 8601 with Z.
      type: str
      returned: always
    finished_at:
      description: UTC end, ISO 8601 with Z.
      type: str
      returned: always
    duration_s:
      description: Wall time in seconds.
      type: float
      returned: always
    markers:
      description: The start, middle and end markers.
      type: list
      elements: dict
      returned: always
      contains:
        offset:
          description: Byte offset.
          type: int
          returned: always
        written:
          description: The marker read back after writing it.
          type: bool
          returned: always
        gone:
          description: The marker no longer reads back after the erase.
          type: bool
          returned: when verification ran
    samples:
      description: Regions read back after the erase (direct I/O).
      type: list
      elements: dict
      returned: always
      contains:
        offset:
          description: Byte offset.
          type: int
          returned: always
        length:
          description: Bytes read.
          type: int
          returned: always
        all_zero:
          description: Every byte read was zero.
          type: bool
          returned: always
    signatures_before:
      description: C(device), C(offset), C(type), C(uuid), C(label) of each signature
        found before the erase.
      type: list
      elements: dict
      returned: always
    signatures_after:
      description: Signatures found after the erase, same keys (empty when verified).
      type: list
      elements: dict
      returned: always
    partitions_after:
      description: Partitions the kernel still knows after the erase (empty when verified).
      type: list
      elements: str
      returned: always
    verified:
      description: True only when every check passed.
      type: bool
      returned: always
    approval:
      description: The O(approval) reference.
      type: str
      returned: always
    attestation:
      description: The node's signature over this proof for the control plane's nonce.
      type: dict
      returned: when O(nonce) was given and the signing key could be used
      contains:
        statement:
          description: What was signed (its canonical JSON form) - C(schema)
            (C(gpuaas.attestation/v1)), C(subject) (C(wipe_proof)), C(node), C(nonce),
            C(disk) (C(serial), C(model), C(wwid), C(eui), C(nguid) as the kernel reports
            them), C(signed_at) and C(payload_sha256), the digest of the proof's canonical
            form without its attestation.
          type: dict
          returned: always
        signature:
          description: Ed25519 signature of the statement, base64.
          type: str
          returned: always
        key_fingerprint:
          description: C(SHA256:) fingerprint of the signing key's public half.
          type: str
          returned: always
    attestation_error:
      description: Why the proof could not be signed (no key, no cryptography library).
      type: str
      returned: when O(nonce) was given and signing failed
    write_state:
      description: Where the disk's write history stood after verification.
      type: dict
      returned: always
      contains:
        diskseq:
          description: The kernel's disk sequence number (changes when re-attached).
          type: str
          returned: always
        sectors_written:
          description: Sectors written since the disk appeared (from its stat file).
          type: int
          returned: always
    error:
      description: Why the wipe stopped, when it did.
      type: str
      returned: on error
plan:
  description: What the wipe does, in order.
  returned: unless refused
  type: list
  elements: dict
  contains:
    action:
      description: C(write_markers), C(erase) or C(verify).
      type: str
      returned: always
    offsets:
      description: Marker offsets.
      type: list
      elements: int
      returned: for write_markers
    methods:
      description: The method chain, in the order tried.
      type: list
      elements: str
      returned: for erase
    sample_count:
      description: Regions read back.
      type: int
      returned: for verify
    sample_size:
      description: Bytes per region.
      type: int
      returned: for verify
refused:
  description: Reasons the wipe was refused (nothing was written).
  returned: always
  type: list
  elements: dict
  contains:
    device:
      description: The device as given.
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
inspection:
  description: The live inspection of the disk before anything was written.
  returned: when the method option is valid
  type: dict
  contains:
    requested_path:
      description: The path as given.
      type: str
      returned: always
    resolved_path:
      description: Where it resolves now.
      type: str
      returned: always
    kernel_name:
      description: Kernel name.
      type: str
      returned: always
    major_minor:
      description: Device number.
      type: str
      returned: always
    whole_disk:
      description: Not a partition.
      type: bool
      returned: always
    size_bytes:
      description: Size.
      type: int
      returned: always
    read_only:
      description: The kernel marks it read-only.
      type: bool
      returned: always
    identities:
      description: C(UUID), C(LABEL), C(TYPE) of the whole disk as probed.
      type: dict
      returned: always
    partitions:
      description: Partitions, as in the storage_transition module's C(before.partitions).
      type: list
      elements: dict
      returned: always
    mounts:
      description: C(device), C(major_minor), C(mountpoint), C(fstype), C(source) of each
        mount of the disk, its partitions or holders in this mount namespace.
      type: list
      elements: dict
      returned: always
    namespace_mounts:
      description: Mounts in other mount namespaces (C(device), C(mountpoint),
        C(namespace), C(pid), C(command), C(reached_by_umount)).
      type: list
      elements: dict
      returned: always
    swaps:
      description: Active swap areas on it.
      type: list
      elements: str
      returned: always
    holders:
      description: dm/md devices stacked on it (C(name), C(kind), C(held), C(dm_uuid)).
      type: list
      elements: dict
      returned: always
    signatures:
      description: Signatures on the disk and its partitions.
      type: list
      elements: dict
      returned: always
    users:
      description: What uses it (C(pid), C(command), C(how), C(target)); C(how) is
        C(device_open), C(file_open), C(cwd), C(root), C(exe), C(mmap) or
        C(loop_backing).
      type: list
      elements: dict
      returned: always
    exclusive_open_busy:
      description: The kernel refused an exclusive open.
      type: bool
      returned: always
    findings:
      description: C(code), C(message), C(kind) (C(identity), C(usage), C(content)) and
        C(path) of each finding.
      type: list
      elements: dict
      returned: always
    verdict:
      description: C(ok) or C(refuse) (any finding; the wipe tolerates content findings).
      type: str
      returned: always
    codes:
      description: The finding codes, sorted.
      type: list
      elements: str
      returned: always
    raw:
      description: No partitions, signatures or mounts.
      type: bool
      returned: always
reused_proof:
  description: True when a stored proof for this approval was returned without erasing.
  returned: when a proof was reused
  type: bool
msg:
  description: Summary; names every method that failed or did not verify before the one
    that did.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import common_args
from ansible_collections.gpuaas.fleet.plugins.module_utils.disk_wipe import (
    WipeRequest,
    run_wipe,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            device=dict(type="str", required=True),
            stable_dirs=common_args.stable_dirs_spec(),
            method=dict(
                type="str",
                default="auto",
                choices=["auto", "nvme_format", "blkdiscard", "write_zeroes", "zero"],
            ),
            allow_fallback=dict(type="bool", default=True),
            approval=dict(type="str"),
            sample_count=dict(type="int", default=16),
            sample_size=dict(type="int", default=1048576),
            proof_dir=dict(type="path", default="/var/lib/gpuaas/wipe-proofs"),
            **common_args.attestation_spec(),
        ),
        required_by=common_args.ATTESTATION_REQUIRED_BY,
        supports_check_mode=True,
    )
    if module.params["sample_count"] < 1 or module.params["sample_size"] < 4096:
        module.fail_json(msg="sample_count must be >= 1 and sample_size >= 4096")
    if module.params["sample_size"] % 4096:
        module.fail_json(msg="sample_size must be a multiple of 4096 (direct I/O)")
    result = run_wipe(WipeRequest(**dict(module.params, check_mode=module.check_mode)))
    if not module._diff:
        result.pop("diff", None)
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
