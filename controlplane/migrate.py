"""Schema migrations (Alembic), callable from the CLI and tests."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine


def alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", "controlplane:migrations")
    config.set_main_option(
        "sqlalchemy.url", engine.url.render_as_string(hide_password=False).replace("%", "%%")
    )
    return config


def upgrade(engine: Engine, revision: str = "head") -> None:
    with engine.begin() as connection:
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
