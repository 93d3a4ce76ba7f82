"""Prewarm throughput: a published image from an OCI registry into a node's cache.

One run, one registry (Debian's docker-registry on loopback, gpuaas_lab.registry), one
image of ``--image-mib`` MiB (default 1 GiB) published with ``gpuaas image publish``'s
code path, then, alternating, ``--repeat`` times each:

1. Baseline: ``curl -s BLOB_URL | sha256sum`` of the same blob (the transfer and the hash,
   nothing written).
2. ``gpuaas.fleet.image_cache`` as a node runs it: ``playbooks/image_cache.yml`` by
   ``ansible-playbook`` (local connection) into an empty cache directory: streamed,
   hashed while it streams, written beside the destination, fsynced, renamed. The
   module's own figure (transfer + verification, no Ansible start-up) is printed too.
3. The same playbook again on the filled cache (``state: present``, the file is hashed and
   nothing is fetched): what a repeated prewarm costs a node.

Prints MiB/s for each and the ratio of the module's throughput to the baseline's.

    .venv/bin/python bench/prewarm.py [--image-mib 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "lab"))

from controlplane.registry import Reference, blob_url, publish  # noqa: E402
from gpuaas_lab.registry import LocalRegistry, unavailable_reason  # noqa: E402

CHUNK = 4 << 20


def write_image(path: Path, mib: int) -> str:
    """A raw image of random bytes (incompressible, like a real one on the wire)."""
    digest = hashlib.sha256()
    with path.open("wb") as handle:
        for _ in range(mib // 4):
            chunk = os.urandom(CHUNK)
            digest.update(chunk)
            handle.write(chunk)
    return digest.hexdigest()


def curl_sha256(url: str) -> tuple[float, str]:
    started = time.perf_counter()
    out = subprocess.run(
        f"curl -sf {url} | sha256sum", shell=True, check=True, capture_output=True, text=True
    ).stdout
    return time.perf_counter() - started, out.split()[0]


def playbook(cache: Path, image: dict, workdir: Path) -> tuple[float, dict]:
    """``image_cache.yml`` on a local node caching under ``cache``; wall time and the
    module's result (from the json callback)."""
    inventory = workdir / "inventory.ini"
    inventory.write_text(
        f"node ansible_connection=local ansible_python_interpreter={sys.executable}"
        f" slice_image_cache_dir={cache}\n"
    )
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(REPO_ROOT / "ansible.cfg"),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_COLLECTIONS_PATH": str(REPO_ROOT / ".collections"),
    }
    started = time.perf_counter()
    proc = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            str(inventory),
            str(REPO_ROOT / "playbooks" / "image_cache.yml"),
            "-e",
            json.dumps({"gpuaas_image_cache": [image]}),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"image_cache.yml failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-2000:]}")
    # The role's own task comes after its argument validation.
    task = json.loads(proc.stdout)["plays"][0]["tasks"][-1]
    [result] = task["hosts"]["node"]["results"]
    return elapsed, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"prewarm bench: skipped ({reason})")
        return 0
    mib = args.image_mib - args.image_mib % 4
    with tempfile.TemporaryDirectory(prefix="gpuaas-prewarm-bench-") as tmp:
        work = Path(tmp)
        image_file = work / "image.raw"
        digest = write_image(image_file, mib)
        with LocalRegistry(work / "registry") as registry:
            reference = Reference.parse(f"{registry.host}/bench/prewarm:v1")
            started = time.perf_counter()
            publish(reference, image_file, plain_http=True)
            published_s = time.perf_counter() - started
            image_file.unlink()
            url = blob_url(reference.source_uri, digest, plain_http=True)
            image = {
                "image": "bench",
                "path": "/nonexistent/bench.raw",
                "sha256": digest,
                "url": url,
            }
            curl, fetch, module, rehash = [], [], [], []
            for _ in range(args.repeat):
                seconds, seen = curl_sha256(url)
                if seen != digest:
                    raise SystemExit(f"curl | sha256sum saw {seen}, published {digest}")
                curl.append(seconds)
                cache = work / "cache"
                shutil.rmtree(cache, ignore_errors=True)
                seconds, result = playbook(cache, image, work)
                if not result.get("fetched") or result["sha256"] != digest:
                    raise SystemExit(f"the module did not fetch the image: {result}")
                fetch.append(seconds)
                module.append(result["seconds"])
                seconds, result = playbook(cache, image, work)
                if result.get("fetched") or result.get("changed"):
                    raise SystemExit(f"a second prewarm fetched again: {result}")
                rehash.append(seconds)
    load = os.getloadavg()[0]

    def rate(seconds: list[float]) -> str:
        best, median = min(seconds), statistics.median(seconds)
        return f"{mib / median:7.1f} MiB/s median, {mib / best:7.1f} best ({median:.2f} s)"

    print(f"image: {mib} MiB, published in {published_s:.1f} s; {args.repeat} runs each")
    print(f"curl | sha256sum (baseline)       {rate(curl)}")
    print(f"image_cache.yml, empty cache      {rate(fetch)}")
    print(f"  the module alone (no Ansible)   {rate(module)}")
    print(f"image_cache.yml, cache filled     {rate(rehash)}  (hash only, nothing fetched)")
    print(
        "ratio to the baseline (median): playbook "
        f"x{statistics.median(curl) / statistics.median(fetch):.2f}, module "
        f"x{statistics.median(curl) / statistics.median(module):.2f}"
    )
    print(f"load average: {load:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
