"""Domain enumerations: their values are the contract with the collection and the database."""

from __future__ import annotations

from enum import StrEnum


class CapacityShape(StrEnum):
    BAREMETAL = "baremetal"
    GPU_SLICE = "gpu_slice"


class ProfileIntent(StrEnum):
    """Node profile intent, taken from MAAS tags."""

    SLICE_VM = "slice_vm"
    BAREMETAL = "baremetal"
    UNKNOWN = "unknown"


MAAS_PROFILE_TAGS: dict[str, ProfileIntent] = {
    "gpuaas-profile-slice-vm": ProfileIntent.SLICE_VM,
    "gpuaas-profile-baremetal": ProfileIntent.BAREMETAL,
}


class AdminState(StrEnum):
    SCHEDULABLE = "schedulable"
    DRAINING = "draining"
    UNAVAILABLE = "unavailable"


class SlotStatus(StrEnum):
    DISABLED = "disabled"
    AVAILABLE = "available"
    RESERVED = "reserved"
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    RELEASING = "releasing"
    CLEANUP = "cleanup"
    CLEANUP_BLOCKED = "cleanup_blocked"


class HealthState(StrEnum):
    UNKNOWN = "unknown"
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"


class FindingSeverity(StrEnum):
    """A health finding: critical fails its slots (or the node), a warning degrades them."""

    CRITICAL = "critical"
    WARNING = "warning"


class FindingScope(StrEnum):
    DEVICE = "device"
    NODE = "node"


class FabricClaimMode(StrEnum):
    PER_SLOT_VF = "per_slot_vf"
    SHARED_DEVICE = "shared_device"
    NONE = "none"


class LinkLayer(StrEnum):
    """The link layer of a node's slice fabric VFs, as discovery found it."""

    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"


class Fabric(StrEnum):
    """What a SKU requires of its slots' fabric: InfiniBand, Ethernet (RoCE) or either."""

    INFINIBAND = "infiniband"
    ETHERNET = "ethernet"
    ANY = "any"


class SharingMechanism(StrEnum):
    """How a slot shares its GPU. Only whole-device slots are schedulable in v1."""

    EXCLUSIVE_DEVICE = "exclusive_device"
    MIG_PARTITION = "mig_partition"
    MDEV_VGPU = "mdev_vgpu"
    TIME_SLICED = "time_sliced"
    MPS = "mps"
    SOFTWARE_SHARED = "software_shared"


class AllocationState(StrEnum):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    ACTIVE = "active"
    # Running, but a slot it holds or its node failed a health check: the tenant's to
    # release, never released or wiped by the loop (docs/operations.md, "Health and
    # remediation").
    IMPAIRED = "impaired"
    RELEASING = "releasing"
    RELEASED = "released"
    FAILED = "failed"


class ProvisionProgress(StrEnum):
    """How far a failed provision got on its node: what may be left there to remove
    (docs/operations.md, "Failed provisions"). Unknown progress is ``disk_written``."""

    # Refused before anything was written on the host (preflight): the slots return at once.
    NOTHING_ON_HOST = "nothing_on_host"
    # Host state outside the slot disks may exist (seed, DHCP reservation, libvirt domain).
    DOMAIN_DEFINED = "domain_defined"
    # A slot disk may have been written (the image clone began, or the progress is unknown).
    DISK_WRITTEN = "disk_written"


class ProjectState(StrEnum):
    ACTIVE = "active"
    RETIRED = "retired"


class ClaimKind(StrEnum):
    NODE_EXCLUSIVE = "node_exclusive"
    SLOT = "slot"


class ClaimState(StrEnum):
    ACTIVE = "active"
    RELEASED = "released"


class NodeTaskKind(StrEnum):
    TOPOLOGY_DISCOVER = "slice.topology_discover"
    VM_PROVISION = "slice.vm_provision"
    VM_RELEASE = "slice.vm_release"
    HOST_BOOTSTRAP = "host.bootstrap"
    HOST_NETWORK = "host.network_baseline"
    HOST_PARITY = "host.parity"
    STORAGE_TRANSITION = "storage.transition"
    DISK_WIPE = "disk.wipe"
    RECONCILE = "node.reconcile"
    IMAGE_CACHE = "image.cache"
    HOST_BENCHMARK = "host.benchmark"
    HOST_HEALTH = "host.health"


class SweepKind(StrEnum):
    """The host actions a fleet sweep judges (the node task kinds of the same names)."""

    DISCOVERY = "slice.topology_discover"
    PARITY = "host.parity"


class NodeTaskState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class EvidenceKind(StrEnum):
    TOPOLOGY = "topology"
    PARITY = "parity"
    HOST_RESULT = "host_result"
    STORAGE_MANIFEST = "storage_manifest"
    WIPE_PROOF = "wipe_proof"
    READINESS = "readiness"
    DRIFT = "drift"
    APPROVAL = "approval"
    OPERATOR_ACTION = "operator_action"
    HOST_KEYS = "host_keys"
    BENCHMARK = "benchmark"
    # What a slice guest could reach, each attempt from inside it (gpuaas.containment_probe/v1).
    CONTAINMENT = "containment"
    # One health check of a node and what the store made of it (gpuaas.health/v1).
    HEALTH = "health"


class HostKeySource(StrEnum):
    """Where a pinned SSH host key came from (docs/trust.md)."""

    OPERATOR = "operator"  # given by an operator from a file they checked
    SCAN = "scan"  # read from the host with ssh-keyscan, on the operator's word
    BOOTSTRAP = "bootstrap"  # reported by the node's bootstrap run over its pinned SSH
    DEPLOY = "deploy"  # issued by the control plane and seeded in the node's deploy user-data


class KeyPurpose(StrEnum):
    """What a node's pinned public key vouches for (docs/trust.md)."""

    SSH_HOST = "ssh_host"  # the SSH server's host key: who answers at the node's address
    EVIDENCE_SIGNING = "evidence_signing"  # signs the results the node reports


class ImageStatus(StrEnum):
    DISABLED = "disabled"
    ACTIVE = "active"
    DEPRECATED = "deprecated"


class DriverStrategy(StrEnum):
    CLOUD_INIT = "cloud-init"
    PREINSTALLED = "preinstalled"


class ImageCacheStatus(StrEnum):
    """A node's copy of a catalog image. ``failed``: the last fetch or re-verification
    failed (the row says why); ``stale``: the copy verified holds a digest the catalog has
    since moved on from."""

    MISSING = "missing"
    VERIFIED = "verified"
    FAILED = "failed"
    STALE = "stale"


class NetworkMode(StrEnum):
    PRIVATE_NAT = "private-nat"
    PRIVATE_ROUTED = "private-routed"
    PUBLIC_NAT = "public-nat"
