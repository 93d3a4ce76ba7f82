#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: kernel_cmdline
short_description: Stage the IOMMU (and opt-in hugepage) kernel arguments of a slice host in GRUB
version_added: "0.1.0"
description:
  - Edits C(GRUB_CMDLINE_LINUX) in C(/etc/default/grub) argument by argument, keeping every
    other argument. Intel hosts get C(intel_iommu=on iommu=pt), AMD hosts
    C(amd_iommu=on iommu=pt); the other vendor's switch is removed. The vendor comes from
    C(/proc/cpuinfo) unless O(cpu_vendor) says otherwise.
  - With O(hugepages_1g) greater than zero, C(default_hugepagesz=1G hugepagesz=1G
    hugepages=N) are staged as well (opt-in; nothing is removed when it is zero).
  - Takes a timestamped backup before changing the file and regenerates the GRUB
    configuration (C(update-grub), else C(grub-mkconfig)) when the file changed or the
    generated C(grub.cfg) lacks the arguments.
  - Never reboots. RV(reboot_required) is true while any wanted argument is missing from
    the running C(/proc/cmdline).
author:
  - gpuaas fleet engineering (@gpuaas)
options:
  cpu_vendor:
    description: V(auto) reads C(vendor_id) from C(/proc/cpuinfo).
    type: str
    default: auto
    choices: [auto, intel, amd]
  hugepages_1g:
    description: Number of 1 GiB hugepages to reserve at boot (0 leaves hugepages alone).
    type: int
    default: 0
  extra_args:
    description: Further arguments to stage (no whitespace or shell quoting characters).
    type: list
    elements: str
    default: []
  path:
    description: The GRUB defaults file.
    type: path
    default: /etc/default/grub
  variable:
    description: The variable to edit.
    type: str
    default: GRUB_CMDLINE_LINUX
    choices: [GRUB_CMDLINE_LINUX, GRUB_CMDLINE_LINUX_DEFAULT]
  create:
    description: Create O(path) when it does not exist (otherwise report and change nothing).
    type: bool
    default: false
  backup:
    description: Copy the file to C(<path>.gpuaas-backup-<timestamp>) before changing it.
    type: bool
    default: true
  update_bootloader:
    description: Regenerate the GRUB configuration when needed (live root only).
    type: bool
    default: true
  grub_cfg:
    description: Generated GRUB configuration checked for the arguments.
    type: path
    default: /boot/grub/grub.cfg
  root:
    description:
      - Filesystem root the paths, C(/proc/cpuinfo) and C(/proc/cmdline) are read under
        (a recorded host tree in tests). The bootloader is regenerated only for C(/).
    type: path
    default: /
attributes:
  check_mode:
    description: Reports the new arguments and the diff without writing.
    support: full
  diff_mode:
    description: The GRUB defaults file before and after.
    support: full
  platform:
    description: Linux hosts booting with GRUB.
    support: full
    platforms: posix
"""

EXAMPLES = r"""
- name: Stage IOMMU arguments for this CPU vendor
  gpuaas.fleet.kernel_cmdline:
  register: cmdline

- name: Stage them with 512 x 1 GiB hugepages on an AMD host
  gpuaas.fleet.kernel_cmdline:
    cpu_vendor: amd
    hugepages_1g: 512
"""

RETURN = r"""
cpu_vendor:
  description: The vendor the arguments were chosen for.
  returned: always
  type: str
  sample: intel
path:
  description: The GRUB defaults file.
  returned: always
  type: str
config_present:
  description: Whether the file exists (nothing is staged when it does not and O(create) is false).
  returned: always
  type: bool
wanted_args:
  description: The arguments this host needs.
  returned: always
  type: list
  elements: str
before_args:
  description: The variable's arguments before.
  returned: always
  type: list
  elements: str
after_args:
  description: The variable's arguments after.
  returned: always
  type: list
  elements: str
running_missing:
  description: Wanted arguments the running kernel was not booted with.
  returned: always
  type: list
  elements: str
reboot_required:
  description: Whether a reboot is needed for the arguments to take effect.
  returned: always
  type: bool
backup_file:
  description: The backup taken before the change, null when none was taken.
  returned: always
  type: str
bootloader_command:
  description: The command that regenerates the GRUB configuration, null when not run.
  returned: always
  type: list
  elements: str
bootloader_updated:
  description: Whether the GRUB configuration was regenerated.
  returned: always
  type: bool
bootloader_note:
  description: Why the GRUB configuration could not be regenerated.
  returned: when no update command exists
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile, kernel_cmdline
from ansible_collections.gpuaas.fleet.plugins.module_utils.commands import module_runner


def main():
    module = AnsibleModule(
        argument_spec=dict(
            cpu_vendor=dict(type="str", default="auto", choices=["auto", "intel", "amd"]),
            hugepages_1g=dict(type="int", default=0),
            extra_args=dict(type="list", elements="str", default=[]),
            path=dict(type="path", default="/etc/default/grub"),
            variable=dict(
                type="str",
                default="GRUB_CMDLINE_LINUX",
                choices=list(kernel_cmdline.GRUB_VARIABLES),
            ),
            create=dict(type="bool", default=False),
            backup=dict(type="bool", default=True),
            update_bootloader=dict(type="bool", default=True),
            grub_cfg=dict(type="path", default="/boot/grub/grub.cfg"),
            root=dict(type="path", default="/"),
        ),
        supports_check_mode=True,
    )

    runner = module_runner(module)
    try:
        result = kernel_cmdline.run(module.params, module.check_mode, runner)
    except (kernel_cmdline.KernelCmdlineError, hostfile.HostFileError) as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff", None)
    if result.get("bootloader_note"):
        module.warn(result["bootloader_note"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
