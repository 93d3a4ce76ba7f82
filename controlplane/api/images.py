"""Images: the catalog, publishing to the registry and the nodes' image caches."""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from controlplane.api.boundary import ServiceBoundary, service_call
from controlplane.services import audit_trail, images
from controlplane.services import image_cache as cache_service


class ImagesApi(ServiceBoundary):
    """The control plane's calls on images (one transaction each)."""

    register_image = service_call(images.register)

    def publish_image(
        self,
        slug: str,
        image_file: Path,
        reference: str,
        skus: Sequence[str],
        node_path: str | None = None,
        plain_http: bool = False,
        *,
        actor: str = audit_trail.DIRECT_CALLER,
        reason: str | None = None,
    ) -> images.RegisteredImage:
        """Push a raw image to the registry as an OCI artifact and make it the catalog's
        image ``slug``, which nodes fetch from there (``gpuaas.fleet.image_cache``). The
        catalog entry is checked before anything is pushed and written only after the
        registry holds exactly the file's bytes."""
        # The registry client (oras, requests) takes ~0.2 s to import: only publishing needs it.
        from controlplane import registry

        target = registry.Reference.parse(reference)
        # Checked with a placeholder digest: the real one is known once the push is done.
        spec = images.ImageSpec(
            slug,
            "0" * 64,
            node_path or f"{images.NODE_CACHE_DIR}/{slug}.raw",
            tuple(skus),
            source_uri=target.source_uri,
            plain_http=plain_http,
        )
        with self.transaction() as session:
            images.validate(session, spec)
        published = registry.publish(target, image_file, plain_http)
        with self.transaction() as session:
            return images.register(
                session,
                dataclasses.replace(
                    spec, digest_sha256=published.digest_sha256, size_bytes=published.size_bytes
                ),
                actor=actor,
                reason=reason,
            )

    list_images = service_call(images.listing)

    def prewarm_source(self, slug: str) -> tuple[cache_service.PrewarmImage, str]:
        """The published image ``slug`` and the blob URL nodes fetch it from, once the
        registry confirms it still holds the catalog's digest."""
        from controlplane import registry

        with self.transaction() as session:
            image = cache_service.published_image(session, slug)
        return image, registry.blob_url(image.source_uri, image.sha256, image.plain_http)

    def settle_image_cache(
        self,
        hostname: str,
        slug: str,
        node_task_id: uuid.UUID | None,
        result: dict[str, Any] | None,
        failure: str | None,
    ) -> cache_service.CacheView:
        """Record a node's fetch or re-verification of ``slug`` (verified, failed, stale)."""
        with self.transaction() as session:
            return cache_service.settle(
                session, hostname, slug, node_task_id, result, failure, dt.datetime.now(dt.UTC)
            )

    image_cache = service_call(cache_service.listing)

    def verified_image_copies(
        self, older_than_seconds: float | None = None
    ) -> list[cache_service.CachedCopy]:
        """Verified copies, those last checked more than ``older_than_seconds`` ago only
        when given."""
        before = (
            None
            if older_than_seconds is None
            else dt.datetime.now(dt.UTC) - dt.timedelta(seconds=older_than_seconds)
        )
        with self.transaction() as session:
            return cache_service.verified_copies(session, before)
