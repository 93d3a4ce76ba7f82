"""The slice runtime packages the bootstrap installs bring every Python library the slice
VM modules import on the host: a Debian host provisioned without python3-pycdlib failed
its first provision in the seed phase (``pycdlib_missing``). The lab host image carries
the same list (gpuaas_lab.hostlab), since lab hosts have no route to a mirror."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuaas_lab import hostlab

ROLE = Path(__file__).resolve().parents[3] / "roles" / "slice_host_bootstrap"


def bootstrap_packages() -> list[str]:
    return yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())[
        "slice_host_bootstrap_packages"
    ]


def test_the_seed_and_libvirt_libraries_come_with_the_slice_packages() -> None:
    packages = bootstrap_packages()
    # slice_vm_seed writes the NoCloud ISO with pycdlib, the preflight and vm_domain read
    # domain XML with lxml; virtinst depends on python3-libvirt.
    assert {"python3-pycdlib", "python3-lxml", "virtinst"} <= set(packages), packages


def test_the_documented_default_and_the_lab_image_list_the_same_packages() -> None:
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())
    options = spec["argument_specs"]["main"]["options"]
    assert options["slice_host_bootstrap_packages"]["default"] == bootstrap_packages()
    assert list(hostlab.SLICE_PACKAGES) == bootstrap_packages()
