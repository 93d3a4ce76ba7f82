"""The gpuaas CLI as an operator runs it: real process, real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib import resources

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from controlplane.api import ControlPlane
from gpuaas_lab.ports import free_port
from gpuaas_lab.slicehost import unavailable_reason
from tests.integration.wipe_proofs import pin_node_key, sign, wipe_proof

DEMO_DATA = resources.files("gpuaas_lab.demo_data")


def gpuaas(env, *args, stdin=None):
    return subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        input=stdin,
        timeout=900,
    )


def ok_json(env, *args, stdin=None):
    proc = gpuaas(env, *args, "--json", stdin=stdin)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def error_json(env, *args):
    proc = gpuaas(env, *args, "--json")
    assert proc.returncode != 0
    return json.loads(proc.stdout)["error"]


def counts(engine):
    with engine.connect() as conn:
        return [
            conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("nodes", "node_resource_slots", "node_tasks", "evidence")
        ]


@pytest.fixture
def registered(cli_env):
    for host in ("j22u05", "j22u15"):
        ok_json(
            cli_env,
            "node",
            "register",
            host,
            "--region",
            "r1",
            "--tag",
            "gpuaas-profile-slice-vm",
            "--subnet",
            "10.100.0.0/24",
        )
    return cli_env


def test_register_sets_how_many_host_actions_a_node_admits(registered):
    default = ok_json(registered, "node", "register", "n7", "--region", "r1")
    assert default["host_action_limit"] == 4
    raised = ok_json(registered, "node", "register", "n7", "--region", "r1", "--host-actions", "8")
    assert (raised["created"], raised["host_action_limit"]) == (False, 8)


def test_register_import_approve_list_occupancy(registered, tmp_path):
    env = registered
    nodes = ok_json(env, "node", "list")
    assert [n["hostname"] for n in nodes] == ["j22u05", "j22u15"]
    source = str(DEMO_DATA.joinpath("j22u15.json"))
    imported = ok_json(env, "slots", "import", "--node", "j22u15", "--from", source)
    assert imported["approvable"] == list(range(8))
    approved = ok_json(env, "slots", "approve", "--node", "j22u15", "--slot", "0", "--slot", "1")
    assert approved["approved"] == [0, 1]
    slots = ok_json(env, "slots", "list", "--node", "j22u15")
    assert [s["status"] for s in slots[:3]] == ["available", "available", "disabled"]
    occupancy = ok_json(env, "occupancy")
    slice_sku = next(s for s in occupancy["skus"] if s["sku"] == "h200-sxm-slice")
    assert slice_sku["free_gpus"] == 2
    human = gpuaas(env, "slots", "list")
    assert human.returncode == 0 and "available" in human.stdout


def test_import_accepts_the_modules_result_unchanged_and_stdin(registered):
    env = registered
    doc = json.loads(DEMO_DATA.joinpath("j22u15.json").read_text())
    module_result = json.dumps({"changed": False, "topology": doc})
    imported = ok_json(
        env, "slots", "import", "--node", "j22u15", "--from", "-", stdin=module_result
    )
    assert imported["created"] == list(range(8))


def test_bad_input_gives_a_clear_error_and_writes_nothing(registered, engine, tmp_path):
    env = registered
    before = counts(engine)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    no_slots = json.loads(DEMO_DATA.joinpath("j22u15.json").read_text())
    del no_slots["candidate_slots"]
    truncated = tmp_path / "truncated.json"
    truncated.write_text(json.dumps(no_slots))
    cases = [
        (("slots", "import", "--node", "j22u15", "--from", str(truncated)), "topology_malformed"),
        (("node", "register", "n9", "--region", "r1", "--var", "novalue"), "host_var_invalid"),
        (("node", "register", "n9", "--region", "r1", "--var", "=value"), "host_var_invalid"),
        (("slots", "import", "--node", "j22u15", "--from", str(broken)), "json_invalid"),
        (
            ("slots", "import", "--node", "j22u15", "--from", str(tmp_path / "nope.json")),
            "file_unreadable",
        ),
        (
            (
                "slots",
                "import",
                "--node",
                "nosuch",
                "--from",
                str(DEMO_DATA.joinpath("j22u15.json")),
            ),
            "node_not_found",
        ),
        (
            (
                "slots",
                "import",
                "--node",
                "j22u05",
                "--from",
                str(DEMO_DATA.joinpath("j22u15.json")),
            ),
            "topology_node_mismatch",
        ),
        (("slots", "approve", "--node", "j22u15"), "no_topology"),
        (("node", "register", "Not_A_Host", "--region", "r1"), "hostname_invalid"),
        (("node", "register", "n9", "--region", "r1", "--subnet", "10.0.0.0/33"), "subnet_invalid"),
        (
            ("node", "register", "n9", "--region", "r1", "--host-actions", "0"),
            "host_action_limit_invalid",
        ),
        (("node", "drain", "j22u15", "--reason", " "), "reason_required"),
        (
            ("slots", "disable", "--node", "j22u15", "--slot", "3", "--reason", "x"),
            "slot_not_found",
        ),
    ]
    for args, code in cases:
        error = error_json(env, *args)
        assert error["code"] == code, (args, error)
        assert error["message"]
        assert "details" in error
    assert counts(engine) == before


@pytest.mark.parametrize(
    ("args", "parameter"),
    [
        (("alloc", "create", "--gpus", "2"), "sku"),
        (("alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "two"), "gpus"),
        (("slots", "approve", "--node", "j22u15", "--bogus"), None),
        (("nodes", "list"), None),
    ],
    ids=["missing_option", "not_an_integer", "unknown_option", "unknown_command"],
)
def test_usage_errors_follow_the_error_contract(registered, engine, args, parameter):
    before = counts(engine)
    proc = gpuaas(registered, *args, "--json")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error = json.loads(proc.stdout)["error"]
    assert error["code"] == "usage" and error["message"]
    assert error["details"].get("parameter") == parameter
    human = gpuaas(registered, *args)
    assert human.returncode == 2 and human.stdout == "" and "Error" in human.stderr
    assert counts(engine) == before


def test_rejected_approval_exits_nonzero_with_reasons(registered, engine):
    env = registered
    ok_json(
        env, "slots", "import", "--node", "j22u05", "--from", str(DEMO_DATA.joinpath("j22u05.json"))
    )
    before = counts(engine)
    error = error_json(env, "slots", "approve", "--node", "j22u05")
    assert error["code"] == "approval_rejected"
    assert {"mounted_child_partition", "fabric_device_shared"} <= {
        r["code"] for r in error["details"]["rejections"]
    }
    human = gpuaas(env, "slots", "approve", "--node", "j22u05")
    assert human.returncode == 1 and "mounted_child_partition" in human.stderr
    assert counts(engine) == before


def test_unreachable_database_is_a_clear_error(tmp_path):
    env = {
        "GPUAAS_DATABASE_URL": f"postgresql://nobody@/gpuaas?host={tmp_path}",
        "PATH": "/usr/bin:/bin",
    }
    error = error_json(env, "node", "list")
    assert error["code"] == "database_unavailable"
    assert error["message"].startswith(
        f"cannot reach the store at postgresql://nobody@/gpuaas?host={tmp_path} ("
    )


# One command of each command group that acts on the store (gpuaas_cli/app.py), the fleet
# picture among them. ``lab fleet up`` is left out: it starts its hosts before it reaches
# the store, and ends through the same error contract (``run``) as the others.
STORE_COMMANDS = [
    ("db", "upgrade"),
    ("node", "list"),
    ("slots", "list"),
    ("alloc", "list"),
    ("image", "list"),
    (
        "storage",
        "approve",
        "--node",
        "n1",
        "--device",
        "/dev/disk/by-id/nvme-a",
        "--reference",
        "c1",
    ),
    ("project", "list"),
    ("occupancy", "--html", "fleet.html"),
    ("audit",),
    ("ui", "--port", "{port}"),
    ("demo",),
]
PASSWORD = "not-for-the-output"
# Importing Prefect makes these two take seconds, where the others take one.
SLOW_COMMANDS = ("ui", "demo")


@pytest.mark.parametrize("store", ["nothing listens", "no such database", "no such role"])
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW_COMMANDS else [])
        for c in STORE_COMMANDS
    ],
)
def test_a_store_out_of_reach_is_one_sentence(pg_cluster, tmp_path, command, store):
    """Whatever the command, a store it cannot connect to ends it with the error contract's
    sentence, naming where it tried without the password and what to check, at once (a
    store never reached is not waited for: controlplane/db.py, ``RestartingStoreWait``)
    and without a traceback."""
    socket = pg_cluster.socket_dir
    if store == "nothing listens":
        port = free_port()
        given = f"postgresql://gpuaas:{PASSWORD}@127.0.0.1:{port}/gpuaas"
        where = f"postgresql://gpuaas@127.0.0.1:{port}/gpuaas (Connection refused)"
    elif store == "no such database":
        given = pg_cluster.url("no_such_store")
        where = (
            f"postgresql://{pg_cluster._role()}@/no_such_store?host={socket} "
            '(database "no_such_store" does not exist)'
        )
    else:
        given = make_url(pg_cluster.url("postgres")).set(username="no_such_role")
        given = given.render_as_string(hide_password=False)
        where = (
            f"postgresql://no_such_role@/postgres?host={socket} "
            '(role "no_such_role" does not exist)'
        )
    env = {
        **os.environ,
        "GPUAAS_DATABASE_URL": given,
        "PREFECT_HOME": str(tmp_path / "prefect"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    args = [arg.format(port=free_port()) for arg in command]
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", *args],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    took = time.monotonic() - started
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "Traceback" not in output and PASSWORD not in output, output
    # Compared without whitespace: the console wraps the sentence at spaces.
    assert " ".join(proc.stderr.split()) == (
        f"error database_unavailable: cannot reach the store at {where}: check that "
        "PostgreSQL runs there and that GPUAAS_DATABASE_URL names its host, port, database, "
        "user and password"
    )
    # Far from the minute a store seen up is waited for while it restarts.
    assert took < 30, f"{took:.1f} s"
    # gpuaas ui makes Prefect's database only next to a store it reached.
    assert not pg_cluster.database_exists("no_such_store_prefect")


def test_demo_runs_against_a_given_database(cli_env, tmp_path):
    proc = gpuaas({**cli_env, "PREFECT_HOME": str(tmp_path / "prefect")}, "demo")
    assert proc.returncode == 0, proc.stderr
    assert "j22u15: approved slots [0, 1, 2, 3, 4, 5, 6, 7]" in proc.stdout
    assert "mounted_child_partition" in proc.stdout
    assert "availability per SKU" in proc.stdout
    assert "unavailable h200-sxm-slice x8: sku_unavailable/" in proc.stdout
    assert "gpuaas ui" in proc.stdout
    if unavailable_reason() is None:
        vm_step = proc.stdout[proc.stdout.find("5. provision") :]
        assert "ssh_ready=True" in proc.stdout, vm_step[:4000]
        assert "released; slot 0: available (blkdiscard verified=True)" in proc.stdout
        assert "provision failed" not in proc.stdout and "release failed" not in proc.stdout
    else:
        assert "no VM here:" in proc.stdout


def test_alloc_create_show_list_release_and_wipe_proof(registered, engine, tmp_path):
    env = registered
    source = str(DEMO_DATA.joinpath("j22u15.json"))
    ok_json(env, "slots", "import", "--node", "j22u15", "--from", source)
    ok_json(env, "slots", "approve", "--node", "j22u15")
    create = ("alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "2", "--request-id", "r1")
    placed = ok_json(env, *create)
    assert placed["node"] == "j22u15" and len(placed["slots"]) == 2 and not placed["replayed"]
    again = ok_json(env, *create)
    assert again["replayed"] and again["allocation_id"] == placed["allocation_id"]
    # The human form of both, as an operator reads them.
    indexes = sorted(s["slot_index"] for s in placed["slots"])
    told = gpuaas(env, *create)
    assert told.returncode == 0, told.stderr
    assert " ".join(told.stdout.split()) == (
        f"already placed {placed['allocation_id']}: gpu_slice x2 on j22u15 slots {indexes}"
    )
    reused = error_json(env, *create[:5], "4", *create[6:])
    assert reused["code"] == "request_id_reused"
    shown = ok_json(env, "alloc", "show", placed["allocation_id"])
    assert shown["state"] == "pending" and len(shown["claims"]) == 2
    assert [a["id"] for a in ok_json(env, "alloc", "list")] == [placed["allocation_id"]]
    refused = error_json(env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "8")
    assert refused["code"] == "sku_unavailable" and refused["details"]["reason"] == "no_capacity"
    assert (
        error_json(env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "3")["code"]
        == "gpu_count_not_allowed"
    )
    assert error_json(env, "alloc", "show", "not-an-id")["code"] == "allocation_id_invalid"
    released = ok_json(env, "alloc", "release", placed["allocation_id"])
    assert released["changed"] and len(released["slots_to_wipe"]) == 2
    slot = placed["slots"][0]["slot_index"]
    device = next(
        s["nvme_device"]
        for s in ok_json(env, "slots", "list", "--node", "j22u15")
        if s["slot_index"] == slot
    )
    proof = tmp_path / "proof.json"
    unsigned = wipe_proof(device)
    proof.write_text(json.dumps({"changed": True, "proof": unsigned}))
    record = ["slots", "wipe-proof", "--node", "j22u15", "--slot", str(slot), "--from", str(proof)]
    # The node has no signing key pinned and the proof is unsigned: not believed.
    refused = ok_json(env, *record)
    assert refused["status"] == "cleanup_blocked" and refused["verified"] is False
    assert refused["distrust"].startswith("unsigned"), refused
    ok_json(env, "slots", "repair", "--node", "j22u15", "--slot", str(slot), "--reason", "retry")
    cp = ControlPlane(engine)
    pin_node_key(cp, "j22u15")
    nonce = ok_json(env, "slots", "wipe-nonce", "--node", "j22u15")["nonce"]
    proof.write_text(
        json.dumps({"changed": True, "proof": sign(wipe_proof(device), "j22u15", nonce)})
    )
    recorded = ok_json(env, *record)
    assert recorded["status"] == "available" and recorded["verified"] is True, recorded
    fresh = gpuaas(env, "alloc", "create", "--sku", "h200-sxm-slice", "--gpus", "1")
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout.startswith("placed ") and "x1 on j22u15 slots [" in fresh.stdout


def test_storage_approval_is_recorded_once_per_reference(registered, engine):
    env = registered
    disks = [
        "/dev/disk/by-id/nvme-eui.000000000000000100a0752400000001",
        "/dev/disk/by-id/nvme-eui.000000000000000100a0752400000002",
    ]
    args = ["storage", "approve", "--node", "j22u05", "--reference", "INFRA-7"]
    for disk in disks:
        args += ["--device", disk]
    first = ok_json(env, *args)
    assert first["created"] and first["devices"] == sorted(disks)
    assert first["reference"] == "INFRA-7" and first["recorded_by"].startswith("cli:")
    assert ok_json(env, *args)["created"] is False
    before = counts(engine)
    reused = error_json(
        env,
        "storage",
        "approve",
        "--node",
        "j22u05",
        "--reference",
        "INFRA-7",
        "--device",
        disks[0],
    )
    assert reused["code"] == "approval_reference_reused"
    kernel_name = error_json(
        env,
        "storage",
        "approve",
        "--node",
        "j22u05",
        "--reference",
        "INFRA-8",
        "--device",
        "/dev/nvme0n1",
    )
    assert kernel_name["message"] and "stable" in kernel_name["message"]
    assert counts(engine) == before


def test_image_catalog_register_update_and_refusals(registered, engine):
    env = registered
    digest = "ab" * 32
    args = [
        "image",
        "register",
        "ubuntu-24.04-h200-cuda",
        "--sha256",
        digest,
        "--path",
        "/var/lib/gpuaas/images/ubuntu.raw",
        "--sku",
        "h200-sxm-slice",
    ]
    first = ok_json(env, *args)
    assert first["changed"] and first["status"] == "active"
    assert ok_json(env, *args)["changed"] is False
    republished = ok_json(env, *args[:3], "--sha256", "cd" * 32, *args[5:])
    assert republished["changed"] and republished["digest_sha256"] == "cd" * 32
    listed = {i["slug"]: i for i in ok_json(env, "image", "list")}
    assert listed["ubuntu-24.04-h200-cuda"]["digest_sha256"] == "cd" * 32
    before = counts(engine)
    for bad, code in [
        (["--sha256", "xyz"], "image_digest_invalid"),
        (["--path", "relative/ubuntu.raw"], "image_path_invalid"),
        (["--sku", "h200-sxm-baremetal"], "image_sku_not_slice"),
        (["--sku", "nosuch"], "sku_not_found"),
    ]:
        option = bad[0]
        changed = list(args)
        changed[changed.index(option) + 1] = bad[1]
        assert error_json(env, *changed)["code"] == code, bad
    assert ok_json(env, "image", "list") == list(listed.values())
    assert counts(engine) == before


def test_projects_and_quotas_from_the_command_line(registered):
    env = registered
    source = str(DEMO_DATA.joinpath("j22u15.json"))
    ok_json(env, "slots", "import", "--node", "j22u15", "--from", source)
    ok_json(env, "slots", "approve", "--node", "j22u15")
    made = ok_json(env, "project", "create", "acme", "--name", "Acme")
    assert made["changed"] and made["project"]["state"] == "active"
    quota = ok_json(
        env, "project", "quota", "set", "acme", "--gpus", "2", "--sku", "h200-sxm-slice"
    )
    assert quota["project"]["quotas"] == [
        {
            "sku": "h200-sxm-slice",
            "capacity_shape": None,
            "region": None,
            "gpu_limit": 2,
            "allocation_limit": None,
            "gpus_used": 0,
            "allocations_used": 0,
        }
    ]
    create = ("alloc", "create", "--sku", "h200-sxm-slice", "--project", "acme")
    ok_json(env, *create, "--gpus", "2")
    refused = error_json(env, *create, "--gpus", "1")
    assert refused["code"] == "quota_exceeded"
    assert (refused["details"]["limit"], refused["details"]["in_use"]) == (2, 2)
    human = gpuaas(env, "project", "list")
    assert "sku h200-sxm-slice: 2/2 GPUs" in human.stdout, human.stdout + human.stderr
    reserve = ("project", "reserve", "acme", "--sku", "h200-sxm-slice", "--region", "r1")
    held = gpuaas(env, *reserve, "--gpus", "2", "--until", "2099-01-01T00:00:00")
    assert "2 h200-sxm-slice GPUs in r1 until 2099-01-01T00:00:00+00:00 on " in held.stdout, (
        held.stdout + held.stderr
    )
    assert error_json(env, *reserve, "--gpus", "3")["code"] == "quota_exceeded"
    # acme still holds its 2 GPUs: retired only when asked to leave them running.
    refused = error_json(env, "project", "retire", "acme")
    assert (refused["code"], refused["details"]["gpus"]) == ("project_has_live_allocations", 2)
    retired = ok_json(
        env, "project", "retire", "acme", "--with-live-allocations", "--reason", "offboarded"
    )["project"]
    assert retired["state"] == "retired"
    assert [a["gpu_count"] for a in retired["kept_running"]] == [2]
