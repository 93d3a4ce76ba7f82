"""An active allocation's slice VM as an Ansible host, for host actions that run inside
the guest (a benchmark capture: docs/slice-host.md, "Benchmark capture of a slice VM").

The guest is reached at its reserved address as a user the allocation was provisioned
with, and accepts only the host key its provision issued (docs/trust.md): the same pin
the readiness gate checked. Its address is on the node's slice network, which the
controller reaches through the node: by default an ``ssh -W`` jump to the node under
the node's own pins, or the node's ``gpuaas_slice_proxy_command`` (an OpenSSH
ProxyCommand) when an operator set one; a node the controller runs on (local connection)
is on that network already.
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from controlplane.enums import AllocationState, CapacityShape
from controlplane.errors import Conflict, InvalidInput
from controlplane.hostkeys import HostKey, control_path, known_hosts, parse_public_key, ssh_pin_args
from controlplane.models import Allocation, Node
from controlplane.repositories import host_keys as host_key_repo
from controlplane.repositories import nodes as node_repo
from controlplane.services.allocations import runtime_spec
from controlplane.services.inventory import SLICE_PROXY_COMMAND_VAR as PROXY_COMMAND_VAR

# cloud-init's (and useradd's) portable user names.
GUEST_USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
GUEST_DISK = re.compile(r"^/dev/(disk/by-[a-z]+/)?[A-Za-z0-9][A-Za-z0-9._:-]*$")


@dataclass(frozen=True)
class NodeJump:
    """The default way onto the node's slice network: ``ssh -W`` through the node, checked
    against the node's pinned keys."""

    node: str
    address: str
    port: int | None
    user: str | None
    keys: tuple[HostKey, ...]

    def command(self, known_hosts_file: str) -> str:
        argv = ["ssh", *shlex.split(ssh_pin_args(self.node, known_hosts_file))]
        argv += ["-o", "BatchMode=yes"]
        if self.port:
            argv += ["-p", str(self.port)]
        if self.user:
            argv += ["-l", self.user]
        return shlex.join([*argv, "-W", "%h:%p", self.address])


@dataclass(frozen=True)
class GuestTarget:
    """Where the allocation's guest is and what it must present. ``name``: its inventory
    name and HostKeyAlias; ``route``: the operator's ProxyCommand, a jump through the node,
    or None (the controller is on the slice network)."""

    allocation_id: str
    node: str
    name: str
    address: str
    user: str
    host_key: HostKey
    route: str | NodeJump | None

    def host_variables(self, known_hosts_file: str) -> dict[str, Any]:
        """The guest's Ansible variables, its connections checked against the file that
        ``known_hosts`` fills."""
        options = [ssh_pin_args(self.name, known_hosts_file)]
        proxy = (
            self.route.command(known_hosts_file) if isinstance(self.route, NodeJump) else self.route
        )
        if proxy:
            options.append(f"-o ProxyCommand={shlex.quote(proxy)}")
        return {
            "ansible_connection": "ssh",
            "ansible_host": self.address,
            "ansible_user": self.user,
            # A host variable outranks ANSIBLE_HOST_KEY_CHECKING, which ansible-runner
            # sets to False (controlplane/services/ansible_inventory.py).
            "ansible_host_key_checking": True,
            # A persisted master connection skips the checks: its path names every pin the
            # route was checked against, the node's too.
            "ansible_control_path": control_path(self.name, self.pins()),
            "ansible_ssh_common_args": " ".join(options),
            "gpuaas_node_id": self.node,
            "gpuaas_allocation_id": self.allocation_id,
        }

    def pins(self) -> list[HostKey]:
        """Every key a connection to the guest is checked against."""
        jump = list(self.route.keys) if isinstance(self.route, NodeJump) else []
        return [self.host_key, *jump]

    def known_hosts(self) -> str:
        entries: list[tuple[str, list[HostKey]]] = [(self.name, [self.host_key])]
        if isinstance(self.route, NodeJump):
            entries.append((self.route.node, list(self.route.keys)))
        return known_hosts(entries)


