"""Secrets never reach the kept run directory or the store: real ansible-runner jobs given a
password-protected store URL, secret extra vars and a secret in the environment."""

from __future__ import annotations

import hashlib
import json
import secrets
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from controlplane import db
from controlplane.api import ControlPlane
from controlplane.secrets import SCRUBBED
from controlplane.services.inventory import NodeSpec
from flows.hostwork import DISCOVER, run_host_action
from flows.runner import PlaybookRun, run_playbook, scrub_artifacts
from gpuaas_lab import hosttrees
from tests.integration.flows.run_artifacts import command_of, files_containing

pytestmark = [pytest.mark.slow]

ECHO_PLAYBOOK = """
- name: Use a secret with and without no_log
  hosts: all
  gather_facts: false
  tasks:
    - name: The secret arrived intact (compared by digest, never written here)
      ansible.builtin.assert:
        that: (gpuaas_bmc_password | hash('sha256')) == expected_digest
    - name: Hidden use
      ansible.builtin.debug:
        msg: "bmc password is {{ gpuaas_bmc_password }}"
      no_log: true
    - name: Careless use
      ansible.builtin.debug:
        msg: "bmc password is {{ gpuaas_bmc_password }}"
"""


# One host, this machine, reached by the local connection.
THIS_MACHINE = {
    "all": {
        "hosts": {
            "box": {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
        }
    }
}


def private_paths_in(command: dict) -> list[str]:
    """The files the run received its secrets through (vars file, libpq password file)."""
    argv = command["command"]
    paths = [argv[i + 1][1:] for i, arg in enumerate(argv[:-1]) if argv[i + 1].startswith("@")]
    if "PGPASSFILE" in command["env"]:
        paths.append(command["env"]["PGPASSFILE"])
    return paths


def test_runner_keeps_secret_vars_and_environment_out_of_its_artifacts(tmp_path, monkeypatch):
    bmc_password = f"bmc-{secrets.token_hex(12)}"
    api_token = f"tok-{secrets.token_hex(12)}"
    monkeypatch.setenv("GPUAAS_TEST_API_TOKEN", api_token)
    playbook = tmp_path / "echo.yml"
    playbook.write_text(ECHO_PLAYBOOK)
    private = tmp_path / "run"
    private.mkdir()
    result = run_playbook(
        PlaybookRun(
            playbook=str(playbook),
            inventory=THIS_MACHINE,
            extravars={
                "gpuaas_bmc_password": bmc_password,
                "expected_digest": hashlib.sha256(bmc_password.encode()).hexdigest(),
            },
        ),
        private,
    )
    assert result.status == "successful", result.tasks
    assert files_containing(private, [bmc_password, api_token]) == []
    tasks = {t.task: t for t in result.tasks}
    assert "censored" in tasks["Hidden use"].result
    assert tasks["Careless use"].result["msg"] == f"bmc password is {SCRUBBED}"
    command = command_of(result.artifact_dir)
    assert command["env"]["GPUAAS_TEST_API_TOKEN"] == SCRUBBED
    assert "gpuaas_bmc_password" not in json.dumps(command["command"])
    secret_files = private_paths_in(command)
    assert secret_files and not any(Path(p).exists() for p in secret_files)


@pytest.fixture
def password_store(pg_cluster, database_url):
    """A login role that must give its password (scram) to reach the test database."""
    role = f"gpuaas_pw_{uuid.uuid4().hex[:8]}"
    password = f"pw:{secrets.token_hex(12)}\\x"
    hba = pg_cluster.data_dir / "pg_hba.conf"
    original = hba.read_text()
    admin = {"host": str(pg_cluster.socket_dir), "user": pg_cluster._role(), "autocommit": True}
    with psycopg.connect(dbname="postgres", **admin) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER PASSWORD '{password}'")
        hba.write_text(f"local all {role} scram-sha-256\n{original}")
        conn.execute("SELECT pg_reload_conf()")
    url = make_url(database_url).set(username=role, password=password)
    try:
        yield url.render_as_string(hide_password=False), password
    finally:
        hba.write_text(original)
        with psycopg.connect(dbname="postgres", **admin) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            conn.execute(f"DROP ROLE {role}")


def test_host_action_with_a_password_store_leaves_no_secret_in_artifacts_or_rows(
    tmp_path, monkeypatch, password_store
):
    url, db_password = password_store
    database = make_url(url).database
    socket = make_url(url).query["host"]
    role = make_url(url).username
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(host=socket, dbname=database, user=role).close()

    bmc_password = f"bmc-{secrets.token_hex(12)}"
    api_token = f"tok-{secrets.token_hex(12)}"
    monkeypatch.setenv("GPUAAS_DATABASE_URL", url)
    monkeypatch.setenv("GPUAAS_TEST_API_TOKEN", api_token)
    monkeypatch.setenv("GPUAAS_RUNS_DIR", str(tmp_path / "runs"))
    engine = db.create(url)
    try:
        cp = ControlPlane(engine)
        tree = hosttrees.build("clean", "j22u15", tmp_path / "tree")
        cp.register_node(
            NodeSpec(
                "j22u15",
                "region-maas-1",
                maas_tags=("gpuaas-profile-slice-vm",),
                slice_subnet="10.100.0.0/24",
                host_vars={
                    "ansible_connection": "local",
                    "ansible_python_interpreter": sys.executable,
                    "gpuaas_topology_root": str(tree),
                    "gpuaas_collect_network": False,
                },
            )
        )
        outcome = run_host_action(
            cp,
            DISCOVER,
            ["j22u15"],
            {"gpuaas_bmc_password": bmc_password, "bmc": {"user": "root", "token": api_token}},
            "test",
        )["j22u15"]
        # The inventory plugin could read the node only with the password (libpq got it
        # from the run's private password file).
        assert outcome.passed, outcome.failure
        assert outcome.module_result["topology"]["node"] == "j22u15"

        url_password = url.split("@")[0].rsplit(":", 1)[1]
        needles = [db_password, url_password, bmc_password, api_token]
        assert files_containing(tmp_path / "runs", needles) == []
        command = command_of(outcome.artifact_dir)
        passwordless = command["env"]["GPUAAS_DATABASE_URL"]
        assert make_url(passwordless).password is None
        assert make_url(passwordless).set(password=db_password) == make_url(url)
        secret_files = private_paths_in(command)
        assert len(secret_files) == 2 and not any(Path(p).exists() for p in secret_files)
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t::text FROM node_tasks t UNION ALL SELECT e::text FROM evidence e"
                    " WHERE e.node_task_id IS NOT NULL"
                )
            ).scalars()
            stored = list(rows)
        # The host action's task and its evidence (the node's registration is an audit row).
        assert len(stored) == 2
        assert not [n for n in needles for row in stored if n in row]
        assert any(SCRUBBED in row for row in stored)
    finally:
        engine.dispose()


