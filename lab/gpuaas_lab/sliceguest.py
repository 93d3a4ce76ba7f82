"""A Debian slice guest image: what a lab slice VM boots when the guest must be a real OS,
as a tenant's image is (cloud-init, OpenSSH, Python, DHCP on ifupdown), with the benchmark
harness's tools, so a benchmark capture runs inside a slice VM the slice VM flow made
(docs/slice-host.md, "Benchmark capture of a slice VM"). The busybox guest (vmguest) boots
far faster and serves every other VM test.

Built like the lab hosts' image (hostlab: mmdebstrap, GRUB at the removable-media path of
the ESP, no mounts) from a smaller recipe; cached under `sliceguest/<key>/` with its sha256
beside it, for the catalog.

    python -m gpuaas_lab.sliceguest   # prints the image record as JSON
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from gpuaas_lab import hostlab
from gpuaas_lab.vmguest import GuestImage

# Not Debian's cloud kernel: it has no AHCI driver, and a slice VM reads its NoCloud seed
# from a CD-ROM on the q35 machine's AHCI controller (without it cloud-init falls back to
# no datasource: no users, new host keys, and the readiness gate refuses the guest).
KERNEL_PACKAGE = "linux-image-amd64"
PACKAGES = (
    *hostlab.BOOTABLE_PACKAGES,
    # cloud-init writes a DHCP stanza for the seed's network-config; ifupdown needs a client.
    "isc-dhcp-client",
    KERNEL_PACKAGE,
    *hostlab.BENCHMARK_PACKAGES,
)
RECIPE = hostlab.ImageRecipe("sliceguest", PACKAGES, "slice-guest", 2048, False)


def unavailable_reason() -> str | None:
    return hostlab.unavailable_reason()


def ensure_slice_guest_image(cache_dir: Path | None = None) -> GuestImage:
    """The cached image for the current recipe (built first if needed), with its digest."""
    image = hostlab.ensure_host_image(cache_dir, recipe=RECIPE)
    path = Path(image.path)
    digest_file = path.with_name("disk.raw.sha256")
    if not digest_file.exists():
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(4 << 20), b""):
                digest.update(block)
        # Two test workers may hash at once: each writes its own file, then renames it.
        partial = digest_file.with_name(f"{digest_file.name}.{os.getpid()}")
        partial.write_text(digest.hexdigest() + "\n")
        os.replace(partial, digest_file)
    return GuestImage(
        path=str(path),
        sha256=digest_file.read_text().strip(),
        size_bytes=path.stat().st_size,
        format="raw",
        kernel_package=KERNEL_PACKAGE,
        kernel_version="",
        cache_key=image.cache_key,
        build_seconds=image.build_seconds,
        built_now=image.built_now,
    )


if __name__ == "__main__":
    print(json.dumps(asdict(ensure_slice_guest_image()), indent=2))
