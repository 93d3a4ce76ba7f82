"""``gpuaas ui``: the Prefect UI, API and worker in the foreground (the store and signal
handling it needs are in ``gpuaas_cli.ui``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from sqlalchemy.engine import make_url

from gpuaas_cli.commands.common import error_contract, out
from gpuaas_cli.helpfix import Typer

app = Typer()


@app.command("ui")
def ui_command(
    port: Annotated[int, typer.Option("--port", help="Port of the Prefect UI and API.")] = 4200,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address the Prefect server listens on: loopback by default, the site's "
            "management address when controllers on other machines use it (with an auth "
            "string).",
        ),
    ] = "127.0.0.1",
    demo: Annotated[
        bool,
        typer.Option("--demo", help="Act on the demo's fleet (after make demo) and its runs."),
    ] = False,
    auth_string_file: Annotated[
        Path | None,
        typer.Option(
            "--auth-string-file",
            help="File only its owner can read holding USER:PASSWORD, the basic auth every "
            "API call must send (or PREFECT_SERVER_API_AUTH_STRING); required with a --host "
            "beyond loopback.",
        ),
    ] = None,
) -> None:
    """Start a Prefect server and worker (on loopback unless given --host) with every
    deployment (Ctrl-C, SIGTERM or SIGHUP stops both)."""
    # Prefect and Alembic are slow to import: only this command needs them.
    from flows.serve import prefect_stack
    from gpuaas_cli import ui

    ui.stop_on_signals()
    try:
        with error_contract(False):
            # Before anything starts: a server beyond loopback is refused without one.
            auth_string = ui.auth_string(host, auth_string_file)
            store_url, prefect_database = ui.ui_store(demo)
            with prefect_stack(
                store_url, port, prefect_database, host=host, auth_string=auth_string
            ) as stack:
                api = f"{stack.api_url} behind basic auth" if stack.authenticated else stack.api_url
                # soft_wrap: a long data path must not split a line that scripts read.
                out.print(
                    f"Prefect UI: {stack.ui_url}  (API {api}, Prefect data: "
                    f"{stack.database}, fleet store: database {make_url(store_url).database})\n"
                    "deployments from prefect.yaml are registered on work pool gpuaas-process; "
                    "a process worker is running. Ctrl-C stops both.",
                    soft_wrap=True,
                )
                while True:
                    time.sleep(3600)
    except KeyboardInterrupt:
        out.print("stopped")
    except ui.StopRequested as stop:
        out.print(f"stopped ({stop})")