def test_scrubbing_refuses_a_directory_that_is_not_a_runner_private_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("postgresql://u:keep-me@h/db\n")
    with pytest.raises(ValueError, match="not a runner private data directory"):
        scrub_artifacts(tmp_path, frozenset({"keep-me"}))
    with pytest.raises(ValueError, match="not a runner private data directory"):
        scrub_artifacts(Path("."), frozenset())
    assert (tmp_path / "notes.txt").read_text() == "postgresql://u:keep-me@h/db\n"


CREDENTIALS_PLAYBOOK = """
- name: What a host action sees of the Prefect API's credentials
  hosts: all
  gather_facts: false
  tasks:
    - name: Read them from the job's environment
      ansible.builtin.set_fact:
        prefect_credentials:
          auth_string: "{{ lookup('ansible.builtin.env', 'PREFECT_API_AUTH_STRING') }}"
          server: "{{ lookup('ansible.builtin.env', 'PREFECT_SERVER_API_AUTH_STRING') }}"
          api_key: "{{ lookup('ansible.builtin.env', 'PREFECT_API_KEY') }}"
    - name: Report whether any arrived (never their values)
      ansible.builtin.debug:
        msg: "{{ prefect_credentials | dict2items | selectattr('value') | map(attribute='key') }}"
"""


def test_a_host_action_does_not_hold_the_prefect_api_credentials(tmp_path, monkeypatch):
    """A flow run holds the Prefect API's auth string (docs/operations.md, "The Prefect API
    behind credentials"); the Ansible job it starts is given its environment without it."""
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", f"admin:{secrets.token_hex(8)}")
    monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", f"admin:{secrets.token_hex(8)}")
    monkeypatch.setenv("PREFECT_API_KEY", secrets.token_hex(8))
    playbook = tmp_path / "credentials.yml"
    playbook.write_text(CREDENTIALS_PLAYBOOK)
    private = tmp_path / "run"
    private.mkdir()
    result = run_playbook(
        PlaybookRun(
            playbook=str(playbook),
            inventory=THIS_MACHINE,
        ),
        private,
    )
    assert result.status == "successful", result.tasks
    tasks = {t.task: t for t in result.tasks}
    assert tasks["Report whether any arrived (never their values)"].result["msg"] == []
