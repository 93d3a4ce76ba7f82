"""Least-privilege store roles: who may change the schema, write which table, or only read.

Four login roles, named ``<prefix>_<job>`` (docs/operations.md, "Store roles"):

- ``owner`` owns every table, sequence and function of the store, so it alone runs
  migrations (DDL needs ownership);
- ``controller`` is the login of the Prefect flows and workers;
- ``operator`` is the login of the ``gpuaas`` CLI;
- ``reader`` is the login of dashboards and the fleet picture: SELECT only.

Evidence is appended, never rewritten: no process role holds UPDATE, DELETE or TRUNCATE
on it, and the ``evidence_append_only`` trigger refuses them to the owner as well. The
usage counters (``node_capacity``, ``project_quotas.gpus_used``/``allocations_used``)
are written by the triggers of controlplane/sql, which run as the owner (SECURITY
DEFINER), so no process role is granted a write of them.

``ensure_roles`` creates or checks the roles and converges ownership and grants in one
transaction; a role of the same name that it did not create, or that has powers or
memberships of its own, is refused before anything changes. A second run changes
nothing. Passwords are generated here, stored by the server as SCRAM verifiers computed
by libpq (the plaintext never reaches the server or a log), and written once to 0600
passfiles in a 0700 directory.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy import Engine

from controlplane.errors import GpuaasError, InvalidInput

SCHEMA = "public"
JOBS = ("owner", "controller", "operator", "reader")
PROCESS_JOBS = ("controller", "operator", "reader")
# Marks a role ensure_roles created (a comment on the role), and for which job.
MARKER = "gpuaas store role: "
PREFIX_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,40}")
RELATION_KINDS = {"r": "TABLE", "p": "TABLE", "v": "VIEW", "m": "MATERIALIZED VIEW"}


@dataclass(frozen=True)
class Access:
    """What one role may do on one table: whole-table privileges and, per privilege, the
    columns it covers when it covers only some."""

    table: frozenset[str] = frozenset({"SELECT"})
    columns: tuple[tuple[str, tuple[str, ...]], ...] = ()


READ = Access()
WRITE = Access(frozenset({"SELECT", "INSERT", "UPDATE"}))
APPEND = Access(frozenset({"SELECT", "INSERT"}))
# The placement statements lock a node's counters row FOR UPDATE (the per-node mutex),
# which PostgreSQL allows only with UPDATE on some column; node_capacity_written_by_triggers
# refuses the write itself.
LOCK_COUNTERS = Access(columns=(("UPDATE", ("node_id",)),))

# Every table of the store, for the controller and the operator (the reader reads every
# table). What is not here is not granted: DELETE only where the code deletes, and no
# write of evidence or of a usage counter.
ACCESS: dict[str, dict[str, Access]] = {
    "alembic_version": {"controller": READ, "operator": READ},
    "skus": {"controller": READ, "operator": WRITE},
    "nodes": {"controller": WRITE, "operator": WRITE},
    "node_host_keys": {"controller": WRITE, "operator": WRITE},
    "node_capacity": {"controller": LOCK_COUNTERS, "operator": LOCK_COUNTERS},
    "node_resource_slots": {"controller": WRITE, "operator": WRITE},
    "projects": {"controller": READ, "operator": WRITE},
    "project_quotas": {
        "controller": READ,
        # A quota's scope and limits; its usage columns are the triggers'.
        "operator": Access(
            frozenset({"SELECT", "DELETE"}),
            (
                (
                    "INSERT",
                    (
                        "project_id",
                        "sku_id",
                        "capacity_shape",
                        "region_code",
                        "gpu_limit",
                        "allocation_limit",
                        "updated_at",
                    ),
                ),
                ("UPDATE", ("gpu_limit", "allocation_limit", "updated_at")),
            ),
        ),
    },
    "project_reservations": {
        "controller": READ,
        "operator": Access(frozenset({"SELECT", "INSERT", "DELETE"})),
    },
    "project_reservation_nodes": {"controller": READ, "operator": APPEND},
    "allocations": {"controller": WRITE, "operator": WRITE},
    "allocation_resource_claims": {"controller": WRITE, "operator": WRITE},
    "node_tasks": {"controller": WRITE, "operator": WRITE},
    "evidence": {"controller": APPEND, "operator": APPEND},
    # A sweep's verdict is the controller's, written once; it then records whether the
    # verdict changed the node's admin state (controlplane/services/sweeps.py).
    "sweep_verdicts": {
        "controller": Access(
            frozenset({"SELECT", "INSERT"}), (("UPDATE", ("admin_state_changed",)),)
        ),
        "operator": READ,
    },
    # The health loop's findings: the controller opens, refreshes and clears them.
    "health_findings": {"controller": WRITE, "operator": READ},
    "outbox": {"controller": WRITE, "operator": APPEND},
    "os_images": {"controller": WRITE, "operator": WRITE},
    "node_image_cache": {"controller": WRITE, "operator": WRITE},
}


def access(table: str, job: str) -> Access:
    """A table the rules do not name (a database newer than this code) is only read."""
    return ACCESS.get(table, {}).get(job, READ)


@dataclass
class RoleOutcome:
    job: str
    name: str
    created: bool
    password_file: str | None = None


@dataclass
class RolesReport:
    database: str
    roles: list[RoleOutcome]
    changes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.changes) or any(r.password_file for r in self.roles)


def role_names(prefix: str) -> dict[str, str]:
    if not PREFIX_PATTERN.fullmatch(prefix):
        raise InvalidInput(
            "role_prefix_invalid",
            f"role prefix {prefix!r} is not a lower-case SQL name (letters, digits, _; "
            "starting with a letter, at most 41 characters)",
            {"prefix": prefix},
        )
    return {job: f"{prefix}_{job}" for job in JOBS}


def ensure_roles(
    engine: Engine, prefix: str, password_dir: Path, rotate_passwords: bool = False
) -> RolesReport:
    """Create or check the four roles on the store ``engine`` reaches (as a PostgreSQL
    superuser), and converge ownership and grants, in one transaction."""
    names = role_names(prefix)
    staged: dict[Path, Path] = {}
    try:
        with _transaction(engine) as conn:
            conflicts = [c for job, name in names.items() for c in _conflicts(conn, job, name)]
            if conflicts:
                raise GpuaasError(
                    "store_role_conflict",
                    "refusing to take over existing roles: " + "; ".join(conflicts),
                    {"conflicts": conflicts},
                )
            report = RolesReport(conn.info.dbname, [])
            passwords: dict[str, str] = {}
            for job, name in names.items():
                created = _role_oid(conn, name) is None
                if created:
                    conn.execute(
                        sql.SQL(
                            "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE"
                            " NOREPLICATION NOBYPASSRLS"
                        ).format(sql.Identifier(name))
                    )
                    conn.execute(
                        sql.SQL("COMMENT ON ROLE {} IS {}").format(
                            sql.Identifier(name), sql.Literal(MARKER + job)
                        )
                    )
                    report.changes.append(f"created role {name}")
                if created or rotate_passwords:
                    passwords[name] = _set_password(conn, name)
                report.roles.append(RoleOutcome(job, name, created))
            report.changes += _database_access(conn, report.database, names)
            report.changes += _transfer_ownership(conn, names["owner"])
            report.changes += _grants(conn, names)
            staged = _stage_password_files(password_dir, passwords)
    except BaseException as exc:
        for partial in staged:
            partial.unlink(missing_ok=True)
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            raise GpuaasError(
                "store_roles_not_permitted",
                f"the login of GPUAAS_DATABASE_URL may not set up the store roles ({exc}): "
                "run gpuaas db roles as a PostgreSQL superuser; nothing was changed",
                {"refused": str(exc)},
            ) from exc
        raise
    # Committed: the new passwords hold, so their files replace the old ones.
    for partial, final in staged.items():
        os.replace(partial, final)
    written = {final.name.removesuffix(".pgpass"): str(final) for final in staged.values()}
    for outcome in report.roles:
        outcome.password_file = written.get(outcome.name)
    return report


def grant_as_owner(engine: Engine) -> list[str] | None:
    """After a migration run by a store owner: give the process roles their access to
    tables the migration created. None when the login is not a store owner."""
    with _transaction(engine) as conn:
        login = conn.execute("SELECT current_user").fetchone()[0]
        if _marked_job(conn, login) != "owner" or not login.endswith("_owner"):
            return None
        names = role_names(login.removesuffix("_owner"))
        missing = [n for n in names.values() if _marked_job(conn, n) is None]
        if missing:
            return None
        return _grants(conn, names)


@contextmanager
def _transaction(engine: Engine) -> Iterator[psycopg.Connection]:
    with engine.begin() as connection:
        driver = connection.connection.driver_connection
        assert isinstance(driver, psycopg.Connection)
        yield driver


def _role_oid(conn: psycopg.Connection, name: str) -> int | None:
    row = conn.execute("SELECT oid FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
    return row[0] if row else None


def _marked_job(conn: psycopg.Connection, name: str) -> str | None:
    row = conn.execute(
        "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = %s", (name,)
    ).fetchone()
    if row is None or not (row[0] or "").startswith(MARKER):
        return None
    return row[0].removeprefix(MARKER)


def _conflicts(conn: psycopg.Connection, job: str, name: str) -> list[str]:
    """Why an existing role of this name is not one ensure_roles may keep using."""
    row = conn.execute(
        """
        SELECT r.rolsuper, r.rolcreaterole, r.rolcreatedb, r.rolreplication, r.rolbypassrls,
               r.rolcanlogin,
               ARRAY(SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
                     WHERE m.member = r.oid ORDER BY 1),
               ARRAY(SELECT g.rolname FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.member
                     WHERE m.roleid = r.oid ORDER BY 1)
        FROM pg_roles r WHERE r.rolname = %s
        """,
        (name,),
    ).fetchone()
    if row is None:
        return []
    superuser, createrole, createdb, replication, bypassrls, login, member_of, members = row
    marked = _marked_job(conn, name)
    found = []
    if marked is None:
        found.append(f"{name} exists and was not created by gpuaas db roles")
    elif marked != job:
        found.append(f"{name} was created as the {marked} role, not the {job} role")
    powers = [
        power
        for power, held in (
            ("SUPERUSER", superuser),
            ("CREATEROLE", createrole),
            ("CREATEDB", createdb),
            ("REPLICATION", replication),
            ("BYPASSRLS", bypassrls),
        )
        if held
    ]
    if powers:
        found.append(f"{name} has {', '.join(powers)}")
    if not login:
        found.append(f"{name} cannot log in")
    if member_of:
        found.append(f"{name} is a member of {', '.join(member_of)}")
    if members:
        found.append(f"{name} is granted to {', '.join(members)}")
    return found


def _set_password(conn: psycopg.Connection, name: str) -> str:
    """A new random password, sent to the server only as libpq's SCRAM-SHA-256 verifier."""
    password = secrets.token_urlsafe(32)
    verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
    conn.execute(
        sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(name), sql.Literal(verifier.decode())
        )
    )
    return password


