# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel arguments a slice host needs, staged in /etc/default/grub, and whether to reboot.

Staging `intel_iommu=on iommu=pt` by rewriting GRUB_CMDLINE_LINUX wholesale drops every
other argument (docs/slice-host.md, "Kernel command line"). Here the variable is edited
argument by argument:

- the CPU vendor (from /proc/cpuinfo, or given) picks `intel_iommu=on` or `amd_iommu=on`,
  plus `iommu=pt`; the other vendor's switch is removed, other arguments are kept in order;
- opt-in 1 GiB hugepages add `default_hugepagesz=1G hugepagesz=1G hugepages=N` (a
  `hugepagesz=1G` already followed by `hugepages=M` gets the new count);
- keys that take one value (`iommu`, `intel_iommu`, `amd_iommu`, `default_hugepagesz`) are
  replaced where they stand, never duplicated.

A reboot is required while any wanted argument is missing from the running /proc/cmdline;
GRUB changes never take effect without one. The GRUB configuration is regenerated
(`update-grub`, else `grub-mkconfig`) when the file changed or when the generated
grub.cfg lacks the arguments, on the live root only.
"""

from __future__ import absolute_import, annotations, division, print_function

__metaclass__ = type

import re
import shlex
import shutil

from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile
from ansible_collections.gpuaas.fleet.plugins.module_utils.sysfs import HostRoot

VENDORS = ("intel", "amd")
CPU_VENDOR_IDS = {"GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "amd"}
VENDOR_IOMMU = {"intel": "intel_iommu=on", "amd": "amd_iommu=on"}
PASSTHROUGH = "iommu=pt"
SINGLE_VALUE_KEYS = ("iommu", "intel_iommu", "amd_iommu", "default_hugepagesz")
HUGEPAGE_SIZE = "hugepagesz=1G"
GRUB_VARIABLES = ("GRUB_CMDLINE_LINUX", "GRUB_CMDLINE_LINUX_DEFAULT")
UPDATE_COMMANDS = (
    ("update-grub",),
    ("grub-mkconfig", "-o", "/boot/grub/grub.cfg"),
    ("grub2-mkconfig", "-o", "/boot/grub2/grub.cfg"),
)
ASSIGNMENT = re.compile(r"^(\s*)(export\s+)?([A-Z_]+)=(.*)$")


class KernelCmdlineError(ValueError):
    """Bad input or an unreadable configuration; nothing was written."""


def cpu_vendor(host):
    """'intel' or 'amd' from /proc/cpuinfo's vendor_id, None when unknown."""
    for line in (host.read("/proc/cpuinfo") or "").splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "vendor_id":
            return CPU_VENDOR_IDS.get(value.strip())
    return None


def wanted_groups(vendor, hugepages_1g=0, extra_args=()):
    """Argument groups to stage, in order; a group is kept together (hugepage size+count)."""
    if vendor not in VENDORS:
        raise KernelCmdlineError(f"cpu vendor must be one of {', '.join(VENDORS)}, not {vendor!r}")
    if hugepages_1g < 0:
        raise KernelCmdlineError(f"hugepages_1g must not be negative, got {hugepages_1g}")
    groups = [(VENDOR_IOMMU[vendor],), (PASSTHROUGH,)]
    if hugepages_1g:
        groups += [("default_hugepagesz=1G",), (HUGEPAGE_SIZE, f"hugepages={hugepages_1g}")]
    for arg in extra_args:
        if not arg or any(c.isspace() or c in "\"'\\$`" for c in arg):
            raise KernelCmdlineError(f"kernel argument {arg!r} is empty or needs quoting")
        groups.append((arg,))
    return groups


def conflicting_keys(vendor):
    """The other vendor's IOMMU switch: an Intel host must not keep amd_iommu=..."""
    return tuple(f"{other}_iommu" for other in VENDORS if other != vendor)


def _key(arg):
    return arg.split("=", maxsplit=1)[0]


def merge_args(current, groups, remove_keys=()):
    """`current` with every group present, single-value keys replaced in place."""
    args = [a for a in current if _key(a) not in remove_keys]
    for group in groups:
        if group[0] == HUGEPAGE_SIZE and len(group) == 2:
            args = _merge_hugepages(args, group[1])
            continue
        arg = group[0]
        key = _key(arg)
        if key in SINGLE_VALUE_KEYS:
            positions = [i for i, a in enumerate(args) if _key(a) == key]
            if positions:
                args[positions[0]] = arg
                args = [a for i, a in enumerate(args) if i not in positions[1:]]
                continue
        if arg not in args:
            args.append(arg)
    return args


def _merge_hugepages(args, count_arg):
    for i, arg in enumerate(args):
        if arg == HUGEPAGE_SIZE:
            if i + 1 < len(args) and _key(args[i + 1]) == "hugepages":
                return [*args[: i + 1], count_arg, *args[i + 2 :]]
            return [*args[: i + 1], count_arg, *args[i + 1 :]]
    return [*args, HUGEPAGE_SIZE, count_arg]


