"""A slice host that can run real (QEMU-emulated) slice VMs, driven by the flows.

It joins three pieces: a VmLab (bridge, NAT, dnsmasq, libvirtd in private namespaces, one
loop device per slot as its raw NVMe disk, visible at /dev/disk/by-id inside the lab), a
recorded host tree describing those disks plus a GPU and a fabric VF per slot for
discovery, and the host variables that point the roles at the lab. Registered as a node,
it goes through discovery, approval, provision_allocation and release_allocation like any
other host.

The boundary of this machine: QEMU emulation (no usable KVM) and no VFIO, so the VM
boots without its GPU and VF hostdevs (their XML is validated in the VM tests instead).
"""

from __future__ import annotations

import secrets
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.api import ControlPlane
from controlplane.services.images import ImageSpec
from controlplane.services.inventory import NodeSpec, SkuSpec
from gpuaas_lab import hosttrees
from gpuaas_lab.hosts import SigningKey, interpreter_in
from gpuaas_lab.netns import NetNamespace
from gpuaas_lab.vmguest import GuestImage, ensure_guest_image
from gpuaas_lab.vmguest import unavailable_reason as guest_unavailable_reason
from gpuaas_lab.vmlab import VmLab, vm_lab_unavailable_reason

# A small profile the emulated guest boots quickly with (the H200 profile is 24 vCPU and
# 64 GiB per GPU); lab nodes are their own family so no real SKU lands on them. Guests
# touch little of their memory, so a full eight-slot lab host fits on a small machine.
LAB_IMAGE = "lab-guest"
# The lab node's uplink address (TEST-NET-1) and its default gateway.
UPLINK_ADDRESS = "192.0.2.21/24"
UPLINK_GATEWAY = "192.0.2.1"
LAB_SKU = SkuSpec(
    slug="lab-slice",
    display_name="Lab slice VM (QEMU emulation, no passthrough)",
    capacity_shape="gpu_slice",
    node_family="lab",
    gpu_model="none",
    allowed_gpu_counts=(1, 2, 4, 8),
    vcpu_per_gpu=1,
    memory_gib_per_gpu=1,
)


