"""``gpuaas db``: the store's schema and the embedded PostgreSQL."""

from __future__ import annotations

from typing import Any

import typer

from gpuaas_cli.commands.common import JsonFlag, control_plane, out, run

app = typer.Typer(no_args_is_help=True, help="Database schema and the embedded PostgreSQL.")


@app.command("upgrade")
def db_upgrade(as_json: JsonFlag = False) -> None:
    """Apply all migrations (creates the embedded database on first use)."""
    run(
        as_json,
        lambda: {"revision": control_plane().upgrade_schema()},
        lambda r: out.print(f"schema at revision {r['revision']}"),
    )


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
