"""Node image caches: which node holds which catalog image, verified, and why not.

The prewarm flow fetches a published image (``oci://`` source) onto nodes with
``gpuaas.fleet.image_cache``, and reconcile re-verifies what the nodes hold; each outcome
settles the node's row here (docs/slice-host.md, "Image cache"):

- ``verified``: the node's file has the catalog's digest;
- ``failed``: the fetch or re-verification failed, with the module's reason (the node
  keeps any earlier copy, which no longer counts);
- ``stale``: the node verified a digest the catalog has moved on from (republished
  meanwhile); a republish marks every other copy stale at once.

Provisioning a published image uses only nodes whose row is ``verified`` for the
catalog's digest.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from controlplane.enums import ImageCacheStatus, ImageStatus
from controlplane.errors import InvalidInput, NotFound
from controlplane.models import Node, NodeImageCache, OsImage


@dataclass(frozen=True)
class PrewarmImage:
    """What the nodes need to fetch ``slug``: the artifact, its digest and where it goes
    (``path``; a node's ``slice_image_cache_dir`` host variable keeps the file name in
    another directory, and the row records the path the node reports)."""

    slug: str
    source_uri: str
    sha256: str
    path: str
    size_bytes: int | None
    plain_http: bool


@dataclass(frozen=True)
class CacheView:
    node: str
    image: str
    status: str
    digest_sha256: str | None
    catalog_sha256: str | None
    local_path: str | None
    verified_at: str | None
    checked_at: str | None
    reason: str | None


@dataclass(frozen=True)
class CachedCopy:
    """A verified copy to re-verify: the node, the image and the file."""

    node: str
    image: str
    sha256: str
    path: str


def published_image(session: Session, slug: str) -> PrewarmImage:
    """The catalog image ``slug`` as nodes fetch it; refused unless it is active and was
    published to a registry."""
    image = session.scalars(select(OsImage).where(OsImage.slug == slug)).one_or_none()
    if image is None:
        raise NotFound("image", slug)
    if image.status != ImageStatus.ACTIVE:
        raise InvalidInput(
            "image_not_active",
            f"image {slug} is {image.status.value}; only active images are prewarmed",
            {"image": slug, "status": image.status.value},
        )
    if not image.source_uri or not image.digest_sha256:
        raise InvalidInput(
            "image_not_published",
            f"image {slug} has no registry source; publish it (gpuaas image publish) to "
            "prewarm nodes from a registry",
            {"image": slug},
        )
    metadata = image.image_metadata or {}
    return PrewarmImage(
        slug=image.slug,
        source_uri=image.source_uri,
        sha256=image.digest_sha256,
        path=metadata["image_path"],
        size_bytes=image.size_bytes,
        plain_http=bool(metadata.get("registry_plain_http")),
    )


def _row(session: Session, node: Node, image: OsImage) -> NodeImageCache:
    row = session.scalars(
        select(NodeImageCache)
        .where(NodeImageCache.node_id == node.id, NodeImageCache.image_id == image.id)
        .with_for_update()
    ).one_or_none()
    if row is None:
        row = NodeImageCache(node_id=node.id, image_id=image.id, status=ImageCacheStatus.MISSING)
        session.add(row)
    return row


def settle(
    session: Session,
    hostname: str,
    slug: str,
    node_task_id: uuid.UUID | None,
    result: dict[str, Any] | None,
    failure: str | None,
    now: dt.datetime,
) -> CacheView:
    """Record one node's fetch or re-verification of ``slug``: ``result`` is the module's
    return on success; ``failure`` says why it failed otherwise."""
    node = session.scalars(select(Node).where(Node.hostname == hostname)).one_or_none()
    if node is None:
        raise NotFound("node", hostname)
    image = session.scalars(select(OsImage).where(OsImage.slug == slug)).one_or_none()
    if image is None:
        raise NotFound("image", slug)
    row = _row(session, node, image)
    row.checked_at = now
    row.node_task_id = node_task_id
    if failure is not None or not result or not result.get("sha256"):
        row.status = ImageCacheStatus.FAILED
        row.reason = failure or "the node reported no digest"
    elif result["sha256"] != image.digest_sha256:
        row.status = ImageCacheStatus.STALE
        row.digest_sha256 = result["sha256"]
        row.local_path = result.get("path") or row.local_path
        row.reason = f"the catalog moved on to sha256 {image.digest_sha256}"
    else:
        row.status = ImageCacheStatus.VERIFIED
        row.digest_sha256 = result["sha256"]
        row.local_path = result["path"]
        row.verified_at = now
        row.reason = None
    session.flush()
    return _view(row, node.hostname, image)


def mark_stale(session: Session, image: OsImage) -> int:
    """Every copy of ``image`` verified for another digest than the catalog's is stale
    (called when the catalog row's digest changes)."""
    marked = session.execute(
        update(NodeImageCache)
        .where(
            NodeImageCache.image_id == image.id,
            NodeImageCache.status == ImageCacheStatus.VERIFIED,
            NodeImageCache.digest_sha256 != image.digest_sha256,
        )
        .values(
            status=ImageCacheStatus.STALE,
            reason=f"the catalog moved on to sha256 {image.digest_sha256}",
        )
    )
    return marked.rowcount


def _view(row: NodeImageCache, hostname: str, image: OsImage) -> CacheView:
    return CacheView(
        node=hostname,
        image=image.slug,
        status=row.status.value,
        digest_sha256=row.digest_sha256,
        catalog_sha256=image.digest_sha256,
        local_path=row.local_path,
        verified_at=row.verified_at.isoformat() if row.verified_at else None,
        checked_at=row.checked_at.isoformat() if row.checked_at else None,
        reason=row.reason,
    )


def listing(
    session: Session, hostname: str | None = None, slug: str | None = None
) -> list[CacheView]:
    """Cache rows by node then image, optionally of one node or one image."""
    query = (
        select(NodeImageCache, Node.hostname, OsImage)
        .join(Node, Node.id == NodeImageCache.node_id)
        .join(OsImage, OsImage.id == NodeImageCache.image_id)
        .order_by(Node.hostname, OsImage.slug)
    )
    if hostname is not None:
        if session.scalars(select(Node.id).where(Node.hostname == hostname)).first() is None:
            raise NotFound("node", hostname)
        query = query.where(Node.hostname == hostname)
    if slug is not None:
        query = query.where(OsImage.slug == slug)
    return [_view(row, host, image) for row, host, image in session.execute(query)]


def verified_copies(
    session: Session, checked_before: dt.datetime | None = None
) -> list[CachedCopy]:
    """The copies counted as verified, those last checked before ``checked_before`` only
    when given (reconcile re-verifies them)."""
    query = (
        select(Node.hostname, OsImage.slug, NodeImageCache.digest_sha256, NodeImageCache.local_path)
        .join(Node, Node.id == NodeImageCache.node_id)
        .join(OsImage, OsImage.id == NodeImageCache.image_id)
        .where(NodeImageCache.status == ImageCacheStatus.VERIFIED)
        .order_by(Node.hostname, OsImage.slug)
    )
    if checked_before is not None:
        query = query.where(
            or_(NodeImageCache.checked_at.is_(None), NodeImageCache.checked_at < checked_before)
        )
    return [CachedCopy(*row) for row in session.execute(query)]
