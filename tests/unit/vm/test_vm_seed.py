"""NoCloud seed: cloud-config content, relay key injection, the ISO itself, idempotence."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
from pathlib import Path

import pycdlib
import pytest
import yaml
from ansible_collections.gpuaas.fleet.plugins.module_utils import vm_seed
from ansible_collections.gpuaas.fleet.plugins.module_utils.vm_common import VmError

from gpuaas_lab.vmguest import USERDATA_AWK

ALLOCATION = "158ea147-0115-407f-bbd5-1850c32b9517"
TENANT_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDaDZktS536XWaxw7nhGAmShgTktoeDSYVAU/Mv9MLQe alice@laptop"
)
# A comment with YAML and shell metacharacters must stay inert.
TRICKY_KEY = 'ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7 bob "quoted" #not-a-comment: {x} \\ back'
RELAY_KEY = (
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKrelayrelayrelayrelayrelayrelayrelayrela"
    " gpuaas-terminal-relay@j22u15"
)


def files(users=None, relay=RELAY_KEY):
    users = users or [
        {"name": "gpuuser", "ssh_authorized_keys": [TENANT_KEY], "sudo": "ALL=(ALL) NOPASSWD:ALL"},
        {"name": "ops", "ssh_authorized_keys": [TRICKY_KEY, RELAY_KEY]},
    ]
    return vm_seed.seed_files(ALLOCATION, "slice-158ea147", users, "52:54:00:3F:A2:10", relay)


def test_user_data_is_cloud_config_with_users_keys_and_hostname():
    seed = files()
    assert seed["user-data"].startswith(b"#cloud-config\n")
    config = yaml.safe_load(seed["user-data"])
    assert config["hostname"] == "slice-158ea147"
    assert config["ssh_pwauth"] is False
    users = {u["name"]: u for u in config["users"]}
    assert users["gpuuser"]["ssh_authorized_keys"] == [TENANT_KEY, RELAY_KEY]
    assert users["gpuuser"]["sudo"] == "ALL=(ALL) NOPASSWD:ALL"
    assert users["gpuuser"]["lock_passwd"] is True
    assert users["ops"]["ssh_authorized_keys"] == [TRICKY_KEY, RELAY_KEY]
    assert "sudo" not in users["ops"]


def test_meta_data_instance_id_is_the_allocation_and_network_config_matches_the_mac():
    seed = files()
    assert yaml.safe_load(seed["meta-data"]) == {
        "instance-id": ALLOCATION,
        "local-hostname": "slice-158ea147",
    }
    network = yaml.safe_load(seed["network-config"])
    assert network["version"] == 2
    assert network["ethernets"]["mgmt0"] == {
        "match": {"macaddress": "52:54:00:3f:a2:10"},
        "dhcp4": True,
    }


def guest_parse(tmp_path: Path, user_data: bytes) -> list[str]:
    """What the tiny guest's awk parser (lab/gpuaas_lab/vmguest.py) prints for user-data."""
    (tmp_path / "user-data").write_bytes(user_data)
    (tmp_path / "parser.awk").write_text(USERDATA_AWK)
    return subprocess.run(
        ["busybox", "awk", "-f", str(tmp_path / "parser.awk"), str(tmp_path / "user-data")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox missing")
def test_the_tiny_guest_parser_reads_the_same_users_and_keys(tmp_path: Path):
    """The guest's awk parser (lab/gpuaas_lab/vmguest.py) agrees with a YAML parser."""
    seed = files()
    out = guest_parse(tmp_path, seed["user-data"])
    config = yaml.safe_load(seed["user-data"])
    expected = [f"HOSTNAME {config['hostname']}"]
    for user in config["users"]:
        expected.append(f"USER {user['name']}")
        expected += [f"KEY {user['name']} {key}" for key in user["ssh_authorized_keys"]]
    assert out == expected


@pytest.mark.parametrize(
    ("users", "code"),
    [
        ([], "no_users"),
        ([{"name": "Bad User", "ssh_authorized_keys": [TENANT_KEY]}], "invalid_user"),
        ([{"name": "a", "ssh_authorized_keys": ["ssh-ed25519 AAAA\nrm -rf /"]}], "invalid_ssh_key"),
        ([{"name": "a", "ssh_authorized_keys": ["not a key"]}], "invalid_ssh_key"),
        (
            [
                {"name": "a", "ssh_authorized_keys": [TENANT_KEY]},
                {"name": "a", "ssh_authorized_keys": [TENANT_KEY]},
            ],
            "invalid_user",
        ),
    ],
)
def test_bad_users_and_keys_are_refused(users, code):
    with pytest.raises(VmError) as caught:
        vm_seed.seed_files(ALLOCATION, "slice-1", users, "52:54:00:3f:a2:10", RELAY_KEY)
    assert caught.value.code == code


def test_a_user_without_keys_is_refused_unless_the_relay_key_is_there():
    users = [{"name": "gpuuser", "ssh_authorized_keys": []}]
    with pytest.raises(VmError) as caught:
        vm_seed.seed_files(ALLOCATION, "slice-1", users, "52:54:00:3f:a2:10", "")
    assert caught.value.code == "no_ssh_keys"
    seed = vm_seed.seed_files(ALLOCATION, "slice-1", users, "52:54:00:3f:a2:10", RELAY_KEY)
    assert yaml.safe_load(seed["user-data"])["users"][0]["ssh_authorized_keys"] == [RELAY_KEY]


def test_bad_hostname_is_refused():
    with pytest.raises(VmError) as caught:
        vm_seed.seed_files(ALLOCATION, "bad_host;", [], "52:54:00:3f:a2:10", RELAY_KEY)
    assert caught.value.code == "invalid_hostname"


def test_iso_is_labelled_cidata_and_holds_the_files_under_their_names(tmp_path: Path):
    path = tmp_path / "seed.iso"
    seed = files()
    result = vm_seed.ensure_seed(str(path), seed, check_mode=False)
    assert result["changed"]
    assert vm_seed.volume_label(str(path)) == "cidata"
    iso = pycdlib.PyCdlib()
    iso.open(str(path))
    children = iso.list_children(rr_path="/")
    names = sorted(c.rock_ridge.name().decode() for c in children if c.is_file())
    iso.close()
    assert names == ["meta-data", "network-config", "user-data"]
    assert vm_seed.read_iso(str(path)) == seed
    if shutil.which("blkid"):
        probe = subprocess.run(["blkid", "-o", "export", str(path)], capture_output=True, text=True)
        assert "LABEL=cidata" in probe.stdout and "TYPE=iso9660" in probe.stdout


def test_second_run_is_a_no_op_and_a_change_rewrites(tmp_path: Path):
    path = tmp_path / "seed.iso"
    vm_seed.ensure_seed(str(path), files(), check_mode=False)
    before = path.stat().st_mtime_ns
    again = vm_seed.ensure_seed(str(path), files(), check_mode=False)
    assert not again["changed"]
    assert path.stat().st_mtime_ns == before
    changed = files(users=[{"name": "gpuuser", "ssh_authorized_keys": [TRICKY_KEY]}])
    preview = vm_seed.ensure_seed(str(path), changed, check_mode=True)
    assert preview["changed"] and "gpuuser" in preview["diff"]["after"]
    assert path.stat().st_mtime_ns == before, "check mode wrote the ISO"
    assert vm_seed.ensure_seed(str(path), changed, check_mode=False)["changed"]
    assert vm_seed.read_iso(str(path)) == changed


def test_the_state_directory_lets_qemu_through_and_an_old_closed_one_is_opened(tmp_path: Path):
    # QEMU runs as libvirt's own user, not root: it must be able to pass through the
    # slice's directory to the seed libvirt hands it.
    path = tmp_path / "slices" / "a" / "seed.iso"
    vm_seed.ensure_seed(str(path), files(), check_mode=False)
    assert path.parent.stat().st_mode & 0o7777 == 0o711
    assert path.stat().st_mode & 0o7777 == 0o640
    path.parent.chmod(0o750)
    before = path.stat().st_mtime_ns
    preview = vm_seed.ensure_seed(str(path), files(), check_mode=True)
    assert preview["changed"] and "0750" in preview["diff"]["before_header"]
    assert path.parent.stat().st_mode & 0o7777 == 0o750, "check mode changed the directory"
    assert vm_seed.ensure_seed(str(path), files(), check_mode=False)["changed"]
    assert path.parent.stat().st_mode & 0o7777 == 0o711
    assert path.stat().st_mtime_ns == before, "the ISO was rewritten for a directory mode"
    assert not vm_seed.ensure_seed(str(path), files(), check_mode=False)["changed"]


def test_a_foreign_iso_at_the_path_is_replaced(tmp_path: Path):
    path = tmp_path / "seed.iso"
    iso = pycdlib.PyCdlib()
    iso.new(vol_ident="OTHER")
    iso.write(str(path))
    iso.close()
    assert vm_seed.read_iso(str(path)) == {"volume-label": b"OTHER"}
    assert vm_seed.ensure_seed(str(path), files(), check_mode=False)["changed"]
    assert vm_seed.volume_label(str(path)) == "cidata"


def test_run_creates_the_relay_key_once_and_injects_it(tmp_path: Path):
    key = tmp_path / "terminal" / "id_ed25519"
    params = {
        "path": str(tmp_path / "slices" / "a" / "seed.iso"),
        "allocation_id": ALLOCATION,
        "hostname": "slice-1",
        "mac_address": "52:54:00:3f:a2:10",
        "users": [{"name": "gpuuser", "ssh_authorized_keys": [TENANT_KEY]}],
        "terminal_key_path": str(key),
    }
    preview = vm_seed.run(params, check_mode=True)
    assert preview["changed"] and preview["terminal_key"]["created"]
    assert not key.exists() and not (tmp_path / "slices").exists()
    first = vm_seed.run(params, check_mode=False)
    assert first["terminal_key"]["created"] and key.exists()
    assert oct((tmp_path / "terminal").stat().st_mode & 0o777) == "0o700"
    public = key.with_suffix(".pub").read_text().strip()
    assert public.startswith("ssh-ed25519 ")
    users = yaml.safe_load(first["files"]["user-data"])["users"]
    assert users[0]["ssh_authorized_keys"] == [TENANT_KEY, public]
    again = vm_seed.run(params, check_mode=False)
    assert not again["changed"] and not again["terminal_key"]["created"]
    assert key.with_suffix(".pub").read_text().strip() == public


def relay_key_in_a_new_process(path: str, ready, results) -> None:
    ready.wait()
    try:
        results.put(vm_seed.ensure_relay_key(path, check_mode=False)["public_key"])
    except VmError as exc:
        results.put(f"{exc.code}: {exc}")


def test_provisions_racing_for_a_new_relay_key_all_get_the_one_key_written(tmp_path: Path):
    """A burst on a new host: every slice's seed wants the relay key at once (the burst lab
    saw one provision fail here). Each gets the same pair, and it is the one on disk."""
    key = tmp_path / "terminal" / "id_ed25519"
    context = multiprocessing.get_context("fork")
    ready, results = context.Event(), context.Queue()
    racers = [
        context.Process(target=relay_key_in_a_new_process, args=(str(key), ready, results))
        for _ in range(8)
    ]
    for racer in racers:
        racer.start()
    ready.set()
    answers = [results.get(timeout=60) for _ in racers]
    for racer in racers:
        racer.join(timeout=60)
    public = key.with_suffix(".pub").read_text().strip()
    assert answers == [public] * len(racers)
    derived = subprocess.run(
        ["ssh-keygen", "-y", "-f", str(key)], capture_output=True, text=True, check=True
    ).stdout.split()[:2]
    assert derived == public.split()[:2]
    assert sorted(p.name for p in key.parent.iterdir()) == [
        ".id_ed25519.lock",
        "id_ed25519",
        "id_ed25519.pub",
    ]


def test_a_relay_key_whose_creation_was_cut_short_is_made_again(tmp_path: Path):
    """A run killed between the two halves leaves a public key alone: the next makes both."""
    key = tmp_path / "id_ed25519"
    key.with_suffix(".pub").write_text("ssh-ed25519 AAAAleftover\n")
    made = vm_seed.ensure_relay_key(str(key), check_mode=False)
    assert made["created"] and made["public_key"] != "ssh-ed25519 AAAAleftover"
    assert key.with_suffix(".pub").read_text().strip() == made["public_key"]


def test_a_relay_key_without_its_public_half_is_refused(tmp_path: Path):
    key = tmp_path / "id_ed25519"
    key.write_text("private\n")
    with pytest.raises(VmError) as caught:
        vm_seed.ensure_relay_key(str(key), check_mode=False)
    assert caught.value.code == "terminal_key_missing"


@pytest.fixture
def guest_key(tmp_path: Path) -> tuple[str, str]:
    """An ed25519 host key as the control plane issues one (OpenSSH private format)."""
    path = tmp_path / "guest_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return path.read_text(), path.with_suffix(".pub").read_text().strip()


def test_the_guest_host_key_is_seeded_as_its_only_key_and_withheld_from_the_result(
    tmp_path: Path, guest_key
):
    private, public = guest_key
    params = {
        "path": str(tmp_path / "seed.iso"),
        "allocation_id": ALLOCATION,
        "hostname": "slice-1",
        "mac_address": "52:54:00:3f:a2:10",
        "users": [{"name": "gpuuser", "ssh_authorized_keys": [TENANT_KEY]}],
        "host_private_key": private,
        "host_public_key": public,
    }
    result = vm_seed.run(params, check_mode=False)
    written = yaml.safe_load(vm_seed.read_iso(params["path"])["user-data"])
    assert written["ssh_keys"] == {"ed25519_private": private, "ed25519_public": public}
    assert written["ssh_deletekeys"] is True and written["ssh_genkeytypes"] == []
    secret_line = private.splitlines()[1]
    assert secret_line not in repr(result), "the private host key leaked into the result"
    reported = yaml.safe_load(result["files"]["user-data"])
    assert reported["ssh_keys"]["ed25519_private"] == vm_seed.WITHHELD
    assert result["host_key"] == public
    again = vm_seed.run(params, check_mode=False)
    assert not again["changed"] and secret_line not in repr(again)


@pytest.mark.skipif(shutil.which("busybox") is None, reason="busybox missing")
def test_the_tiny_guest_parser_finds_the_seeded_host_key(tmp_path: Path, guest_key):
    private, public = guest_key
    host_key = vm_seed.validate_host_key(private, public)
    users = [{"name": "gpuuser", "shell": "/bin/sh", "sudo": "", "ssh_authorized_keys": [public]}]
    out = guest_parse(tmp_path, vm_seed.render_user_data("g", users, host_key).encode())
    [line] = [line for line in out if line.startswith("HOSTKEY - ")]
    assert line.removeprefix("HOSTKEY - ").replace("\\n", "\n") == private
    assert [line for line in out if line.startswith("USER ")] == ["USER gpuuser"]


@pytest.mark.parametrize(
    ("private", "public"),
    [
        ("not a key", None),
        ("-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n", None),
        (None, TRICKY_KEY),
        (None, "ssh-ed25519 AAAA\nrm -rf /"),
    ],
)
def test_a_bad_guest_host_key_is_refused_before_anything_is_written(
    tmp_path: Path, guest_key, private, public
):
    with pytest.raises(VmError) as refused:
        vm_seed.validate_host_key(private or guest_key[0], public or guest_key[1])
    assert refused.value.code in ("host_key_invalid", "invalid_ssh_key")
    assert not (tmp_path / "seed.iso").exists()
