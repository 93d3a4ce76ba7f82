"""The deploy user-data the control plane renders (docs/trust.md, "Host keys issued at
deploy"): valid cloud-config, the issued host key as the host's only key, bad input
refused before anything is issued."""

from __future__ import annotations

import hashlib

import pytest
import yaml

from controlplane import deploy_user_data
from controlplane.deploy_user_data import DeployRequest
from controlplane.enums import ProfileIntent
from controlplane.errors import InvalidInput
from controlplane.hostkeys import generate_host_key

SHA = hashlib.sha256(b"collection").hexdigest()
REQUEST = DeployRequest("http://10.0.0.1/gpuaas-fleet-0.1.0.tar.gz", SHA, {"x": "it's"})


def test_the_issued_key_is_the_hosts_only_ssh_host_key() -> None:
    private, public = generate_host_key()
    text = deploy_user_data.render(REQUEST, "slice-vm", (private, public))
    assert text.startswith("#cloud-config\n")
    data = yaml.safe_load(text)
    assert data["ssh_keys"] == {
        "ed25519_private": private,
        "ed25519_public": public.public_line(),
    }
    # cloud-init deletes the image's keys and generates none: the seeded key is the only one.
    assert data["ssh_deletekeys"] is True and data["ssh_genkeytypes"] == []
    assert data["runcmd"] == [["/usr/local/sbin/gpuaas-deploy-bootstrap"]]
    files = {f["path"]: f["content"] for f in data["write_files"]}
    assert "GPUAAS_PROFILE='slice-vm'" in files["/etc/gpuaas/bootstrap.env"]
    assert f"GPUAAS_COLLECTION_SHA256='{SHA}'" in files["/etc/gpuaas/bootstrap.env"]
    assert yaml.safe_load(files["/etc/gpuaas/bootstrap-vars.json"]) == {"x": "it's"}


def test_without_a_key_the_host_keeps_the_keys_cloud_init_generates() -> None:
    data = yaml.safe_load(deploy_user_data.render(REQUEST, "baremetal"))
    assert not {"ssh_keys", "ssh_deletekeys", "ssh_genkeytypes"} & set(data)
    files = {f["path"]: f["content"] for f in data["write_files"]}
    assert "GPUAAS_PROFILE='baremetal'" in files["/etc/gpuaas/bootstrap.env"]


def test_the_profile_follows_the_nodes_intent() -> None:
    assert deploy_user_data.profile_of(ProfileIntent.SLICE_VM, "n") == "slice-vm"
    assert deploy_user_data.profile_of(ProfileIntent.BAREMETAL, "n") == "baremetal"
    with pytest.raises(InvalidInput) as refused:
        deploy_user_data.profile_of(ProfileIntent.UNKNOWN, "gpu-x1")
    assert refused.value.code == "deploy_profile_unknown" and "gpu-x1" in refused.value.message


@pytest.mark.parametrize(
    ("request_", "profile", "code"),
    [
        (DeployRequest("ftp://x/c.tar.gz", SHA), "slice-vm", "collection_url_invalid"),
        (DeployRequest("relative/c.tar.gz", SHA), "slice-vm", "collection_url_invalid"),
        (DeployRequest("http://x/a b.tar.gz", SHA), "slice-vm", "collection_url_invalid"),
        (
            DeployRequest("http://x/c.tar.gz\nruncmd: [reboot]", SHA),
            "slice-vm",
            "collection_url_invalid",
        ),
        (DeployRequest("http://x/c.tar.gz", SHA.upper()), "slice-vm", "collection_sha256_invalid"),
        (DeployRequest("http://x/c.tar.gz", SHA[:-1]), "slice-vm", "collection_sha256_invalid"),
        (DeployRequest("http://x/c.tar.gz", SHA, ["x"]), "slice-vm", "bootstrap_vars_invalid"),
        (DeployRequest("http://x/c.tar.gz", SHA), "slice_vm", "deploy_profile_unknown"),
    ],
)
def test_bad_input_is_refused_with_its_code(request_, profile, code) -> None:
    with pytest.raises(InvalidInput) as refused:
        deploy_user_data.render(request_, profile, generate_host_key())
    assert refused.value.code == code
