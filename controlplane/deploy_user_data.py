"""The MAAS deploy user-data of one node, rendered from the project's template
(``scripts/maas/cloud-init/gpuaas-slice-deploy.yaml.j2``; docs/trust.md, "Host keys issued
at deploy").

Pure: inputs are checked here, before anything is issued or pinned, so bad input changes
nothing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from controlplane.enums import ProfileIntent
from controlplane.errors import InvalidInput
from controlplane.hostkeys import HostKey

TEMPLATE = (
    Path(__file__).resolve().parent.parent
    / "scripts"
    / "maas"
    / "cloud-init"
    / "gpuaas-slice-deploy.yaml.j2"
)
# The deploy bootstrap's profile names (the MAAS tags' gpuaas-profile-<name>).
PROFILES: Mapping[ProfileIntent, str] = {
    ProfileIntent.SLICE_VM: "slice-vm",
    ProfileIntent.BAREMETAL: "baremetal",
}
SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class DeployRequest:
    """What the deploy bootstrap installs: the collection tarball (URL or absolute path on
    the host, and its sha256) and the role inputs for the bootstrap playbook."""

    collection_url: str
    collection_sha256: str
    bootstrap_vars: Mapping[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        url = self.collection_url
        if not url.startswith(("http://", "https://", "/")):
            raise InvalidInput(
                "collection_url_invalid",
                f"the collection URL must be an http(s) URL or an absolute path, not {url!r}",
                {"collection_url": url},
            )
        if any(character.isspace() for character in url):
            raise InvalidInput(
                "collection_url_invalid",
                f"the collection URL holds white space: {url!r}",
                {"collection_url": url},
            )
        if not SHA256_HEX.fullmatch(self.collection_sha256):
            raise InvalidInput(
                "collection_sha256_invalid",
                "the collection's sha256 must be 64 lowercase hex digits, not"
                f" {self.collection_sha256!r}",
                {"collection_sha256": self.collection_sha256},
            )
        if not isinstance(self.bootstrap_vars, Mapping):
            raise InvalidInput(
                "bootstrap_vars_invalid",
                "the bootstrap variables must be a mapping of role inputs, not"
                f" {type(self.bootstrap_vars).__name__}",
                {},
            )


def profile_of(intent: ProfileIntent, hostname: str) -> str:
    """The deploy profile of a node's intent (its MAAS profile tag)."""
    profile = PROFILES.get(intent)
    if profile is None:
        raise InvalidInput(
            "deploy_profile_unknown",
            f"{hostname} has no profile intent (MAAS tag gpuaas-profile-slice-vm or"
            " gpuaas-profile-baremetal): nothing says which bootstrap its deploy runs",
            {"node": hostname, "profile_intent": intent.value},
        )
    return profile


def render(
    request: DeployRequest,
    profile: str,
    host_key: tuple[str, HostKey] | None = None,
) -> str:
    """The cloud-config MAAS is given for the node; with ``host_key`` (private OpenSSH key,
    public key) the host takes that key as its only SSH host key."""
    request.check()
    if profile not in PROFILES.values():
        raise InvalidInput(
            "deploy_profile_unknown",
            f"profile must be one of {sorted(PROFILES.values())}, not {profile!r}",
            {"profile": profile},
        )
    variables: dict[str, Any] = {
        "gpuaas_profile": profile,
        "gpuaas_collection_url": request.collection_url,
        "gpuaas_collection_sha256": request.collection_sha256,
        "gpuaas_bootstrap_vars": dict(request.bootstrap_vars),
    }
    if host_key is not None:
        private, public = host_key
        variables["gpuaas_ssh_host_key"] = {"private": private, "public": public.public_line()}
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined, autoescape=False)
    return environment.from_string(TEMPLATE.read_text(encoding="utf-8")).render(variables)