def _acl(conn: psycopg.Connection, query: str, params: tuple) -> set[tuple[str, str]]:
    """(grantee, privilege) pairs of an ACL; PUBLIC is the grantee ``public``."""
    return {
        (grantee, privilege)
        for grantee, privilege in conn.execute(
            f"""
            SELECT coalesce(g.rolname, 'public'), a.privilege_type
            FROM ({query}) acl(items), aclexplode(acl.items) a
            LEFT JOIN pg_roles g ON g.oid = a.grantee
            """,
            params,
        )
    }


def _converge(
    conn: psycopg.Connection,
    kind: str,
    target: sql.Composable,
    label: str,
    held: set[tuple[str, str]],
    wanted: set[tuple[str, str]],
    grantees: Iterable[str],
    column: str | None = None,
) -> list[str]:
    """GRANT what is wanted and missing, REVOKE what ``grantees`` hold beyond it (of one
    ``column`` of a table when given)."""
    changes = []
    grantees = set(grantees)
    columns = sql.SQL(" ({})").format(sql.Identifier(column)) if column else sql.SQL("")
    for verb, pairs, preposition in (
        ("GRANT", sorted(wanted - held), "TO"),
        ("REVOKE", sorted(p for p in held - wanted if p[0] in grantees), "FROM"),
    ):
        for grantee, privilege in pairs:
            conn.execute(
                sql.SQL("{} {}{} ON {} {} {} {}").format(
                    sql.SQL(verb),
                    sql.SQL(privilege),
                    columns,
                    sql.SQL(kind),
                    target,
                    sql.SQL(preposition),
                    _grantee(grantee),
                )
            )
            done = "granted" if verb == "GRANT" else "revoked"
            changes.append(f"{done} {privilege} on {label} {preposition.lower()} {grantee}")
    return changes