def lab_host_spec(hostname: str, euis: Sequence[str]) -> hosttrees.HostSpec:
    """One slot per EUI: a GPU, a VF of the one fabric PF and the data disk whose EUI a
    loop disk of the lab carries; all on NUMA node 0 (this machine's only node)."""
    return hosttrees.HostSpec(
        hostname=hostname,
        gpus=tuple(hosttrees.Gpu(f"0000:{0x1B + 0x10 * i:02x}:00.0", 0) for i in range(len(euis))),
        nvswitches=(),
        # A PF's VFs are functions 1-7 of its device: four per PF, as on the H200 hosts.
        fabric=tuple(
            hosttrees.FabricPort(
                f"0000:{0x1A + 0x10 * port:02x}:00.0",
                0,
                f"mlx5_{port}",
                vf_count=min(4, len(euis) - 4 * port),
            )
            for port in range(-(-len(euis) // 4))
        ),
        disks=tuple(
            hosttrees.NvmeDisk(
                controller=i,
                pci_address=f"0000:{0x31 + i:02x}:00.0",
                numa_node=0,
                eui=eui,
                model="Lab NVMe",
                serial=eui[-12:],
            )
            for i, eui in enumerate(euis)
        ),
    )


def unavailable_reason() -> str | None:
    return vm_lab_unavailable_reason() or guest_unavailable_reason()


@dataclass
class LabSliceHost:
    """Use as a context manager; everything is removed on exit."""

    root: Path
    hostname: str = "j22u21"
    disk_mib: int = 64
    slots: int = 1
    host_action_limit: int = NodeSpec.host_action_limit
    # The image the slots' VMs boot: the busybox guest, or sliceguest's Debian one.
    guest_image: Callable[[], GuestImage] = ensure_guest_image
    # The slice bridge: a Linux bridge, or Open vSwitch with the userspace datapath.
    bridge_type: str = "linux"
    # Names the slice network's dnsmasq answers (VmLab.dns_records); empty: no DNS.
    dns_records: dict[str, str] = field(default_factory=dict)
    # The namespace at the far end of the uplink, holding its default gateway 192.0.2.1
    # (gpuaas_lab.containment's outside); None: the uplink is a dummy link.
    uplink_peer: NetNamespace | None = None
    lab: VmLab | None = None
    image: GuestImage | None = None
    host_vars: dict[str, Any] = field(default_factory=dict)
    signing_key: SigningKey | None = None

    def __enter__(self) -> LabSliceHost:
        self.root.mkdir(parents=True, exist_ok=True)
        self.image = self.guest_image()
        self.lab = VmLab(
            self.root / "lab",
            bridge_type=self.bridge_type,
            dev_disk_by_id=True,
            dns_records=self.dns_records,
        )
        try:
            self.lab.start()
            # An uplink with a default route, as fleet hosts have.
            if self.uplink_peer is None:
                self.lab.ns.add_dummy("eno8303", UPLINK_ADDRESS)
            else:
                self.lab.ns.add_veth_to("eno8303", self.uplink_peer, "wan0", UPLINK_ADDRESS)
            self.lab.ns.add_route("default", "eno8303", via=UPLINK_GATEWAY)
            assert self.lab.loops is not None
            prefix = "000000000000000100a07524" + secrets.token_hex(3)
            euis = [f"{prefix}{slot:02x}" for slot in range(self.slots)]
            for eui in euis:
                self.lab.loops.disk(self.disk_mib, name=f"nvme-eui.{eui}")
            tree = hosttrees.write_tree(lab_host_spec(self.hostname, euis), self.root / "tree")
            # Parity reads libvirt's status of the running domains under its root (the
            # recorded tree); the lab's libvirtd keeps it in the lab's mount namespace,
            # where the modules run.
            status = tree / "run" / "libvirt" / "qemu"
            status.parent.mkdir(parents=True, exist_ok=True)
            status.symlink_to("/run/libvirt/qemu")
            state = self.root / "state"
            self.signing_key = SigningKey.create(state)
            self.host_vars = {
                "ansible_connection": "local",
                "ansible_python_interpreter": str(interpreter_in(self.lab.ns, self.root)),
                "gpuaas_topology_root": str(tree),
                "gpuaas_node_id": self.hostname,
                # The slice network is in the lab's namespace: the controller reaches a
                # slice VM through it (controlplane/services/guests.py).
                "gpuaas_slice_proxy_command": shlex.join(
                    [*self.lab.ns.exec_prefix(), "nc", "%h", "%p"]
                ),
                "slice_vm_provision_bridge_type": self.bridge_type,
                "slice_vm_provision_emulation": True,
                "slice_vm_provision_pci_passthrough": False,
                # Eight emulated guests booting at once on a loaded machine are slow.
                "slice_vm_provision_readiness_timeout": 600,
                "slice_vm_provision_state_root": str(state / "slices"),
                "slice_vm_provision_terminal_key_path": str(state / "terminal" / "id_ed25519"),
                "slice_vm_release_state_root": str(state / "slices"),
                "slice_vm_release_wipe_proof_dir": str(state / "wipe-proofs"),
                "slice_vm_release_shutdown_timeout": 60,
                "slice_disk_wipe_proof_dir": str(state / "wipe-proofs"),
                **self.signing_key.role_vars(),
                **{
                    f"slice_vm_{role}_dnsmasq_{name}": str(path)
                    for role in ("provision", "release")
                    for name, path in (
                        ("hostsfile", self.lab.dnsmasq_hostsfile),
                        ("leasefile", self.lab.dnsmasq_leasefile),
                        ("pidfile", self.lab.dnsmasq_pidfile),
                    )
                },
            }
        except BaseException:
            self.lab.close()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self.lab is not None:
            self.lab.close()

    def enroll(self, cp: ControlPlane) -> None:
        """Register the node and pin its signing key, as commissioning and bootstrap do."""
        assert self.signing_key is not None
        cp.register_node(self.node_spec())
        self.signing_key.pin(cp, self.hostname)

    def node_spec(self) -> NodeSpec:
        assert self.lab is not None
        return NodeSpec(
            self.hostname,
            "lab",
            node_family=LAB_SKU.node_family,
            maas_tags=("gpuaas-profile-slice-vm",),
            gpu_count=self.slots,
            slice_subnet=self.lab.subnet,
            host_action_limit=self.host_action_limit,
            slice_bridge=self.lab.bridge,
            host_vars=self.host_vars,
        )

    @property
    def bridge(self) -> str:
        assert self.lab is not None
        return self.lab.bridge

    def catalog_image(self, slug: str = LAB_IMAGE) -> ImageSpec:
        """The lab guest as a catalog entry for the lab SKU."""
        assert self.image is not None
        return ImageSpec(slug, self.image.sha256, str(self.image.path), (LAB_SKU.slug,))
