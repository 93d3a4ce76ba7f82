"""The ``gpuaas`` commands, one module per command group or top-level command, each with
its own Typer app that ``gpuaas_cli.app`` assembles; ``common`` holds what they share."""
