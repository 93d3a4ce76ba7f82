# -*- coding: utf-8 -*-
# Copyright: gpuaas fleet engineering
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node image cache: a catalog image fetched from its registry into the node's cache
directory, verified while it streams (docs/slice-host.md, "Image cache").

The image arrives in a temporary file next to its final name and takes that name only
once its sha256 matches the catalog digest (rename in the same directory, fsync), so the
cache never holds a partial or unverified file under a final name: a digest mismatch, a
short transfer or a registry that goes away mid-way leaves whatever verified copy was
there before. ``state: verified`` only re-hashes what is cached (reconcile's check).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import os
import re
import tempfile
import time

from ansible.module_utils.urls import open_url
from ansible_collections.gpuaas.fleet.plugins.module_utils import hostfile

CHUNK = 1 << 20
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


class CacheError(Exception):
    """A fetch or check that failed; the cached file is as it was before."""

    def __init__(self, code: str, message: str, **details) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def normalize_digest(value: str) -> str:
    digest = str(value).strip().lower().removeprefix("sha256:")
    if not SHA256_RE.match(digest):
        raise CacheError("invalid_digest", f"{value!r} is not a sha256 digest")
    return digest


def file_sha256(path: str) -> str | None:
    """The file's sha256, None when there is no file."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for chunk in iter(lambda: handle.read(CHUNK), b""):
                digest.update(chunk)
    except FileNotFoundError:
        return None
    return digest.hexdigest()


def fetch(url: str, dest: str, expected: str, options: dict) -> dict:
    """Stream ``url`` into a temporary file beside ``dest``, hashing as it arrives, and
    rename it to ``dest`` only when its sha256 is ``expected``."""
    directory = os.path.dirname(os.path.abspath(dest))
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd, part = tempfile.mkstemp(prefix=f".{os.path.basename(dest)}.part-", dir=directory)
    digest, size = hashlib.sha256(), 0
    started = time.monotonic()
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                response = open_url(
                    url,
                    headers=options.get("headers") or {},
                    timeout=options.get("timeout", 60),
                    validate_certs=options.get("validate_certs", True),
                    ca_path=options.get("ca_path"),
                )
                announced = response.headers.get("Content-Length")
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
            except http.client.IncompleteRead as exc:
                received = size + len(exc.partial)
                raise CacheError(
                    "transfer_truncated",
                    f"{url} ended after {received} bytes, short of what it announced",
                    received_bytes=received,
                ) from exc
            except (OSError, http.client.HTTPException, ValueError) as exc:
                raise CacheError(
                    "transfer_failed",
                    f"fetching {url} failed after {size} bytes: {exc}",
                    received_bytes=size,
                ) from exc
            out.flush()
            os.fsync(out.fileno())
        if announced is not None and size != int(announced):
            raise CacheError(
                "transfer_truncated",
                f"{url} announced {announced} bytes and sent {size}",
                received_bytes=size,
            )
        actual = digest.hexdigest()
        if actual != expected:
            raise CacheError(
                "digest_mismatch",
                f"{url} sent {size} bytes with sha256 {actual}; the catalog says {expected}",
                actual_sha256=actual,
                received_bytes=size,
            )
        os.chmod(part, 0o644)
        os.replace(part, dest)
        hostfile.sync_directory(directory)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)
    seconds = max(time.monotonic() - started, 1e-6)
    return {
        "bytes": size,
        "seconds": round(seconds, 3),
        "throughput_mib_s": round(size / seconds / (1 << 20), 1),
    }


def run(params: dict, check_mode: bool) -> dict:
    """Converge the cached image at ``dest`` to the catalog digest."""
    expected = normalize_digest(params["sha256"])
    dest = params["dest"]
    before = file_sha256(dest)
    result = {
        "changed": False,
        "path": dest,
        "sha256": expected,
        "previous_sha256": before,
        "fetched": False,
        "status": "verified" if before == expected else ("missing" if before is None else "stale"),
    }
    if before == expected or params["state"] == "verified":
        if params["state"] == "verified" and before != expected:
            raise CacheError(
                f"cache_{result['status']}",
                f"{dest} is {result['status']}: "
                + (f"sha256 {before}, the catalog says {expected}" if before else "no such file"),
                **result,
            )
        return result
    url = params.get("url")
    if not url or not url.startswith(("http://", "https://")):
        raise CacheError("url_required", f"an http(s) URL of the image is needed, got {url!r}")
    result["changed"] = True
    if check_mode:
        return result
    try:
        result.update(fetch(url, dest, expected, params))
    except CacheError as exc:
        exc.details.update(previous_sha256=before, path=dest, kept=before is not None)
        raise
    result.update(fetched=True, status="verified")
    return result
