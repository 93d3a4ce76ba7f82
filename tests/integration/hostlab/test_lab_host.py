"""The lab itself: a real Debian host under QEMU reachable over SSH, the lab's refusals of
bad input, parity's verdicts on a host never bootstrapped, an image prewarmed onto it from a
registry and the benchmark harness run on it against this machine (the fresh host of
conftest.py, before test_storage_and_devices.py changes it; the deploy, bootstrap, reboot
and parity path is in test_deploy_to_parity.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.api import ControlPlane
from controlplane.enums import HostKeySource
from controlplane.hostkeys import parse_public_key
from controlplane.services.images import NODE_CACHE_DIR
from controlplane.services.inventory import NodeSpec
from flows.benchmarks import benchmark_compare
from flows.fleet import parity_sweep
from flows.images import prewarm_image
from flows.refusals import found
from gpuaas_lab import hostlab
from gpuaas_lab.hostlab import console_tail
from gpuaas_lab.registry import LocalRegistry
from gpuaas_lab.registry import unavailable_reason as registry_unavailable
from gpuaas_lab.slicehost import LAB_SKU
from tests.integration.flows.prefect_reads import table_artifact
from tests.integration.hostlab.conftest import node_task_outputs, parity_results, sh, ssh_key
from tests.unit.test_hostkeys import keygen

pytestmark = [
    pytest.mark.slow,
    pytest.mark.root,
    pytest.mark.labhost,
    pytest.mark.lab,
    pytest.mark.xdist_group("labhost"),
]


def lab_links() -> set[str]:
    """The lab's bridges and taps on this machine (other tests' links come and go)."""
    return set(
        re.findall(
            r"^\d+: (gl[bt]-[^:@]+)",
            subprocess.check_output(["ip", "-o", "link"], text=True),
            re.M,
        )
    )


def test_a_lab_host_is_a_debian_host_reachable_over_ssh(fresh: hostlab.LabHost) -> None:
    assert fresh.cloud_init_status == "done", console_tail(fresh)
    assert sh(fresh, "systemctl is-system-running || true").strip() == "running", sh(
        fresh, "systemctl --failed --no-legend"
    )
    assert sh(fresh, "readlink /proc/1/exe").strip().endswith("systemd")
    # Units (the ESP's device among them) may take minutes to start on a loaded TCG guest.
    assert sh(fresh, "systemctl show -p DefaultTimeoutStartUSec").strip().endswith("=15min")
    sshd = sh(fresh, "sshd -T")
    assert "passwordauthentication no" in sshd
    by_id = sh(fresh, "ls /dev/disk/by-id").split()
    for disk in fresh.nvme:
        assert Path(disk["by_id"]).name in by_id
        device = sh(fresh, f"readlink -f {disk['by_id']}").strip()
        assert json.loads(sh(fresh, f"nvme id-ns -o json {device}"))["eui64"] == disk["eui64"]
        assert f"nvme-eui.{disk['eui64']}" in by_id
    root = sh(fresh, "findmnt -no SOURCE /").strip()
    assert root.startswith("/dev/vda"), root
    cmdline = sh(fresh, "cat /proc/cmdline").split()
    assert "iommu=pt" not in cmdline
    assert set(hostlab.KERNEL_ARGS.split()) <= set(cmdline), cmdline


def test_an_ssh_killed_on_its_timeout_leaves_the_callers_stdin_blocking(
    fresh: hostlab.LabHost,
) -> None:
    # docs/slice-host.md, "Lab hosts under load": a killed ssh must not leave ours non-blocking.
    assert os.get_blocking(0)
    with pytest.raises(subprocess.TimeoutExpired):
        fresh.ssh("sleep", "60", timeout=5)
    assert os.get_blocking(0), "a killed ssh left this process's standard input non-blocking"


def test_bad_input_is_refused_and_changes_nothing(fresh: hostlab.LabHost, state_dir: Path) -> None:
    entries = sorted(p.name for p in state_dir.iterdir())
    before = lab_links()
    with pytest.raises(hostlab.HostLabError) as exists:
        hostlab.up(fresh.name, state_dir=state_dir)
    assert exists.value.code == "lab_host_exists"
    with pytest.raises(hostlab.HostLabError) as missing:
        hostlab.down("nosuchhost", state_dir=state_dir)
    assert missing.value.code == "lab_host_not_found"
    for bad in ("Upper", "x" * 11, "-dash", "a/b", ""):
        with pytest.raises(hostlab.HostLabError) as invalid:
            hostlab.up(bad, state_dir=state_dir)
        assert invalid.value.code == "lab_host_bad_name"
    assert sorted(p.name for p in state_dir.iterdir()) == entries
    assert lab_links() == before
    assert hostlab.get_host(fresh.name, state_dir).running()


def test_a_host_presenting_another_key_is_refused_until_an_operator_rekeys_it(
    fresh: hostlab.LabHost, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """As after a re-image, or another machine answering at the address: the store pins a
    key the host does not present, so the run is refused, naming both fingerprints."""
    stale = parse_public_key(keygen(tmp_path, "ed25519"))
    control_plane.pin_host_keys(
        fresh.name, [stale.public_line()], HostKeySource.OPERATOR, "test", "stale pin"
    )
    [row] = parity_sweep(
        hostnames=[fresh.name],
        extravars={"slice_parity_fail_on_failures": False, **ssh_key(fresh)},
    )
    presented = parse_public_key(fresh.host_public_key).fingerprint
    assert f"but the store pins ssh-ed25519 {stale.fingerprint}" in row["failed checks"], row
    assert f"presented ssh-ed25519 {presented}" in row["failed checks"], row
    rekeyed = control_plane.rekey(fresh.name, "test", "checked on the console")
    assert (rekeyed.added, rekeyed.retired) == ([presented], [stale.fingerprint])
    assert not control_plane.rekey(fresh.name, "test", "same host").changed


def test_parity_fails_a_host_never_bootstrapped_with_a_remediation_for_each_check(
    fresh: hostlab.LabHost, control_plane: ControlPlane, engine
) -> None:
    [row] = parity_sweep(
        hostnames=[fresh.name],
        extravars={"slice_parity_fail_on_failures": False, **ssh_key(fresh)},
    )
    assert row["node"] == fresh.name
    checks = parity_results(node_task_outputs(engine, "host.parity", fresh.name)[-1])
    for check in ("bridge", "dnsmasq", "nat", "ip_forward"):
        assert checks[check]["status"] == "FAIL", checks[check]
        assert checks[check]["remediation"], checks[check]
    [node] = [n for n in control_plane.list_nodes() if n.hostname == fresh.name]
    assert node.admin_state == "unavailable" and "bridge" in node.admin_state_reason, node


def test_prewarm_fetches_a_published_image_onto_the_lab_host_over_ssh(
    fresh: hostlab.LabHost, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """The registry on the host's bridge (its gateway is this machine), the image pushed
    there as an OCI artifact, the prewarm flow fetching it onto the host over its pinned
    SSH: verified in place, a second run fetches nothing."""
    if registry_unavailable():
        pytest.skip(registry_unavailable())
    image = tmp_path / "image.raw"
    image.write_bytes(os.urandom(4 << 20))
    digest = hashlib.sha256(image.read_bytes()).hexdigest()
    with LocalRegistry(tmp_path / "registry", address=fresh.gateway) as registry:
        control_plane.define_sku(LAB_SKU)
        control_plane.publish_image(
            "lab-prewarm",
            image,
            f"{registry.host}/slices/lab-prewarm:v1",
            [LAB_SKU.slug],
            plain_http=True,
        )
        extravars = ssh_key(fresh)
        state = prewarm_image("lab-prewarm", [fresh.name], extravars=extravars, return_state=True)
        assert state.is_completed(), state.message
        [row] = state.result()
        assert (row["node"], row["status"], row["fetched"]) == (fresh.name, "verified", True)
        cached = f"{NODE_CACHE_DIR}/lab-prewarm.raw"
        assert sh(fresh, f"sha256sum {cached}").split()[0] == digest
        assert sh(fresh, f"ls -A {NODE_CACHE_DIR}").split() == ["lab-prewarm.raw"]
        [copy] = control_plane.image_cache(fresh.name)
        assert (copy.status, copy.digest_sha256, copy.local_path) == ("verified", digest, cached)

        again = prewarm_image("lab-prewarm", [fresh.name], extravars=extravars, return_state=True)
        assert again.is_completed(), again.message
        assert [(r["status"], r["fetched"]) for r in again.result()] == [("verified", False)]


def test_benchmark_compare_captures_this_machine_and_a_vm_on_it(
    fresh: hostlab.LabHost, control_plane: ControlPlane, engine, tmp_path: Path
) -> None:
    """The same probe set on bare metal (this machine, by local connection) and on a VM
    running on it (the lab host, over SSH), iperf3 to a server on the VM's bridge: every
    CPU, memory and network probe measured on both sides with its command and tool version,
    GPU and RDMA skipped with their reason, the deltas, plot and verdict recorded."""
    control_plane.register_node(
        NodeSpec(
            "bm-controller",
            "region-lab-1",
            maas_tags=("gpuaas-profile-baremetal",),
            host_vars={"ansible_connection": "local", "ansible_python_interpreter": sys.executable},
        )
    )
    with open(tmp_path / "iperf3.log", "wb") as log:
        server = subprocess.Popen(
            ["iperf3", "-s", "-B", fresh.gateway, "-p", "5201"], stdout=log, stderr=log
        )
    try:
        state = benchmark_compare(
            "bm-controller",
            fresh.name,
            network_peer=fresh.gateway,
            extravars=ssh_key(fresh),
            return_state=True,
        )
    finally:
        server.terminate()
        server.wait(timeout=15)
    result = found(state)
    assert result["verdict"] in ("pass", "fail"), result
    rows = {m["metric"]: m for m in result["metrics"]}
    for metric in ("cpu_events_per_s", "memory_read_mib_s", "memory_write_mib_s", "network_gbit_s"):
        assert rows[metric]["verdict"] in ("pass", "fail"), rows[metric]
    assert rows["gpu_count"]["verdict"] == "not compared"
    assert Path(result["plot"]).read_bytes()[:4] == b"\x89PNG"
    run_id = state.state_details.flow_run_id
    for role, host in (("baseline", "bm-controller"), ("candidate", fresh.name)):
        probes = {r["probe"]: r for r in table_artifact(run_id, f"benchmark-{fresh.name}-{role}")}
        assert probes["cpu_events_per_s"]["status"] == "ok", (host, probes)
        assert "sysbench" in probes["cpu_events_per_s"]["command"], probes
        assert probes["gpu_count"]["status"] == "skipped", probes
    with engine.connect() as conn:
        [(passed, verdict)] = conn.execute(
            text(
                "SELECT e.passed, e.payload->>'verdict' FROM evidence e JOIN nodes n"
                " ON n.id = e.node_id WHERE e.kind = 'benchmark' AND n.hostname = :h"
                " AND e.node_task_id IS NULL"
            ),
            {"h": fresh.name},
        ).all()
    assert (passed, verdict) == (result["verdict"] == "pass", result["verdict"])
