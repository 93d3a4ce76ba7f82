"""The slice OS image catalog: which images slice VMs boot, by digest.

A catalog row is upserted per slug (a republished image replaces the live row's digest,
docs/slice-host.md, "Image cache"); node image cache entries holding another digest then
stop counting as verified copies, so a node never boots a stale image under a new name.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.enums import CapacityShape, ImageStatus
from controlplane.errors import InvalidInput, NotFound
from controlplane.models import SHA256_PATTERN, OsImage, Sku
from controlplane.services import audit_trail, image_cache

SLUG_PATTERN = re.compile(r"^[a-z0-9][a-z0-9._-]{0,99}$")
# Where a published image lands on the nodes unless the publisher names a path.
NODE_CACHE_DIR = "/var/lib/gpuaas/slice-images"


@dataclass(frozen=True)
class ImageSpec:
    """``source_uri``: the OCI artifact the nodes fetch it from (``oci://``), with
    ``plain_http`` for a registry without TLS; None for an image placed on the nodes by
    other means."""

    slug: str
    digest_sha256: str
    image_path: str
    compatible_skus: tuple[str, ...]
    active: bool = True
    source_uri: str | None = None
    size_bytes: int | None = None
    plain_http: bool = False


@dataclass(frozen=True)
class ImageView:
    slug: str
    status: str
    digest_sha256: str | None
    image_path: str | None
    compatible_skus: list[str]
    source_uri: str | None
    size_bytes: int | None


@dataclass(frozen=True)
class RegisteredImage(ImageView):
    changed: bool


def view(image: OsImage) -> ImageView:
    return ImageView(
        slug=image.slug,
        status=image.status.value,
        digest_sha256=image.digest_sha256,
        image_path=(image.image_metadata or {}).get("image_path"),
        compatible_skus=sorted(image.compatible_skus),
        source_uri=image.source_uri,
        size_bytes=image.size_bytes,
    )


def validate(session: Session, spec: ImageSpec) -> str:
    """The spec's normalised digest; InvalidInput or NotFound for anything wrong."""
    if not SLUG_PATTERN.match(spec.slug):
        raise InvalidInput(
            "image_slug_invalid",
            f"{spec.slug!r} is not an image slug (lower case letters, digits, '.', '_', '-')",
            {"slug": spec.slug},
        )
    digest = spec.digest_sha256.strip().lower()
    if not re.match(SHA256_PATTERN, digest):
        raise InvalidInput(
            "image_digest_invalid",
            f"{spec.digest_sha256!r} is not a sha256 digest (64 hex digits)",
            {"digest": spec.digest_sha256},
        )
    if not os.path.isabs(spec.image_path) or os.path.normpath(spec.image_path) != spec.image_path:
        raise InvalidInput(
            "image_path_invalid",
            f"{spec.image_path!r} must be an absolute, normalised path on the nodes",
            {"path": spec.image_path},
        )
    if not spec.compatible_skus:
        raise InvalidInput("image_skus_missing", "an image names at least one slice SKU", {})
    shapes = dict(
        session.execute(
            select(Sku.slug, Sku.capacity_shape).where(Sku.slug.in_(spec.compatible_skus))
        ).all()
    )
    for sku in spec.compatible_skus:
        if sku not in shapes:
            raise NotFound("sku", sku)
        if shapes[sku] != CapacityShape.GPU_SLICE:
            raise InvalidInput(
                "image_sku_not_slice",
                f"SKU {sku} is {shapes[sku].value}: only slice SKUs boot catalog images",
                {"sku": sku},
            )
    return digest


def register(
    session: Session,
    spec: ImageSpec,
    *,
    actor: str = audit_trail.DIRECT_CALLER,
    reason: str | None = None,
) -> RegisteredImage:
    """Create or update the catalog row of ``spec.slug``; returns it and whether it changed."""
    reason = audit_trail.optional_reason(reason)
    digest = validate(session, spec)
    image = session.scalars(
        select(OsImage).where(OsImage.slug == spec.slug).with_for_update()
    ).one_or_none()
    before = view(image) if image is not None else None
    if image is None:
        image = OsImage(slug=spec.slug, image_metadata={})
        session.add(image)
    image.digest_sha256 = digest
    image.compatible_skus = sorted(set(spec.compatible_skus))
    image.image_metadata = {
        **(image.image_metadata or {}),
        "image_path": spec.image_path,
        "registry_plain_http": spec.plain_http,
    }
    image.source_uri = spec.source_uri
    image.size_bytes = spec.size_bytes
    image.status = ImageStatus.ACTIVE if spec.active else ImageStatus.DISABLED
    session.flush()
    image_cache.mark_stale(session, image)
    after = view(image)
    if after != before:
        audit_trail.record(
            session,
            audit_trail.Action.IMAGE_REGISTER,
            actor,
            reason,
            f"image {spec.slug}",
            before=dataclasses.asdict(before) if before else {},
            after=dataclasses.asdict(after),
            subject={"image": spec.slug},
        )
    return RegisteredImage(**dataclasses.asdict(after), changed=after != before)


def listing(session: Session) -> list[ImageView]:
    return [view(i) for i in session.scalars(select(OsImage).order_by(OsImage.slug))]
