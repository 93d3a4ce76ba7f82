"""Moved to controlplane.lab.vmlab (the demo uses it too); kept for existing imports."""

from controlplane.lab.vmlab import (  # noqa: F401
    LIBVIRT_DIRS,
    LIBVIRTD_CONF,
    OVS_SCHEMA,
    QEMU_CONF,
    REPO_ROOT,
    VENV_BIN,
    VIRTLOGD_CONF,
    Allocation,
    LabNamespace,
    PlaybookRun,
    VmLab,
    VmLabError,
    capabilities_cache_dir,
    make_allocation,
    ovs_unavailable_reason,
    vm_lab_unavailable_reason,
)