def _grantee(name: str) -> sql.Composable:
    return sql.SQL("PUBLIC") if name == "public" else sql.Identifier(name)


def _database_access(conn: psycopg.Connection, database: str, names: dict[str, str]) -> list[str]:
    """Only the store roles (and superusers) connect; none makes temporary tables, which
    would shadow the store's tables in the functions they call; the owner may create
    schemas and trusted extensions (migration 0001 creates one)."""
    held = _acl(
        conn,
        "SELECT coalesce(datacl, acldefault('d', datdba)) FROM pg_database WHERE datname = %s",
        (database,),
    )
    wanted = {(names[job], "CONNECT") for job in JOBS} | {(names["owner"], "CREATE")}
    owner_of_database = conn.execute(
        "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", (database,)
    ).fetchone()[0]
    wanted |= {(g, p) for g, p in held if g == owner_of_database}
    return _converge(
        conn,
        "DATABASE",
        sql.Identifier(database),
        f"database {database}",
        held,
        wanted,
        ["public", *names.values()],
    )


def _transfer_ownership(conn: psycopg.Connection, owner: str) -> list[str]:
    """Give the owner role every table (with its indexes and owned sequences), remaining
    sequence and function of the store's schema."""
    changes = []
    relations = conn.execute(
        """
        SELECT c.relname, c.relkind FROM pg_class c
        WHERE c.relnamespace = %s::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
          AND c.relowner <> %s::regrole
        ORDER BY 1
        """,
        (SCHEMA, owner),
    ).fetchall()
    for name, kind in relations:
        conn.execute(
            sql.SQL("ALTER {} {} OWNER TO {}").format(
                sql.SQL(RELATION_KINDS[kind]), sql.Identifier(SCHEMA, name), sql.Identifier(owner)
            )
        )
        changes.append(f"{owner} owns {name}")
    sequences = conn.execute(
        """
        SELECT c.relname FROM pg_class c
        WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'S'
          AND c.relowner <> %s::regrole ORDER BY 1
        """,
        (SCHEMA, owner),
    ).fetchall()
    for (name,) in sequences:
        conn.execute(
            sql.SQL("ALTER SEQUENCE {} OWNER TO {}").format(
                sql.Identifier(SCHEMA, name), sql.Identifier(owner)
            )
        )
        changes.append(f"{owner} owns sequence {name}")
    functions = conn.execute(
        """
        SELECT p.oid::regprocedure::text FROM pg_proc p
        WHERE p.pronamespace = %s::regnamespace AND p.proowner <> %s::regrole
          AND NOT EXISTS (SELECT 1 FROM pg_depend d WHERE d.objid = p.oid AND d.deptype = 'e')
        ORDER BY 1
        """,
        (SCHEMA, owner),
    ).fetchall()
    for (signature,) in functions:
        # The signature is the catalog's own rendering of the function (regprocedure).
        conn.execute(
            sql.SQL("ALTER ROUTINE {} OWNER TO {}").format(
                sql.SQL(signature), sql.Identifier(owner)
            )
        )
        changes.append(f"{owner} owns function {signature}")
    return changes


