"""Alembic's environment: migrate on the connection the caller hands in.

`tiered_memory.tiers.sql.migrate` passes its open connection in `config.attributes["connection"]`
and commits after. A developer writing a new revision runs the Alembic command line against a
scratch database instead (`alembic -x url=sqlite:///scratch.db revision --autogenerate -m ...`,
with the repository's alembic.ini); then a synchronous engine is made from that URL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import context

from tiered_memory.tiers.sql.schema import metadata


def _configure(connection: sa.Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite alters a table by copying it: batch mode does that for revisions that need it.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def _run() -> None:
    connection = context.config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    url = context.get_x_argument(as_dictionary=True).get("url") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("alembic: pass -x url=<synchronous SQLAlchemy URL> of a scratch database")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        _configure(conn)


_run()
