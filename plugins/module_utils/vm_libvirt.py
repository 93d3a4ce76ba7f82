# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""libvirt connections for the slice VM modules that talk to libvirt.

Kept apart from vm_common so that the modules that never connect (seed, DHCP reservation,
readiness) do not load libvirt-python: every Ansible task starts a new Python, and loading
the library costs each of them about 50 ms on a busy host.

Runs on target hosts: libvirt-python (reported through `missing_required_lib` by the
modules).
"""

from __future__ import annotations

try:
    import libvirt

    HAS_LIBVIRT = True
    LIBVIRT_IMPORT_ERROR = None
except ImportError as exc:  # reported by the module with missing_required_lib
    libvirt = None
    HAS_LIBVIRT = False
    LIBVIRT_IMPORT_ERROR = exc

from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError


def _ignore_libvirt_error(_ctx, _err) -> None:
    """libvirt prints every error to stderr by default; ours are raised as exceptions."""


def open_libvirt(uri: str, phase: str = ""):
    """A read-write libvirt connection, or VmError(libvirt_unavailable)."""
    if not HAS_LIBVIRT:
        raise VmError("libvirt_python_missing", "libvirt-python is not installed", phase)
    libvirt.registerErrorHandler(_ignore_libvirt_error, None)
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise VmError(
            "libvirt_unavailable", f"cannot connect to libvirt at {uri}: {exc}", phase
        ) from exc


def lookup_domain(conn, name: str):
    """The domain called `name`, or None when it does not exist."""
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise
