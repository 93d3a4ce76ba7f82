"""The node image cache module against a real HTTP server on loopback: an image arrives
verified while it streams, a second run fetches nothing, and a corrupted blob, a short
transfer or a server that goes away mid-way leave the previous verified copy and no
partial file (run as Ansible runs it on a host)."""

from __future__ import annotations

import hashlib
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.ansible_helpers import run_module

IMAGE = os.urandom(3 << 20) + b"gpuaas-lab-image"
DIGEST = hashlib.sha256(IMAGE).hexdigest()
OLD = b"the previous verified image"
OLD_DIGEST = hashlib.sha256(OLD).hexdigest()


class Blobs(http.server.BaseHTTPRequestHandler):
    """/good: the image; /corrupt: one byte flipped; /short: announces the full length and
    closes after half; /gone: no length, half the image, then the connection drops."""

    def do_GET(self) -> None:
        body = IMAGE
        if self.path == "/corrupt":
            body = IMAGE[:100] + bytes([IMAGE[100] ^ 1]) + IMAGE[101:]
        if self.path not in ("/good", "/corrupt", "/short", "/gone"):
            self.send_error(404)
            return
        self.send_response(200)
        if self.path != "/gone":
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.path in ("/short", "/gone"):
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        return


@pytest.fixture
def registry() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Blobs)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def cache(tmp_path: Path, **args) -> dict:
    return run_module(
        "image_cache", {"dest": str(tmp_path / "cache" / "lab.raw"), **args}, tmp_path
    )


def files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "cache").iterdir())


def test_fetch_verifies_while_streaming_and_a_second_run_changes_nothing(tmp_path, registry):
    planned = run_module(
        "image_cache",
        {"dest": str(tmp_path / "cache" / "lab.raw"), "sha256": DIGEST, "url": f"{registry}/good"},
        tmp_path,
        check=True,
    )
    assert (planned["changed"], planned["status"], planned["fetched"]) == (True, "missing", False)
    assert not (tmp_path / "cache").exists()

    fetched = cache(tmp_path, sha256=f"sha256:{DIGEST}", url=f"{registry}/good")
    assert fetched["rc"] == 0, fetched
    assert (fetched["changed"], fetched["fetched"], fetched["status"]) == (True, True, "verified")
    assert fetched["bytes"] == len(IMAGE) and fetched["previous_sha256"] is None
    assert (tmp_path / "cache" / "lab.raw").read_bytes() == IMAGE
    assert files(tmp_path) == ["lab.raw"]

    again = cache(tmp_path, sha256=DIGEST, url=f"{registry}/good")
    assert (again["changed"], again["fetched"], again["status"]) == (False, False, "verified")
    verified = cache(tmp_path, sha256=DIGEST, state="verified")
    assert (verified["rc"], verified["changed"]) == (0, False)


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/corrupt", "digest_mismatch"),
        ("/short", "transfer_truncated"),
        ("/gone", "digest_mismatch"),
        ("/missing", "transfer_failed"),
    ],
)
def test_a_bad_transfer_keeps_the_previous_verified_copy(tmp_path, registry, path, code):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "lab.raw").write_bytes(OLD)
    failed = cache(tmp_path, sha256=DIGEST, url=f"{registry}{path}")
    assert failed["rc"] != 0 and failed["failed"], failed
    assert failed["code"] == code, failed
    assert (failed["kept"], failed["previous_sha256"]) == (True, OLD_DIGEST)
    assert (tmp_path / "cache" / "lab.raw").read_bytes() == OLD
    assert files(tmp_path) == ["lab.raw"]


def test_a_registry_that_is_gone_leaves_nothing_behind(tmp_path):
    failed = cache(tmp_path, sha256=DIGEST, url="http://127.0.0.1:9/blob", timeout=5)
    assert failed["code"] == "transfer_failed" and failed["kept"] is False, failed
    assert files(tmp_path) == []


def test_reverification_reports_a_changed_or_missing_file(tmp_path):
    missing = cache(tmp_path, sha256=DIGEST, state="verified")
    assert (missing["code"], missing["status"]) == ("cache_missing", "missing"), missing
    (tmp_path / "cache").mkdir(exist_ok=True)
    (tmp_path / "cache" / "lab.raw").write_bytes(OLD)
    stale = cache(tmp_path, sha256=DIGEST, state="verified")
    assert (stale["code"], stale["previous_sha256"]) == ("cache_stale", OLD_DIGEST), stale
    assert (tmp_path / "cache" / "lab.raw").read_bytes() == OLD


@pytest.mark.parametrize(
    ("args", "code"),
    [
        ({"sha256": "not-a-digest", "url": "http://127.0.0.1:9/x"}, "invalid_digest"),
        ({"sha256": DIGEST}, "url_required"),
        ({"sha256": DIGEST, "url": "file:///etc/passwd"}, "url_required"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(tmp_path, args, code):
    refused = cache(tmp_path, **args)
    assert refused["code"] == code, refused
    assert not (tmp_path / "cache").exists()