def parse_assignment(text, variable):
    """(line index, words) of the last `VARIABLE=...` line, (None, []) when absent."""
    found = (None, [])
    for index, line in enumerate(text.splitlines()):
        match = ASSIGNMENT.match(line)
        if not match or match.group(3) != variable:
            continue
        try:
            values = shlex.split(match.group(4), comments=True)
        except ValueError as exc:
            raise KernelCmdlineError(
                f"{variable} line {index + 1} is not shell syntax: {exc}"
            ) from exc
        words = " ".join(values).split()
        if any("$" in word for word in words):
            raise KernelCmdlineError(
                f"{variable} on line {index + 1} expands shell variables; edit it by hand"
            )
        found = (index, words)
    return found


def render(text, variable, index, args):
    """The file with the assignment replaced (or appended when absent)."""
    line = f'{variable}="{" ".join(args)}"'
    lines = text.splitlines()
    if index is None:
        lines.append(line)
    else:
        match = ASSIGNMENT.match(lines[index])
        lines[index] = f"{match.group(1)}{match.group(2) or ''}{line}"
    return "\n".join(lines) + "\n"


def missing_from(cmdline_text, args):
    running = (cmdline_text or "").split()
    return [arg for arg in args if arg not in running]


def grub_cfg_lacks(cfg_text, args):
    """True when no `linux` line of a generated grub.cfg carries every argument."""
    kernel_lines = [
        line.split()
        for line in (cfg_text or "").splitlines()
        if line.strip().startswith(("linux ", "linux\t", "linuxefi "))
    ]
    if not kernel_lines:
        return True
    return not any(all(arg in words for arg in args) for words in kernel_lines)


def find_update_command(which=shutil.which):
    for command in UPDATE_COMMANDS:
        if which(command[0]):
            return list(command)
    return None


def plan(params):
    """Everything `apply` needs; never writes."""
    host = HostRoot(params.get("root") or "/")
    variable = params.get("variable") or "GRUB_CMDLINE_LINUX"
    if variable not in GRUB_VARIABLES:
        raise KernelCmdlineError(f"variable must be one of {', '.join(GRUB_VARIABLES)}")
    detected = cpu_vendor(host)
    vendor = params.get("cpu_vendor") or "auto"
    if vendor == "auto":
        if detected is None:
            raise KernelCmdlineError(
                "cannot tell Intel from AMD (/proc/cpuinfo has no known vendor_id); set cpu_vendor"
            )
        vendor = detected
    groups = wanted_groups(vendor, params.get("hugepages_1g") or 0, params.get("extra_args") or ())
    wanted = [arg for group in groups for arg in group]
    grub_path = params.get("path") or "/etc/default/grub"
    text = hostfile.read_text(host.path(grub_path))
    present = text is not None
    if not present and not params.get("create"):
        before_args, after_args, new_text = [], [], None
    else:
        index, before_args = parse_assignment(text or "", variable)
        after_args = merge_args(before_args, groups, conflicting_keys(vendor))
        new_text = render(text or "", variable, index, after_args)
    running = host.read("/proc/cmdline") or ""
    cfg = hostfile.read_text(host.path(params.get("grub_cfg") or "/boot/grub/grub.cfg"))
    return {
        "cpu_vendor": vendor,
        "detected_cpu_vendor": detected,
        "path": grub_path,
        "real_path": host.path(grub_path),
        "variable": variable,
        "config_present": present,
        "wanted_args": wanted,
        "before_args": before_args,
        "after_args": after_args,
        "before_text": text or "",
        "after_text": new_text if new_text is not None else (text or ""),
        "changed": new_text is not None and new_text != (text or ""),
        "running_missing": missing_from(running, wanted),
        "grub_cfg_stale": cfg is not None and grub_cfg_lacks(cfg, wanted),
        "live_root": host.root == "/",
    }


def run(params, check_mode, runner, which=shutil.which):
    """Plan, then write the file (backup first) and regenerate grub.cfg when needed."""
    planned = plan(params)
    result = {
        "changed": planned["changed"],
        "cpu_vendor": planned["cpu_vendor"],
        "path": planned["path"],
        "config_present": planned["config_present"],
        "wanted_args": planned["wanted_args"],
        "before_args": planned["before_args"],
        "after_args": planned["after_args"],
        "running_missing": planned["running_missing"],
        "reboot_required": bool(planned["running_missing"]),
        "backup_file": None,
        "bootloader_command": None,
        "bootloader_updated": False,
        "diff": hostfile.text_diff(planned["path"], planned["before_text"], planned["after_text"]),
    }
    update_wanted = params.get("update_bootloader", True) and planned["live_root"]
    needs_update = update_wanted and (planned["changed"] or planned["grub_cfg_stale"])
    command = find_update_command(which) if needs_update else None
    if needs_update and command is None:
        result["bootloader_note"] = "no update-grub or grub-mkconfig on this host"
    if needs_update and command is not None:
        result["bootloader_command"] = command
        result["changed"] = True
    if check_mode:
        return result
    if planned["changed"]:
        real = planned["real_path"]
        if planned["config_present"] and params.get("backup", True):
            result["backup_file"] = hostfile.backup(real)
        hostfile.write_text(real, planned["after_text"])
    if needs_update and command is not None:
        updated = runner(command)
        if updated.rc != 0:
            raise KernelCmdlineError(f"{' '.join(command)} exited {updated.rc}: {updated.output}")
        result["bootloader_updated"] = True
    return result