def _grants(conn: psycopg.Connection, names: dict[str, str]) -> list[str]:
    """Converge the schema's, tables', columns' and sequences' grants on ACCESS, and the
    owner's default privileges, so a table a later migration creates is readable at once."""
    process_roles = [names[job] for job in PROCESS_JOBS]
    # A privilege granted to PUBLIC is every role's, so it is revoked from PUBLIC as well.
    revocable = ["public", *process_roles]
    owner = names["owner"]
    changes = _converge(
        conn,
        "SCHEMA",
        sql.Identifier(SCHEMA),
        f"schema {SCHEMA}",
        _acl(conn, "SELECT nspacl FROM pg_namespace WHERE nspname = %s", (SCHEMA,)),
        {(names[job], "USAGE") for job in JOBS} | {(owner, "CREATE")},
        # PUBLIC loses CREATE (PostgreSQL 14 grants it); its USAGE is the default.
        [*names.values()],
    )
    if ("public", "CREATE") in _acl(
        conn, "SELECT nspacl FROM pg_namespace WHERE nspname = %s", (SCHEMA,)
    ):
        conn.execute(
            sql.SQL("REVOKE CREATE ON SCHEMA {} FROM PUBLIC").format(sql.Identifier(SCHEMA))
        )
        changes.append(f"revoked CREATE on schema {SCHEMA} from public")
    tables = conn.execute(
        "SELECT c.oid, c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace"
        " AND c.relkind IN ('r', 'p', 'v', 'm') ORDER BY 2",
        (SCHEMA,),
    ).fetchall()
    for oid, table in tables:
        rules = {names[job]: access(table, job) for job in PROCESS_JOBS}
        rules[names["reader"]] = READ
        target = sql.Identifier(SCHEMA, table)
        changes += _converge(
            conn,
            "TABLE",
            target,
            table,
            _acl(conn, "SELECT relacl FROM pg_class WHERE oid = %s", (oid,)),
            {(role, p) for role, rule in rules.items() for p in rule.table},
            revocable,
        )
        columns = [
            name
            for (name,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum",
                (oid,),
            )
        ]
        for column in columns:
            wanted = {
                (role, privilege)
                for role, rule in rules.items()
                for privilege, covered in rule.columns
                if column in covered
            }
            changes += _converge(
                conn,
                "TABLE",
                target,
                f"{table}.{column}",
                _acl(
                    conn,
                    "SELECT attacl FROM pg_attribute WHERE attrelid = %s AND attname = %s",
                    (oid, column),
                ),
                wanted,
                revocable,
                column,
            )
    writers = [names["controller"], names["operator"]]
    for oid, sequence in conn.execute(
        "SELECT c.oid, c.relname FROM pg_class c WHERE c.relnamespace = %s::regnamespace"
        " AND c.relkind = 'S' ORDER BY 2",
        (SCHEMA,),
    ).fetchall():
        changes += _converge(
            conn,
            "SEQUENCE",
            sql.Identifier(SCHEMA, sequence),
            f"sequence {sequence}",
            _acl(conn, "SELECT relacl FROM pg_class WHERE oid = %s", (oid,)),
            {(role, "USAGE") for role in writers},
            revocable,
        )
    changes += _default_privileges(conn, owner, process_roles, writers)
    return changes