def guest_name(allocation_id: uuid.UUID) -> str:
    return f"slice-{allocation_id}"


def guest_target(session: Session, allocation_id: uuid.UUID, user: str) -> GuestTarget:
    """How to reach the allocation's guest as ``user``; refused unless the allocation is
    an active slice VM whose guest host key was issued."""
    if not GUEST_USER.match(user or ""):
        raise InvalidInput(
            "guest_user_invalid",
            f"{user!r} is not a guest user name (one the allocation was provisioned with)",
            {"user": user},
        )
    spec = runtime_spec(session, allocation_id)
    if spec.capacity_shape != CapacityShape.GPU_SLICE.value:
        raise Conflict(
            "not_a_slice_vm",
            f"allocation {allocation_id} is a {spec.capacity_shape} allocation, not a slice VM",
            {"allocation_id": str(allocation_id)},
        )
    # An impaired VM still runs: its tenant may reach it to take their data off.
    reachable = (AllocationState.ACTIVE.value, AllocationState.IMPAIRED.value)
    if spec.state not in reachable or not spec.private_ip:
        raise Conflict(
            "allocation_not_active",
            f"allocation {allocation_id} is {spec.state}; only an active or impaired slice VM"
            " is reachable",
            {"allocation_id": str(allocation_id), "state": spec.state},
        )
    allocation = session.get(Allocation, allocation_id)
    assert allocation is not None
    guest_key = allocation.runtime_metadata.get("guest_host_key")
    if not guest_key:
        raise Conflict(
            "guest_host_key_missing",
            f"allocation {allocation_id} has no issued guest host key to check its VM against",
            {"allocation_id": str(allocation_id)},
        )
    node = node_repo.get_by_hostname(session, spec.node)
    return GuestTarget(
        allocation_id=str(allocation_id),
        node=node.hostname,
        name=guest_name(allocation_id),
        address=spec.private_ip,
        user=user,
        host_key=parse_public_key(guest_key),
        route=route_to(session, node),
    )


def route_to(session: Session, node: Node) -> str | NodeJump | None:
    """How the controller reaches the node's slice network (None: directly)."""
    host_vars = node.host_vars or {}
    if host_vars.get(PROXY_COMMAND_VAR):
        return str(host_vars[PROXY_COMMAND_VAR])
    connection = host_vars.get("ansible_connection", "ssh")
    if connection == "local":
        return None
    if connection != "ssh":
        raise Conflict(
            "slice_network_unreachable",
            f"node {node.hostname} is reached by the {connection} connection; set its "
            f"{PROXY_COMMAND_VAR} to reach its slice network",
            {"node": node.hostname},
        )
    keys = host_key_repo.current(session, [node.id]).get(node.id, [])
    if not keys:
        raise Conflict(
            "host_keys_not_pinned",
            f"node {node.hostname} has no pinned SSH host key to jump through "
            "(`gpuaas node rekey`)",
            {"node": node.hostname},
        )
    port = host_vars.get("ansible_port")
    return NodeJump(
        node=node.hostname,
        address=str(host_vars.get("ansible_host") or node.management_address or node.hostname),
        port=int(port) if port else None,
        user=str(host_vars["ansible_user"]) if host_vars.get("ansible_user") else None,
        keys=tuple(keys),
    )


def storage_target(target: str) -> str:
    """``target`` when it names a block device of the guest: every disk of a slice VM is
    its allocation's own (the slot's raw disk passed through), and a capture reads it
    only (``fio --readonly``)."""
    if not GUEST_DISK.match(target) or "/../" in f"{target}/":
        raise InvalidInput(
            "benchmark_target_not_approved",
            f"{target!r} is not a block device path of the guest (/dev/NAME or "
            "/dev/disk/by-*/NAME)",
            {"target": target},
        )
    return target
