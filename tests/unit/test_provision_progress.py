"""How far a failed provision got: the slice_vm_provision role's failure record names it
per phase, and the provision flow reads it conservatively (docs/operations.md, "Failed
provisions")."""

from __future__ import annotations

import re

import jinja2
import pytest
import yaml

from controlplane.enums import ProvisionProgress
from flows.allocation import provision_progress
from tests.conftest import REPO_ROOT

ROLE = REPO_ROOT / "roles" / "slice_vm_provision"


def role_phases() -> list[str]:
    """The phases in the order the role's timings template walks them."""
    template = (ROLE / "templates" / "timings.j2").read_text()
    return re.findall(r"^\s*\('(\w+)',", template, re.MULTILINE)


def role_progress(phase: str) -> str:
    """The progress the role's failure record gives a failure in ``phase``."""
    tasks = yaml.safe_load((ROLE / "tasks" / "failed.yml").read_text())
    record = next(t for t in tasks if t["name"] == "Record the failure evidence")
    expression = record["ansible.builtin.set_fact"]["slice_vm_provision_result"]["progress"]
    return jinja2.Template(expression).render(slice_vm_provision_failed_phase=phase).strip()


def test_the_role_walks_the_phases_the_mapping_expects():
    assert role_phases() == ["preflight", "image", "seed", "dhcp", "domain", "readiness"]


@pytest.mark.parametrize(
    ("phase", "progress"),
    [
        ("preflight", "nothing_on_host"),
        # The seed is written after the image clone, with the reservation and the domain.
        ("image", "disk_written"),
        ("seed", "disk_written"),
        ("dhcp", "disk_written"),
        ("domain", "disk_written"),
        ("readiness", "disk_written"),
        # A phase the role does not know yet is treated as the worst case.
        ("inventory", "disk_written"),
    ],
)
def test_each_failed_phase_names_how_far_the_provision_got(phase, progress):
    assert role_progress(phase) == progress
    assert ProvisionProgress(role_progress(phase))


@pytest.mark.parametrize(
    ("evidence", "progress"),
    [
        ({"progress": "nothing_on_host"}, ProvisionProgress.NOTHING_ON_HOST),
        ({"progress": "domain_defined"}, ProvisionProgress.DOMAIN_DEFINED),
        ({"progress": "disk_written"}, ProvisionProgress.DISK_WRITTEN),
        # No record (the playbook never ran, the run blew up) or one the flow cannot read.
        ({}, ProvisionProgress.DISK_WRITTEN),
        ({"progress": None}, ProvisionProgress.DISK_WRITTEN),
        ({"progress": "halfway"}, ProvisionProgress.DISK_WRITTEN),
        ({"progress": ["nothing_on_host"]}, ProvisionProgress.DISK_WRITTEN),
    ],
)
def test_the_flow_reads_the_progress_and_assumes_the_worst_otherwise(evidence, progress):
    assert provision_progress(evidence) is progress
