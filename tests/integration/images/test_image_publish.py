"""Publishing a slice image to a real OCI registry on loopback (Debian's docker-registry):
the catalog records the artifact and its digest only once the registry holds the file's
exact bytes; bad input and an unreachable registry record nothing."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import requests
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.errors import GpuaasError, InvalidInput, NotFound
from controlplane.registry import RAW_DISK_MEDIA_TYPE, blob_url
from gpuaas_lab.ports import free_port
from tests.integration.test_cli import error_json, ok_json

SKU = "h200-sxm-slice"


@pytest.fixture
def image(tmp_path) -> Path:
    path = tmp_path / "slice.raw"
    path.write_bytes(os.urandom(2 << 20))
    return path


def catalog(engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT slug, status, digest_sha256, source_uri, size_bytes,"
                " image_metadata->>'image_path' FROM os_images WHERE slug LIKE 'lab-%'"
            )
        ).all()


def test_publish_pushes_the_artifact_and_records_it(engine, local_registry, image):
    cp = ControlPlane(engine)
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    reference = f"{local_registry.host}/slices/lab-ubuntu:v1"
    published = cp.publish_image("lab-ubuntu", image, reference, [SKU], plain_http=True)
    assert (published.changed, published.digest_sha256) == (True, digest)
    assert catalog(engine) == [
        (
            "lab-ubuntu",
            "active",
            digest,
            f"oci://{reference}",
            image.stat().st_size,
            "/var/lib/gpuaas/slice-images/lab-ubuntu.raw",
        )
    ]
    # The node's URL serves exactly the image, under the raw-disk media type.
    url = blob_url(f"oci://{reference}", digest, plain_http=True)
    assert hashlib.sha256(requests.get(url, timeout=30).content).hexdigest() == digest
    manifest = requests.get(
        f"http://{local_registry.host}/v2/slices/lab-ubuntu/manifests/v1",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        timeout=30,
    ).json()
    assert [layer["mediaType"] for layer in manifest["layers"]] == [RAW_DISK_MEDIA_TYPE]

    again = cp.publish_image("lab-ubuntu", image, reference, [SKU], plain_http=True)
    assert not again.changed


def test_a_tag_moved_on_is_refused_to_the_nodes(engine, local_registry, image, tmp_path):
    cp = ControlPlane(engine)
    reference = f"{local_registry.host}/slices/lab-moved:v1"
    first = cp.publish_image("lab-moved", image, reference, [SKU], plain_http=True)
    other = tmp_path / "other.raw"
    other.write_bytes(b"another image")
    # Someone else pushes another image under the same tag, outside the catalog.
    cp.publish_image("lab-other", other, reference, [SKU], plain_http=True)
    with pytest.raises(GpuaasError) as moved:
        blob_url(f"oci://{reference}", first.digest_sha256, plain_http=True)
    assert moved.value.code == "registry_image_moved"


@pytest.mark.parametrize(
    ("change", "error", "code"),
    [
        ({"slug": "Not A Slug"}, InvalidInput, "image_slug_invalid"),
        ({"skus": ["no-such-sku"]}, NotFound, "sku_not_found"),
        ({"reference": "not a reference"}, InvalidInput, "registry_reference_invalid"),
        ({"image_file": Path("/nonexistent.raw")}, InvalidInput, "image_file_missing"),
        (
            {"reference": f"127.0.0.1:{free_port()}/slices/x:v1"},
            GpuaasError,
            "registry_unreachable",
        ),
    ],
)
def test_bad_input_or_no_registry_records_nothing(
    engine, local_registry, image, change, error, code
):
    cp = ControlPlane(engine)
    arguments = {
        "slug": "lab-bad",
        "image_file": image,
        "reference": f"{local_registry.host}/slices/lab-bad:v1",
        "skus": [SKU],
        **change,
    }
    with pytest.raises(error) as refused:
        cp.publish_image(plain_http=True, **arguments)
    assert refused.value.code == code
    assert catalog(engine) == []


def test_cli_publish_and_list(cli_env, local_registry, image):
    published = ok_json(
        cli_env,
        "image",
        "publish",
        "lab-cli",
        "--file",
        str(image),
        "--registry",
        f"{local_registry.host}/slices/lab-cli:v2",
        "--sku",
        SKU,
        "--plain-http",
    )
    assert published["source_uri"] == f"oci://{local_registry.host}/slices/lab-cli:v2"
    listed = {row["slug"]: row for row in ok_json(cli_env, "image", "list")}
    assert listed["lab-cli"]["digest_sha256"] == published["digest_sha256"]
    refused = error_json(
        cli_env, "image", "publish", "lab-x", "--file", str(image), "--registry", "x", "--sku", SKU
    )
    assert refused["code"] == "registry_reference_invalid"
