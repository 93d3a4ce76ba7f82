"""A node's deploy user-data with an SSH host key the control plane issues and pins
(docs/trust.md, "Host keys issued at deploy")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session

from controlplane import deploy_user_data
from controlplane.deploy_user_data import DeployRequest
from controlplane.enums import HostKeySource
from controlplane.hostkeys import generate_host_key
from controlplane.repositories import nodes as node_repo
from controlplane.services import host_keys


@dataclass(frozen=True)
class IssuedDeploy:
    hostname: str
    profile: str
    fingerprint: str
    pin: host_keys.PinResult


def issue(
    session: Session,
    hostname: str,
    request: DeployRequest,
    actor: str,
    reason: str,
    deliver: Callable[[str], None],
) -> IssuedDeploy:
    """Render the node's deploy user-data around a new ed25519 host key, pin the key's
    public half (replacing the node's SSH host keys, recorded) and hand the text to
    ``deliver`` inside the caller's transaction: a key whose user-data could not be
    delivered is never pinned. The private half exists only in the delivered text. The
    request is checked by ``render`` and the reason by ``pin``, both before anything is
    written."""
    node = node_repo.get_by_hostname(session, hostname, for_update=True)
    node_repo.refuse_retired(node, "be deployed")
    profile = deploy_user_data.profile_of(node.profile_intent, hostname)
    private, key = generate_host_key()
    text = deploy_user_data.render(request, profile, (private, key))
    pinned = host_keys.pin(session, hostname, [key], HostKeySource.DEPLOY, actor, reason)
    deliver(text)
    return IssuedDeploy(hostname, profile, key.fingerprint, pinned)
