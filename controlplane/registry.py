"""Slice images in an OCI registry: a raw disk image published as an OCI artifact of one
layer, and the blob URL a node fetches it from (docs/slice-host.md, "Image cache").

The registry client is the ORAS Python SDK; a node needs none: the control plane checks
the artifact's manifest and hands the node a plain blob URL and the catalog digest, which
``gpuaas.fleet.image_cache`` verifies while the image streams.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import oras.client
import requests

from controlplane.errors import Conflict, GpuaasError, InvalidInput

# The layer's media type: a raw disk image (what a slot's disk is cloned from).
RAW_DISK_MEDIA_TYPE = "application/vnd.gpuaas.disk.image.raw"
DEFAULT_TAG = "latest"
REFERENCE = re.compile(
    r"^(?P<host>[A-Za-z0-9.-]+(?::\d{1,5})?)/(?P<repository>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?$"
)
CHUNK = 1 << 20


@dataclass(frozen=True)
class Reference:
    host: str
    repository: str
    tag: str

    @classmethod
    def parse(cls, text: str) -> Reference:
        """``HOST[:PORT]/NAMESPACE/NAME[:TAG]``, optionally as ``oci://...``."""
        match = REFERENCE.match(text.removeprefix("oci://"))
        if match is None:
            raise InvalidInput(
                "registry_reference_invalid",
                f"{text!r} is not a registry reference (HOST[:PORT]/NAMESPACE/NAME[:TAG])",
                {"reference": text},
            )
        return cls(match["host"], match["repository"], match["tag"] or DEFAULT_TAG)

    @property
    def target(self) -> str:
        return f"{self.host}/{self.repository}:{self.tag}"

    @property
    def source_uri(self) -> str:
        return f"oci://{self.target}"

    def blob_url(self, digest: str, plain_http: bool) -> str:
        scheme = "http" if plain_http else "https"
        return f"{scheme}://{self.host}/v2/{self.repository}/blobs/sha256:{digest}"


@dataclass(frozen=True)
class Published:
    source_uri: str
    digest_sha256: str
    size_bytes: int


def file_digest(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


@contextlib.contextmanager
def _registry_call(reference: Reference, failure: str) -> Iterator[None]:
    """A registry that cannot be reached or read, as one refusal that says ``failure``."""
    try:
        yield
    except (requests.RequestException, OSError, ValueError) as exc:
        raise GpuaasError(
            "registry_unreachable", f"{failure}: {exc}", {"reference": reference.source_uri}
        ) from exc


def _client(reference: Reference, plain_http: bool) -> oras.client.OrasClient:
    """An ORAS client for the reference's registry, once the registry answers at all: the
    client retries a failing request five times over about two minutes, which suits a
    registry that blips, not one that is not there."""
    scheme = "http" if plain_http else "https"
    with _registry_call(reference, f"the registry {reference.host} does not answer"):
        requests.get(f"{scheme}://{reference.host}/v2/", timeout=10)
    return oras.client.OrasClient(hostname=reference.host, insecure=plain_http)


def _layer_digest(client: oras.client.OrasClient, reference: Reference) -> str:
    """The sha256 of the artifact's single raw-disk layer."""
    with _registry_call(reference, f"cannot read {reference.source_uri} from its registry"):
        manifest = client.get_manifest(reference.target)
    layers = [
        layer
        for layer in manifest.get("layers") or []
        if layer.get("mediaType") == RAW_DISK_MEDIA_TYPE
    ]
    if len(layers) != 1:
        raise InvalidInput(
            "registry_artifact_invalid",
            f"{reference.source_uri} is not a slice image (one {RAW_DISK_MEDIA_TYPE} layer)",
            {"reference": reference.source_uri},
        )
    return str(layers[0]["digest"]).removeprefix("sha256:")


def publish(reference: Reference, image: Path, plain_http: bool = False) -> Published:
    """Push ``image`` as the artifact ``reference`` and check the registry holds exactly
    its bytes (the layer's digest is the file's sha256)."""
    if not image.is_file():
        raise InvalidInput("image_file_missing", f"{image} is not a file", {"file": str(image)})
    digest, size = file_digest(image)
    client = _client(reference, plain_http)
    with _registry_call(reference, f"cannot push {image} to {reference.source_uri}"):
        client.push(
            target=reference.target,
            files=[f"{image}:{RAW_DISK_MEDIA_TYPE}"],
            disable_path_validation=True,
            quiet=True,
        )
    pushed = _layer_digest(client, reference)
    if pushed != digest:
        raise Conflict(
            "registry_digest_mismatch",
            f"{reference.source_uri} holds sha256 {pushed}, the file has {digest}",
            {"registry": pushed, "file": digest},
        )
    return Published(reference.source_uri, digest, size)


def blob_url(source_uri: str, digest: str, plain_http: bool = False) -> str:
    """Where a node fetches the catalog image: the artifact's layer, which must still be
    the catalog's digest (a tag moved on to another image is refused, not fetched)."""
    reference = Reference.parse(source_uri)
    current = _layer_digest(_client(reference, plain_http), reference)
    if current != digest:
        raise Conflict(
            "registry_image_moved",
            f"{source_uri} now holds sha256 {current}; the catalog says {digest}"
            " (publish the image again to move the catalog)",
            {"registry": current, "catalog": digest},
        )
    return reference.blob_url(digest, plain_http)
