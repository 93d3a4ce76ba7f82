"""Host trust: pinned SSH host keys, re-keying, evidence signing keys and MAAS deploy
user data (docs/trust.md)."""

from __future__ import annotations

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.enums import HostKeySource, KeyPurpose
from controlplane.errors import GpuaasError
from controlplane.hostkeys import parse_public_keys
from controlplane.repositories import nodes as node_repo
from controlplane.services import deploys
from controlplane.services import host_keys as host_key_service


class HostKeysApi(ServiceBoundary):
    """The control plane's calls on host keys (one transaction each)."""

    def pin_host_keys(
        self,
        hostname: str,
        public_keys: list[str],
        source: HostKeySource,
        actor: str,
        reason: str,
    ) -> host_key_service.PinResult:
        """Pin the node's SSH host keys (``.pub`` lines); replaces the current set."""
        keys = parse_public_keys(public_keys)
        with self.transaction() as session:
            return host_key_service.pin(session, hostname, keys, source, actor, reason)

    def rekey(self, hostname: str, actor: str, reason: str) -> host_key_service.PinResult:
        """Re-pin after a legitimate re-image: the keys the node's management address
        presents now (scanned between transactions), on the operator's word."""
        keys = host_key_service.scan(*self._ssh_endpoint(hostname))
        with self.transaction() as session:
            return host_key_service.pin(session, hostname, keys, HostKeySource.SCAN, actor, reason)

    issue_deploy_user_data = service_call(deploys.issue)

    pin_reported_signing_key = service_call(host_key_service.pin_reported_signing_key)

    def pin_signing_key(
        self, hostname: str, public_key: str, actor: str, reason: str
    ) -> host_key_service.PinResult:
        """Pin an evidence signing key an operator checked (replaces the current one)."""
        keys = parse_public_keys([public_key])
        with self.transaction() as session:
            return host_key_service.pin(
                session,
                hostname,
                keys,
                HostKeySource.OPERATOR,
                actor,
                reason,
                KeyPurpose.EVIDENCE_SIGNING,
            )

    forget_signing_key = service_call(host_key_service.forget_signing_key)

    def host_key_refusal(self, hostname: str) -> str | None:
        """Why a connection to the node is refused by its pinned keys, naming the
        fingerprints it presents now and those pinned; None when they agree."""
        try:
            presented = host_key_service.scan(*self._ssh_endpoint(hostname))
        except GpuaasError:
            presented = []
        with self.transaction() as session:
            return host_key_service.refusal(session, hostname, presented)

    def _ssh_endpoint(self, hostname: str) -> tuple[str, int]:
        with self.transaction() as session:
            return host_key_service.endpoint(node_repo.get_by_hostname(session, hostname))

    host_keys = service_call(host_key_service.listing)
    known_hosts = service_call(host_key_service.known_hosts_for)
