"""The committed MAAS commissioning script, run as MAAS runs it, against recorded hosts.

The only stand-in is RACADM (a BIOS cannot exist here): a script on PATH answering from
recorded output and logging its calls. Everything else is the real file executed by the
system Python (the ephemeral environment's interpreter, without the collection).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.gpuaas.fleet.plugins.module_utils import firmware_preflight as fp
from ansible_collections.gpuaas.fleet.plugins.module_utils import parity, sysfs

from gpuaas_lab import hosttrees

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "scripts" / "maas" / "commissioning" / "50-gpuaas-slice-firmware-preflight"
BUILDER = REPO_ROOT / "scripts" / "maas" / "build_commissioning_script.py"
SYSTEM_PYTHON = "/usr/bin/python3"
FAKE_RACADM = """#!/bin/sh
echo "$*" >> "$RACADM_LOG"
case "$1 $2" in
  "get BIOS.ProcSettings") cat "$RACADM_DIR/proc" ;;
  "get BIOS.IntegratedDevices") cat "$RACADM_DIR/devices" ;;
  "jobqueue create") echo "Commit JID = JID_763788807801" ;;
  *) echo "Object value modified successfully" ;;
esac
"""
PROC = "[Key=BIOS.Setup.1-1#ProcSettings]\nLogicalProc=Enabled\nProcVirtualization=Disabled\n"
DEVICES = "[Key=BIOS.Setup.1-1#IntegratedDevices]\nSriovGlobalEnable=Enabled\n"
SCENARIOS = ["h200", "h200-rebooted", "clean", "duplicate-fabric", "missing-vfs"]


def metadata(text: str) -> dict:
    start = text.index("# --- Start MAAS 1.0 script metadata ---")
    end = text.index("# --- End MAAS 1.0 script metadata ---")
    body = text[start:end].splitlines()[1:]
    return yaml.safe_load("\n".join(line[2:] for line in body))


@pytest.fixture
def racadm(tmp_path: Path) -> dict:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "racadm").write_text(FAKE_RACADM)
    (bindir / "racadm").chmod(0o755)
    (tmp_path / "proc").write_text(PROC)
    (tmp_path / "devices").write_text(DEVICES)
    return {
        "PATH": f"{bindir}:/usr/sbin:/usr/bin:/sbin:/bin",
        "RACADM_DIR": str(tmp_path),
        "RACADM_LOG": str(tmp_path / "racadm.log"),
        "HOME": str(tmp_path),
    }


def run_script(root: Path, env: dict, result_path: Path, **extra: str):
    return subprocess.run(
        [SYSTEM_PYTHON, str(SCRIPT), "--root", str(root)],
        env={**env, "RESULT_PATH": str(result_path), **extra},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def tree(tmp_path: Path, scenario: str) -> Path:
    spec = hosttrees.SCENARIOS[scenario]("j22u05")
    spec = dataclasses.replace(
        spec, extra_files={**spec.extra_files, "sys/firmware/acpi/tables/DMAR": "DMAR"}
    )
    return hosttrees.write_tree(spec, tmp_path / scenario)


def test_the_committed_script_is_built_from_the_current_module_utils() -> None:
    proc = subprocess.run(
        [SYSTEM_PYTHON, str(BUILDER), "--check"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr


def test_maas_metadata_header() -> None:
    meta = metadata(SCRIPT.read_text())
    assert meta["name"] == "50-gpuaas-slice-firmware-preflight"
    assert meta["script_type"] == "commissioning"
    assert meta["destructive"] is False and meta["may_reboot"] is True
    assert set(meta["results"]) == set(fp.result_document([], {})["results"])
    assert os.access(SCRIPT, os.X_OK)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_output_parses_into_the_results_the_parity_module_reports(
    tmp_path: Path, racadm: dict, scenario: str
) -> None:
    root = tree(tmp_path, scenario)
    result_path = tmp_path / "result.yaml"
    proc = run_script(root, racadm, result_path)
    results, summary = parity.parse_lines(proc.stdout.splitlines())
    # The same checks the collection computes for this host, structure for structure.
    expected, _evidence = fp.collect(str(root), runner=fp.run_command, which=lambda n: None)
    by_check = {r["check"]: r for r in results}
    for item in expected:
        if not item["check"].startswith("bios_"):
            assert by_check[item["check"]] == item
    # kvm and iommu are exactly what gpuaas.fleet.slice_parity reports for the host.
    context = parity.ParityContext(host=sysfs.HostRoot(str(root)))
    for item in parity.run_checks(context, ["kvm", "iommu"]):
        assert by_check[item["check"]] == item
    assert summary == parity.summarize(results)
    document = yaml.safe_load(result_path.read_text())
    assert document["status"] == fp.maas_status(results)
    assert document["results"]["gpuaas_slice_lines"] == parity.format_lines(results)[:-1]
    assert proc.returncode == (1 if document["status"] == fp.MAAS_FAILED else 0)
    assert by_check["bios_proc_virtualization"]["status"] == parity.FAIL
    log = Path(racadm["RACADM_LOG"]).read_text().splitlines()
    assert log == ["get BIOS.IntegratedDevices", "get BIOS.ProcSettings"], "read-only"


def test_bios_changes_only_with_the_apply_switch(tmp_path: Path, racadm: dict) -> None:
    root = tree(tmp_path, "clean")
    proc = run_script(root, racadm, tmp_path / "r.yaml", GPUAAS_SLICE_APPLY_BIOS="1")
    assert "GPUAAS_SLICE_PREFLIGHT mode=apply" in proc.stdout
    log = Path(racadm["RACADM_LOG"]).read_text().splitlines()
    assert log[2:] == [
        "set BIOS.ProcSettings.ProcVirtualization Enabled",
        "jobqueue create BIOS.Setup.1-1 -r pwrcycle -s TIME_NOW",
    ]
    results, _summary = parity.parse_lines(proc.stdout.splitlines())
    applied = next(r for r in results if r["check"] == "bios_apply")
    assert applied["status"] == parity.WARN and "JID_763788807801" in applied["detail"]


def test_nvme_inventory_survives_a_reboot_shuffle(tmp_path: Path, racadm: dict) -> None:
    """Kernel names move across a reboot (nvme4n1 -> nvme7n1 for the BOSS disk); the
    stable identities, sizes, mounts and the OS-disk verdict do not."""

    def disks(scenario: str) -> dict[str, tuple[str, str, str]]:
        proc = run_script(tree(tmp_path, scenario), racadm, tmp_path / "r.yaml")
        results, _summary = parity.parse_lines(proc.stdout.splitlines())
        found = {}
        for item in results:
            if item["check"].startswith("nvme:"):
                words = item["detail"].split()
                identity = next(w for w in words if w.startswith("/dev/disk/by-id/"))
                size = next(w for w in words if w.endswith("B") and w[:-1].isdigit())
                mounts = next(w for w in words if w.startswith("mounts="))
                found[identity] = (size, mounts, item["detail"].startswith("OS disk"))
        return found

    before, after = disks("h200"), disks("h200-rebooted")
    assert len(before) == 9 and before == after
    assert sum(1 for _size, _mounts, os_disk in after.values() if os_disk) == 1
