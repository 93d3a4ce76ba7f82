"""The prewarm_image flow for real: a published image in Debian's docker-registry on
loopback, fetched by ``gpuaas.fleet.image_cache`` through ansible-runner onto nodes whose
cache is a directory of their own on this machine (local connection), each node's cache
row settled in the store."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.services.images import ImageSpec
from controlplane.services.inventory import NodeSpec
from flows.images import prewarm_image
from gpuaas_lab.registry import LocalRegistry
from tests.integration.test_cli import error_json, ok_json

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect")]

SKU = "h200-sxm-slice"
SLUG = "lab-prewarm"
NODES = ("p01", "p02")


@pytest.fixture
def fleet(tmp_path, database_url, monkeypatch, prefect_harness) -> tuple[ControlPlane, Path]:
    """Two slice nodes reached by local connection, each caching under its own directory."""
    monkeypatch.setenv("GPUAAS_DATABASE_URL", database_url)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    cp = ControlPlane.from_environment()
    caches = tmp_path / "caches"
    for host in NODES:
        cp.register_node(
            NodeSpec(
                host,
                "region-maas-1",
                maas_tags=("gpuaas-profile-slice-vm",),
                host_vars={
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "slice_image_cache_dir": str(caches / host),
                },
            )
        )
    return cp, caches


def publish(cp: ControlPlane, registry: LocalRegistry, path: Path, tag: str = "v1") -> str:
    path.write_bytes(os.urandom(4 << 20))
    cp.publish_image(SLUG, path, f"{registry.host}/slices/{SLUG}:{tag}", [SKU], plain_http=True)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def rows(cp: ControlPlane) -> dict[str, tuple]:
    return {r.node: (r.status, r.digest_sha256, r.local_path, r.reason) for r in cp.image_cache()}


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_prewarm_verifies_every_node_and_a_second_run_fetches_nothing(
    fleet, local_registry, tmp_path, engine
):
    cp, caches = fleet
    digest = publish(cp, local_registry, tmp_path / "image.raw")
    state = prewarm_image(SLUG, return_state=True)
    assert state.is_completed(), state.message
    assert state.message == f"{SLUG}: 2 of 2 node(s) verified"
    outcome = state.result()
    assert [(r["node"], r["status"], r["fetched"]) for r in outcome] == [
        ("p01", "verified", True),
        ("p02", "verified", True),
    ]
    for host in NODES:
        cached = caches / host / f"{SLUG}.raw"
        assert file_digest(cached) == digest
        assert rows(cp)[host] == ("verified", digest, str(cached), None)
        # Nothing but the image in the cache directory: no temporary file left behind.
        assert sorted(p.name for p in (caches / host).iterdir()) == [f"{SLUG}.raw"]
    with engine.connect() as conn:
        tasks = conn.execute(
            text("SELECT kind, state FROM node_tasks WHERE kind = 'image.cache'")
        ).all()
    assert sorted(tasks) == [("image.cache", "succeeded")] * 2

    again = prewarm_image(SLUG, hostnames=["p02"], return_state=True)
    assert again.is_completed(), again.message
    assert [(r["node"], r["status"], r["fetched"]) for r in again.result()] == [
        ("p02", "verified", False)
    ]


def test_a_corrupted_blob_fails_the_node_and_keeps_its_verified_copy(
    fleet, local_registry, tmp_path
):
    cp, caches = fleet
    digest = publish(cp, local_registry, tmp_path / "image.raw")
    assert prewarm_image(SLUG, hostnames=["p01"], return_state=True).is_completed()
    kept = caches / "p01" / f"{SLUG}.raw"
    # The registry now serves other bytes under the digest; p01 loses its copy and must
    # fetch again, p02 has never had one.
    [blob] = (local_registry.root / "data").glob(f"docker/registry/v2/blobs/sha256/*/{digest}/data")
    blob.write_bytes(os.urandom(4 << 20))
    kept.write_bytes(b"not the image")

    state = prewarm_image(SLUG, return_state=True)
    assert state.is_failed()
    assert "0 of 2 node(s) verified" in state.message and "digest_mismatch" in state.message
    for host in NODES:
        status, _, _, reason = rows(cp)[host]
        assert status == "failed" and reason.startswith("digest_mismatch"), rows(cp)
        # Neither the corrupt fetch nor a partial file is under the image's name.
        assert not (caches / host / f"{SLUG}.raw").exists() or host == "p01"
        assert [p.name for p in (caches / host).glob(".*")] == []
    # p01's file was replaced by hand before: the failed fetch left it as it was.
    assert kept.read_bytes() == b"not the image"


def test_a_republished_image_makes_the_copies_stale(fleet, local_registry, tmp_path):
    cp, caches = fleet
    first = publish(cp, local_registry, tmp_path / "image.raw")
    assert prewarm_image(SLUG, return_state=True).is_completed()
    second = publish(cp, local_registry, tmp_path / "image.raw", tag="v2")
    assert {host: row[:2] for host, row in rows(cp).items()} == {
        "p01": ("stale", first),
        "p02": ("stale", first),
    }
    assert all(f"sha256 {second}" in row[3] for row in rows(cp).values())
    assert prewarm_image(SLUG, hostnames=["p01"], return_state=True).is_completed()
    assert rows(cp)["p01"][:2] == ("verified", second)
    assert rows(cp)["p02"][0] == "stale"
    assert file_digest(caches / "p01" / f"{SLUG}.raw") == second


def test_bad_input_and_an_unreachable_registry_record_nothing(fleet, local_registry, tmp_path):
    cp, caches = fleet
    unknown = prewarm_image("lab-unknown", return_state=True)
    assert unknown.is_failed() and "lab-unknown" in unknown.message
    publish(cp, local_registry, tmp_path / "image.raw")
    no_node = prewarm_image(SLUG, hostnames=["p99"], return_state=True)
    assert no_node.is_failed() and "p99" in no_node.message

    cp.register_image(ImageSpec("lab-by-path", "a" * 64, "/var/lib/gpuaas/lab.raw", (SKU,)))
    by_path = prewarm_image("lab-by-path", return_state=True)
    assert by_path.is_failed() and by_path.message.startswith("image_not_published")

    local_registry.stop()
    gone = prewarm_image(SLUG, return_state=True)
    assert gone.is_failed() and gone.message.startswith("registry_unreachable"), gone.message
    assert rows(cp) == {}
    assert not caches.exists()


def test_the_cli_prewarms_a_node_and_lists_the_caches(fleet, local_registry, tmp_path):
    from prefect.settings import PREFECT_API_URL

    cp, caches = fleet
    digest = publish(cp, local_registry, tmp_path / "image.raw")
    env = {**os.environ, "PREFECT_API_URL": PREFECT_API_URL.value()}
    [row] = ok_json(env, "image", "prewarm", SLUG, "--node", "p02")
    assert (row["node"], row["status"], row["fetched"]) == ("p02", "verified", True)
    [listed] = ok_json(env, "image", "cache", "--node", "p02")
    assert (listed["image"], listed["status"], listed["digest_sha256"]) == (
        SLUG,
        "verified",
        digest,
    )
    assert listed["local_path"] == str(caches / "p02" / f"{SLUG}.raw")
    assert ok_json(env, "image", "cache", "--node", "p01") == []
    assert error_json(env, "image", "cache", "--node", "p99")["code"] == "node_not_found"
    refused = error_json(env, "image", "prewarm", "lab-unknown")
    assert refused["code"] == "prewarm_failed" and "lab-unknown" in refused["message"]


def test_reconcile_reverifies_the_copies_and_fails_a_changed_or_missing_file(
    fleet, local_registry, tmp_path
):
    from flows.reconcile import reconcile

    cp, caches = fleet
    digest = publish(cp, local_registry, tmp_path / "image.raw")
    assert prewarm_image(SLUG, return_state=True).is_completed()
    checks = {"wipe_cleanup": False, "release_orphans": False}
    # Checked moments ago: not due yet, nothing runs.
    assert reconcile(**checks)["images"] == []

    changed = caches / "p01" / f"{SLUG}.raw"
    with changed.open("r+b") as handle:
        handle.write(b"\0" * 16)
    (caches / "p02" / f"{SLUG}.raw").unlink()
    result = reconcile(**checks, image_verify_after_seconds=0)
    assert {(r["node"], r["status"]) for r in result["images"]} == {
        ("p01", "failed"),
        ("p02", "failed"),
    }
    reasons = {host: row[3] for host, row in rows(cp).items()}
    assert reasons["p01"].startswith("cache_stale") and reasons["p02"].startswith(
        "cache_missing"
    ), reasons
    # A failed copy is no longer re-verified; a prewarm brings it back.
    assert reconcile(**checks, image_verify_after_seconds=0)["images"] == []
    assert prewarm_image(SLUG, return_state=True).is_completed()
    assert {row[:2] for row in rows(cp).values()} == {("verified", digest)}
