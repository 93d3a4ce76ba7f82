"""``gpuaas db``: the store's schema and the embedded PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gpuaas_cli.commands.common import JsonFlag, control_plane, out, run
from gpuaas_cli.helpfix import Typer

app = Typer(no_args_is_help=True, help="Database schema and the embedded PostgreSQL.")


@app.command("upgrade")
def db_upgrade(as_json: JsonFlag = False) -> None:
    """Apply all migrations (creates the embedded database on first use)."""

    def upgrade() -> dict[str, Any]:
        from controlplane import store_roles

        plane = control_plane()
        revision = plane.upgrade_schema()
        # Run as a store owner, the process roles get their access to any new table.
        grants = store_roles.grant_as_owner(plane.engine)
        return (
            {"revision": revision} if grants is None else {"revision": revision, "grants": grants}
        )

    def render(result: dict[str, Any]) -> None:
        out.print(f"schema at revision {result['revision']}")
        for change in result.get("grants", []):
            out.print(f"  {change}")

    run(as_json, upgrade, render)


@app.command("roles")
def db_roles(
    password_dir: Annotated[
        Path,
        typer.Option(
            "--password-dir",
            help="Directory (0700) for each new password, as a 0600 libpq passfile <role>.pgpass.",
        ),
    ],
    prefix: Annotated[
        str,
        typer.Option(
            "--prefix",
            help="Names the roles <prefix>_owner, _controller, _operator and _reader.",
        ),
    ] = "gpuaas",
    rotate_passwords: Annotated[
        bool, typer.Option("--rotate-passwords", help="Give existing roles new passwords too.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Create or check the least-privilege store roles (run as a superuser).

    The owner alone changes the schema; flows, the CLI and dashboards get their own roles.
    A second run changes nothing, and passwords go only to 0600 files, never to the output.
    """
    from controlplane import store_roles

    def ensure() -> dict[str, Any]:
        report = store_roles.ensure_roles(
            control_plane().engine, prefix, password_dir, rotate_passwords
        )
        return {
            "database": report.database,
            "changed": report.changed,
            "roles": report.roles,
            "changes": report.changes,
        }

    def render(result: dict[str, Any]) -> None:
        for role in result["roles"]:
            state = "created" if role["created"] else "exists"
            where = f", password in {role['password_file']}" if role["password_file"] else ""
            out.print(f"{role['name']} ({role['job']}): {state}{where}")
        for change in result["changes"]:
            out.print(f"  {change}")
        if not result["changed"]:
            out.print(f"store roles of {result['database']} unchanged")

    run(as_json, ensure, render)


@app.command("stop")
def db_stop(as_json: JsonFlag = False) -> None:
    """Stop the embedded PostgreSQL (no effect with GPUAAS_DATABASE_URL)."""
    from controlplane.embedded import EmbeddedPostgres

    def stop() -> dict[str, Any]:
        cluster = EmbeddedPostgres()
        return {"data_dir": str(cluster.data_dir), "stopped": cluster.stop()}

    run(
        as_json,
        stop,
        lambda r: out.print(f"embedded PostgreSQL at {r['data_dir']} stopped: {r['stopped']}"),
    )