def _default_privileges(
    conn: psycopg.Connection, owner: str, readers: list[str], writers: list[str]
) -> list[str]:
    changes = []
    for kind, code, privilege, grantees in (
        ("TABLES", "r", "SELECT", readers),
        ("SEQUENCES", "S", "USAGE", writers),
    ):
        held = _acl(
            conn,
            "SELECT defaclacl FROM pg_default_acl WHERE defaclrole = %s::regrole"
            " AND defaclnamespace = %s::regnamespace AND defaclobjtype = %s",
            (owner, SCHEMA, code),
        )
        for grantee in grantees:
            if (grantee, privilege) in held:
                continue
            conn.execute(
                sql.SQL(
                    "ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA {} GRANT {} ON {} TO {}"
                ).format(
                    sql.Identifier(owner),
                    sql.Identifier(SCHEMA),
                    sql.SQL(privilege),
                    sql.SQL(kind),
                    sql.Identifier(grantee),
                )
            )
            changes.append(f"{owner}'s new {kind.lower()} grant {privilege} to {grantee}")
    return changes


def _stage_password_files(directory: Path, passwords: dict[str, str]) -> dict[Path, Path]:
    """Write each password as a libpq passfile line (``*:*:*:role:password``: any host,
    port and database) to ``<directory>/.<role>.pgpass.new``, mode 0600 in a 0700
    directory; the caller renames each to ``<role>.pgpass`` once the passwords are
    committed. Returns the staged path and final path of each."""
    if not passwords:
        return {}
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if directory.stat().st_mode & 0o077:
        raise InvalidInput(
            "password_dir_open",
            f"{directory} may be read by others than its owner: chmod 700 it or choose "
            "another directory for the store role passwords",
            {"directory": str(directory)},
        )
    staged: dict[Path, Path] = {}
    try:
        for name, password in passwords.items():
            partial = directory / f".{name}.pgpass.new"
            descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.fchmod(descriptor, 0o600)
            staged[partial] = directory / f"{name}.pgpass"
            with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
                handle.write(f"*:*:*:{name}:{password}\n")
    except OSError as exc:
        for partial in staged:
            partial.unlink(missing_ok=True)
        raise InvalidInput(
            "password_file_unwritable",
            f"cannot write the store role passwords to {directory}: {exc.strerror}",
            {"directory": str(directory)},
        ) from exc
    return staged
