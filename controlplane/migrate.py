"""Schema migrations (Alembic), callable from the CLI and tests."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine

from controlplane.errors import GpuaasError

# Oldest server the store is tested for: partial unique indexes, statement triggers with
# transition tables, gen_random_uuid() in core.
MINIMUM_SERVER = (14,)


def require_supported_server(version: tuple[int, ...]) -> None:
    """Refuse a PostgreSQL older than the store needs, before any migration runs."""
    if tuple(version[: len(MINIMUM_SERVER)]) < MINIMUM_SERVER:
        raise GpuaasError(
            "postgres_unsupported",
            f"PostgreSQL {'.'.join(map(str, version))} is too old; the store needs "
            f"{'.'.join(map(str, MINIMUM_SERVER))} or newer",
            {"server_version": list(version)},
        )


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", "controlplane:migrations")
    config.set_main_option(
        "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as connection:
        require_supported_server(tuple(connection.dialect.server_version_info or ()))
        config = alembic_config(engine)
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def downgrade(engine: Engine, revision: str) -> None:
    with engine.begin() as connection:
        config = alembic_config(engine)
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", "controlplane:migrations")
    return ScriptDirectory.from_config(config).get_current_head()
