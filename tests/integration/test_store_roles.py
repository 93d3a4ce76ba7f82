"""Least-privilege store roles (docs/operations.md, "Store roles") on a PostgreSQL of this
module's own, reached over TLS with ``sslmode=verify-full`` against a CA of the test's own
and SCRAM passwords: each role does its job, and the store refuses each role what is not
its job (DDL, rewriting evidence, writing a usage counter, another role's work)."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import psycopg
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from controlplane import db, migrate, store_roles
from controlplane.api import ControlPlane
from controlplane.audit import audit
from controlplane.embedded import EmbeddedPostgres
from controlplane.enums import AdminState, EvidenceKind
from controlplane.errors import GpuaasError
from controlplane.models import Base
from controlplane.scheduler.placement import Placement, PlacementRequest
from controlplane.services.inventory import NodeSpec
from controlplane.services.projects import QuotaScope
from gpuaas_lab.synthetic import FleetSpec, create_fleet

# One cluster for the module, whose tests run in order on one worker.
pytestmark = pytest.mark.xdist_group("store_roles")

PREFIX = "rl"
DATABASE = "store"
SLICE = "h200-sxm-slice"
PERMISSION_DENIED = "42501"


@dataclass(frozen=True)
class Store:
    admin_url: str
    port: int
    ca_file: Path
    password_dir: Path
    first_run: dict
    first_output: str

    def url(self, job: str, host: str = "localhost", ca_file: Path | None = None) -> str:
        name = f"{PREFIX}_{job}"
        return (
            f"postgresql+psycopg://{name}@{host}:{self.port}/{DATABASE}?sslmode=verify-full"
            f"&sslrootcert={ca_file or self.ca_file}&passfile={self.password_dir}/{name}.pgpass"
        )

    def engine(self, job: str) -> Engine:
        return db.engine_for(self.url(job))


def certificate_authority(
    directory: Path, name: str
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    (directory / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert


def server_certificate(data_dir: Path, ca_key, ca_cert: x509.Certificate) -> None:
    """A certificate for ``localhost`` only: verify-full refuses the server by its IP."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (data_dir / "server.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (data_dir / "server.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gpuaas(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuaas_cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory) -> Iterator[tuple[EmbeddedPostgres, int, Path]]:
    """A cluster that takes TCP only over TLS with SCRAM; its superuser uses the socket."""
    data_dir = Path(tempfile.mkdtemp(prefix="gpuaas-test-roles-"))
    certs = tmp_path_factory.mktemp("ca")
    cluster = EmbeddedPostgres(data_dir=data_dir, durable=False)
    cluster.init()
    ca_key, ca_cert = certificate_authority(certs, "store-ca")
    server_certificate(data_dir, ca_key, ca_cert)
    os.chmod(data_dir / "server.key", 0o600)
    if cluster.run_as:
        for name in ("server.crt", "server.key"):
            shutil.chown(data_dir / name, cluster.run_as, cluster.run_as)
    port = free_port()
    with open(data_dir / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
        conf.write(
            f"listen_addresses = '127.0.0.1'\nport = {port}\nssl = on\n"
            "ssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n"
            "password_encryption = 'scram-sha-256'\n"
        )
    (data_dir / "pg_hba.conf").write_text(
        f"local all {cluster._role()} trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n"
    )
    pg_ctl = str(cluster.bindir / "pg_ctl")
    start = [pg_ctl, "start", "-w", "-D", str(data_dir), "-l", str(cluster.log_file)]
    subprocess.run(cluster._cmd(*start), check=True, capture_output=True)
    try:
        yield cluster, port, certs / "store-ca.crt"
    finally:
        stop = [pg_ctl, "stop", "-m", "fast", "-D", str(data_dir)]
        subprocess.run(cluster._cmd(*stop), check=False, capture_output=True)
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def store(tls_cluster, tmp_path_factory) -> Store:
    """A migrated store with a fleet, a quota and the roles ``gpuaas db roles`` made."""
    cluster, port, ca_file = tls_cluster
    admin_url = (
        f"postgresql+psycopg://{cluster._role()}@/{DATABASE}?host={cluster.socket_dir}&port={port}"
    )
    with psycopg.connect(
        host=str(cluster.socket_dir),
        port=port,
        user=cluster._role(),
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    admin = create_engine(admin_url)
    migrate.upgrade(admin)
    create_fleet(admin, FleetSpec(nodes=2, prefix="rl"))
    ControlPlane(admin).set_project_quota("default", QuotaScope(), 1000, None)
    admin.dispose()
    password_dir = tmp_path_factory.mktemp("secrets") / "store-roles"
    env = {**os.environ, db.DATABASE_URL_ENV: admin_url}
    proc = gpuaas(
        env, "db", "roles", "--prefix", PREFIX, "--password-dir", str(password_dir), "--json"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return Store(
        admin_url, port, ca_file, password_dir, json.loads(proc.stdout), proc.stdout + proc.stderr
    )


def refused(engine: Engine, statement: str) -> DBAPIError:
    with pytest.raises(DBAPIError) as caught, engine.begin() as conn:
        conn.execute(text(statement))
    return caught.value


def test_the_first_run_creates_four_scram_roles_and_writes_each_password_once(store):
    run = store.first_run
    assert run["changed"] and run["database"] == DATABASE
    assert [(r["job"], r["name"], r["created"]) for r in run["roles"]] == [
        (job, f"{PREFIX}_{job}", True) for job in store_roles.JOBS
    ]
    assert os.stat(store.password_dir).st_mode & 0o777 == 0o700
    for role in run["roles"]:
        passfile = Path(role["password_file"])
        assert passfile == store.password_dir / f"{role['name']}.pgpass"
        assert os.stat(passfile).st_mode & 0o777 == 0o600
        password = passfile.read_text().strip().split(":")[-1]
        assert len(password) >= 32 and password not in store.first_output
    admin = create_engine(store.admin_url)
    with admin.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT rolname, rolpassword, rolsuper, rolcreaterole, rolcreatedb"
                " FROM pg_authid WHERE rolname LIKE 'rl\\_%' ORDER BY 1"
            )
        ).all()
        owners = conn.execute(
            text(
                "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
                " WHERE relnamespace = 'public'::regnamespace"
            )
        ).scalars()
        assert set(owners) == {f"{PREFIX}_owner"}
    admin.dispose()
    assert len(rows) == 4
    for _name, verifier, *powers in rows:
        assert verifier.startswith("SCRAM-SHA-256$") and powers == [False, False, False]


def test_a_second_run_changes_nothing(store):
    before = {p: p.read_text() for p in store.password_dir.iterdir()}
    env = {**os.environ, db.DATABASE_URL_ENV: store.admin_url}
    proc = gpuaas(env, "db", "roles", "--prefix", PREFIX, "--password-dir", str(store.password_dir))
    assert proc.returncode == 0, proc.stderr
    assert "store roles of store unchanged" in proc.stdout
    report = store_roles.ensure_roles(create_engine(store.admin_url), PREFIX, store.password_dir)
    assert report.changes == [] and not report.changed
    assert all(not r.created and r.password_file is None for r in report.roles)
    assert {p: p.read_text() for p in store.password_dir.iterdir()} == before


@pytest.mark.parametrize("job", store_roles.JOBS)
def test_each_role_logs_in_over_verified_tls(store, job):
    engine = store.engine(job)
    with engine.connect() as conn:
        user, ssl = conn.execute(
            text("SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        ).one()
    engine.dispose()
    assert (user, ssl) == (f"{PREFIX}_{job}", True)


def test_verify_full_refuses_a_server_it_cannot_verify(store, tmp_path):
    certificate_authority(tmp_path, "other-ca")
    for url, message in (
        (store.url("reader", ca_file=tmp_path / "other-ca.crt"), "certificate verify failed"),
        (store.url("reader", host="127.0.0.1"), "does not match host name"),
    ):
        with pytest.raises(OperationalError, match=message):
            create_engine(url).connect()
    wrong = tmp_path / "wrong.pgpass"
    wrong.write_text(f"*:*:*:{PREFIX}_reader:not-the-password\n")
    wrong.chmod(0o600)
    url = store.url("reader").replace(
        str(store.password_dir / f"{PREFIX}_reader.pgpass"), str(wrong)
    )
    with pytest.raises(OperationalError, match="password authentication failed"):
        create_engine(url).connect()


NOT_YOURS = "permission denied"
NOT_OWNER = "must be owner"
APPEND_ONLY = "evidence is append-only"
COUNTERS = "kept by triggers"
EVIDENCE_ROW = (
    "INSERT INTO evidence (kind, passed, summary, recorded_by)"
    " VALUES ('operator_action', true, 'x', 'test')"
)


@pytest.mark.parametrize(
    ("job", "statement", "message"),
    [
        ("reader", EVIDENCE_ROW, NOT_YOURS),
        ("reader", "UPDATE nodes SET admin_state = 'draining'", NOT_YOURS),
        ("reader", "DELETE FROM outbox", NOT_YOURS),
        ("reader", "CREATE TABLE reader_table (id int)", NOT_YOURS),
        ("controller", "CREATE TABLE controller_table (id int)", NOT_YOURS),
        ("controller", "ALTER TABLE nodes ADD COLUMN extra int", NOT_OWNER),
        ("controller", "DROP TABLE evidence", NOT_OWNER),
        ("controller", "UPDATE evidence SET passed = false", NOT_YOURS),
        ("controller", "DELETE FROM evidence", NOT_YOURS),
        ("controller", "TRUNCATE evidence CASCADE", NOT_YOURS),
        ("controller", "ALTER TABLE evidence DISABLE TRIGGER evidence_append_only", NOT_OWNER),
        ("controller", "UPDATE node_capacity SET free_gpus = 99", NOT_YOURS),
        ("controller", "UPDATE node_capacity SET node_id = node_id", COUNTERS),
        ("controller", "UPDATE project_quotas SET gpus_used = 0", NOT_YOURS),
        (
            "controller",
            "INSERT INTO project_quotas (project_id, gpu_limit) VALUES ('x', 1)",
            NOT_YOURS,
        ),
        ("controller", "DELETE FROM project_reservations", NOT_YOURS),
        ("controller", "CREATE TEMPORARY TABLE evidence (id int)", NOT_YOURS),
        ("controller", "SELECT analyze_shape_tables(ARRAY['evidence'])", "only the shape tables"),
        ("operator", "DROP TABLE evidence", NOT_OWNER),
        ("operator", "CREATE SCHEMA operator_schema", NOT_YOURS),
        ("operator", "UPDATE evidence SET summary = 'rewritten'", NOT_YOURS),
        ("operator", "DELETE FROM evidence", NOT_YOURS),
        ("operator", "UPDATE project_quotas SET allocations_used = 0", NOT_YOURS),
        (
            "operator",
            "INSERT INTO project_quotas (project_id, gpu_limit, gpus_used)"
            " VALUES ('default', 5, 0)",
            NOT_YOURS,
        ),
        ("operator", "DELETE FROM node_capacity", NOT_YOURS),
        (
            "operator",
            "INSERT INTO sweep_verdicts (sweep_run_id, node_id, kind, batch, passed, judged_by)"
            " SELECT 'run', id, 'parity', 0, true, 't' FROM nodes LIMIT 1",
            NOT_YOURS,
        ),
        ("operator", "UPDATE alembic_version SET version_num = '0018'", NOT_YOURS),
        ("owner", "UPDATE evidence SET passed = false", APPEND_ONLY),
        ("owner", "DELETE FROM evidence", APPEND_ONLY),
        ("owner", "TRUNCATE evidence CASCADE", APPEND_ONLY),
        ("owner", "UPDATE node_capacity SET free_gpus = 99", COUNTERS),
        ("owner", "UPDATE project_quotas SET gpus_used = gpus_used + 1", COUNTERS),
    ],
)
def test_the_store_refuses_what_is_not_the_roles_job(store, job, statement, message):
    engine = store.engine(job)
    error = refused(engine, statement)
    engine.dispose()
    assert message in str(error.orig)
    if message in (NOT_YOURS, NOT_OWNER, APPEND_ONLY):
        assert error.orig.sqlstate == PERMISSION_DENIED


def test_the_operator_cannot_run_a_migration(store):
    operator = store.engine("operator")
    with pytest.raises(DBAPIError, match=NOT_OWNER):
        migrate.downgrade(operator, "0018")
    assert migrate.current_revision(operator) == migrate.head_revision()
    operator.dispose()


def test_the_owner_runs_migrations_and_the_process_roles_get_new_tables(store):
    owner = store.engine("owner")
    migrate.downgrade(owner, "0018")
    admin = create_engine(store.admin_url)
    with admin.begin() as conn:
        # As if evidence were a table the migration below had just created.
        conn.execute(text(f"REVOKE INSERT ON evidence FROM {PREFIX}_controller"))
    admin.dispose()
    upgraded = gpuaas(
        {**os.environ, db.DATABASE_URL_ENV: store.url("owner")}, "db", "upgrade", "--json"
    )
    assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
    assert json.loads(upgraded.stdout) == {
        "revision": migrate.head_revision(),
        # The revoked grant, and the controller's writes of the tables made since 0018.
        "grants": [
            f"granted INSERT on evidence to {PREFIX}_controller",
            f"granted INSERT on health_findings to {PREFIX}_controller",
            f"granted UPDATE on health_findings to {PREFIX}_controller",
        ],
    }
    with owner.begin() as conn:
        conn.execute(text("CREATE TABLE owner_made (id bigserial PRIMARY KEY)"))
    try:
        reader, controller = store.engine("reader"), store.engine("controller")
        # The owner's default privileges: readable and its sequence usable at once.
        with reader.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM owner_made")).scalar_one() == 0
        with controller.connect() as conn:
            conn.execute(text("SELECT nextval('owner_made_id_seq')"))
        assert store_roles.grant_as_owner(owner) == []
        reader.dispose()
        controller.dispose()
    finally:
        with owner.begin() as conn:
            conn.execute(text("DROP TABLE owner_made"))
        owner.dispose()


def test_a_process_role_refreshes_the_shape_tables_statistics_as_the_owner(store):
    def analyzed() -> int:
        admin = create_engine(store.admin_url)
        with admin.connect() as conn:
            count = conn.execute(
                text(
                    "SELECT analyze_count FROM pg_stat_user_tables"
                    " WHERE relname = 'node_resource_slots'"
                )
            ).scalar_one()
        admin.dispose()
        return count

    before = analyzed()
    operator = store.engine("operator")
    with operator.begin() as conn:
        conn.execute(text("SELECT analyze_shape_tables(ARRAY['node_resource_slots'])"))
    operator.dispose()
    assert analyzed() == before + 1


def quota_used(store: Store) -> tuple[int, int]:
    reader = store.engine("reader")
    with reader.connect() as conn:
        used = conn.execute(
            text(
                "SELECT gpus_used, allocations_used FROM project_quotas"
                " WHERE project_id = 'default'"
            )
        ).one()
    reader.dispose()
    return tuple(used)


def test_the_controller_places_an_allocation_records_evidence_and_releases(store):
    controller = store.engine("controller")
    plane = ControlPlane(controller)
    gpus_before, allocations_before = quota_used(store)
    placed = plane.place(
        PlacementRequest(sku=SLICE, gpu_count=2, project_id="default", requested_by="test")
    )
    assert isinstance(placed, Placement)
    # The counter triggers ran as the owner for the controller.
    assert quota_used(store) == (gpus_before + 2, allocations_before + 1)
    evidence = plane.record_evidence(
        placed.hostname, EvidenceKind.HOST_RESULT, True, "checked", {}, "test"
    )
    assert evidence > 0
    plane.release(placed.allocation_id, "test")
    assert quota_used(store) == (gpus_before, allocations_before)
    controller.dispose()


def recorded(name: str) -> dict:
    return json.loads(resources.files("gpuaas_lab.demo_data").joinpath(f"{name}.json").read_text())


def test_the_operator_registers_approves_drains_and_sets_quotas(store):
    operator = store.engine("operator")
    plane = ControlPlane(operator)
    plane.register_node(
        NodeSpec(
            "j22u15", "r1", maas_tags=("gpuaas-profile-slice-vm",), slice_subnet="10.100.0.0/24"
        )
    )
    plane.import_topology("j22u15", recorded("j22u15"), "test")
    assert plane.approve_slots("j22u15", None, "test").approved == list(range(8))
    drained = plane.set_admin_state("j22u15", AdminState.DRAINING, "maintenance")
    assert drained.changed and drained.admin_state == "draining"
    plane.create_project("acme", "Acme")
    view, changed = plane.set_project_quota("acme", QuotaScope(), 8, 2)
    assert changed and [(q.gpus_used, q.allocations_used) for q in view.quotas] == [(0, 0)]
    operator.dispose()


def test_the_reader_reads_the_fleet_picture_and_occupancy(store):
    reader = store.engine("reader")
    plane = ControlPlane(reader)
    assert plane.fleet_picture().nodes
    assert plane.occupancy() is not None
    assert {n.hostname for n in plane.list_nodes()} >= {"rl00001", "rl00002"}
    # The whole-store audit reads as the reader, and finds the roles' work consistent.
    with reader.connect() as conn:
        assert audit(conn) == []
    reader.dispose()


@pytest.mark.parametrize(
    ("attributes", "conflict"),
    [
        ("LOGIN SUPERUSER", "has SUPERUSER"),
        ("LOGIN CREATEROLE", "has CREATEROLE"),
        ("LOGIN IN ROLE pg_read_all_data", "is a member of pg_read_all_data"),
        ("LOGIN", "was not created by gpuaas db roles"),
    ],
)
def test_a_role_of_that_name_with_other_grants_is_refused_and_nothing_changes(
    store, tmp_path, attributes, conflict
):
    prefix = f"taken{uuid.uuid4().hex[:6]}"
    admin = create_engine(store.admin_url)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE ROLE {prefix}_operator {attributes}"))
        if "not created" not in conflict:
            conn.execute(
                text(f"COMMENT ON ROLE {prefix}_operator IS 'gpuaas store role: operator'")
            )
    env = {**os.environ, db.DATABASE_URL_ENV: store.admin_url}
    proc = gpuaas(
        env, "db", "roles", "--prefix", prefix, "--password-dir", str(tmp_path / "p"), "--json"
    )
    try:
        assert proc.returncode == 1
        error = json.loads(proc.stdout)["error"]
        assert error["code"] == "store_role_conflict"
        assert any(conflict in c for c in error["details"]["conflicts"]), error
        with admin.connect() as conn:
            made = conn.execute(
                text("SELECT rolname FROM pg_roles WHERE rolname LIKE :p"), {"p": f"{prefix}%"}
            ).scalars()
            assert list(made) == [f"{prefix}_operator"]
            owner = conn.execute(
                text("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE relname = 'evidence'")
            ).scalar_one()
            assert owner == f"{PREFIX}_owner"
        assert not (tmp_path / "p").exists()
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP ROLE {prefix}_operator"))
        admin.dispose()


def test_an_open_password_directory_is_refused_before_any_role_is_made(store, tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    admin = create_engine(store.admin_url)
    with pytest.raises(GpuaasError, match="may be read by others") as caught:
        store_roles.ensure_roles(admin, "opendir", open_dir)
    assert caught.value.code == "password_dir_open"
    with admin.connect() as conn:
        assert (
            conn.execute(
                text("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'opendir%'")
            ).scalar_one()
            == 0
        )
    admin.dispose()
    assert list(open_dir.iterdir()) == []


def test_a_grant_beyond_the_rules_is_revoked_by_the_next_run(store):
    admin = create_engine(store.admin_url)
    with admin.begin() as conn:
        conn.execute(text(f"GRANT UPDATE ON evidence TO {PREFIX}_controller"))
        conn.execute(text("GRANT DELETE ON evidence TO PUBLIC"))
    report = store_roles.ensure_roles(admin, PREFIX, store.password_dir)
    admin.dispose()
    assert report.changes == [
        "revoked DELETE on evidence from public",
        f"revoked UPDATE on evidence from {PREFIX}_controller",
    ]
    controller = store.engine("controller")
    assert NOT_YOURS in str(refused(controller, "DELETE FROM evidence").orig)
    controller.dispose()


def test_a_login_that_is_not_a_superuser_is_refused_and_nothing_changes(store, tmp_path):
    operator = store.engine("operator")
    with pytest.raises(GpuaasError, match="as a PostgreSQL superuser") as caught:
        store_roles.ensure_roles(operator, "notsuper", tmp_path / "p")
    operator.dispose()
    assert caught.value.code == "store_roles_not_permitted"
    admin = create_engine(store.admin_url)
    with admin.connect() as conn:
        made = conn.execute(text("SELECT count(*) FROM pg_roles WHERE rolname LIKE 'notsuper%'"))
        assert made.scalar_one() == 0
    admin.dispose()
    assert not (tmp_path / "p").exists()


def test_roles_made_before_the_schema_let_the_owner_migrate_it(store, tmp_path):
    """On an empty database: the owner creates the whole schema (and migration 0001's
    trusted extension), and its upgrade gives the process roles their access."""
    admin = create_engine(store.admin_url.replace(f"/{DATABASE}?", "/postgres?"))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CREATE DATABASE fresh"))
    try:
        fresh_admin = create_engine(store.admin_url.replace(f"/{DATABASE}?", "/fresh?"))
        report = store_roles.ensure_roles(fresh_admin, "fr", tmp_path / "p")
        fresh_admin.dispose()
        assert all(r.created for r in report.roles)
        owner = create_engine(fresh_url(store, "owner", tmp_path / "p"))
        migrate.upgrade(owner)
        granted = store_roles.grant_as_owner(owner)
        owner.dispose()
        assert "granted INSERT on evidence to fr_controller" in granted
        reader = create_engine(fresh_url(store, "reader", tmp_path / "p"))
        with reader.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM skus")).scalar_one() > 0
        reader.dispose()
    finally:
        with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("DROP DATABASE fresh WITH (FORCE)"))
            for job in store_roles.JOBS:
                conn.execute(text(f"DROP ROLE fr_{job}"))
        admin.dispose()


def fresh_url(store: Store, job: str, password_dir: Path) -> str:
    return (
        f"postgresql+psycopg://fr_{job}@localhost:{store.port}/fresh?sslmode=verify-full"
        f"&sslrootcert={store.ca_file}&passfile={password_dir}/fr_{job}.pgpass"
    )


def test_a_prefix_that_is_not_a_plain_name_is_refused():
    with pytest.raises(GpuaasError, match="not a lower-case SQL name"):
        store_roles.role_names('gpuaas"; DROP ROLE postgres; --')


def test_rotating_passwords_replaces_every_passfile_and_the_old_password_stops_working(store):
    old = (store.password_dir / f"{PREFIX}_reader.pgpass").read_text()
    report = store_roles.ensure_roles(
        create_engine(store.admin_url), PREFIX, store.password_dir, rotate_passwords=True
    )
    assert report.changes == [] and all(r.password_file for r in report.roles)
    assert (store.password_dir / f"{PREFIX}_reader.pgpass").read_text() != old
    assert not list(store.password_dir.glob(".*.new"))
    stale = store.password_dir.parent / "stale.pgpass"
    stale.write_text(old)
    stale.chmod(0o600)
    url = store.url("reader").replace(
        str(store.password_dir / f"{PREFIX}_reader.pgpass"), str(stale)
    )
    with pytest.raises(OperationalError, match="password authentication failed"):
        create_engine(url).connect()
    engine = store.engine("reader")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT current_user")).scalar_one() == f"{PREFIX}_reader"
    engine.dispose()


def test_the_access_rules_name_every_table_of_the_store():
    assert set(store_roles.ACCESS) == set(Base.metadata.tables) | {"alembic_version"}
    for table, rules in store_roles.ACCESS.items():
        for job, rule in rules.items():
            assert job in ("controller", "operator")
            if table == "evidence":
                assert rule.table == {"SELECT", "INSERT"} and not rule.columns
            if table == "node_capacity":
                assert rule.table == {"SELECT"}
