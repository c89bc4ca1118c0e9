"""Alembic environment: runs on the connection `flightdeck.server.db.migrate` hands over.

There is no alembic.ini: the configuration is built in code, so migrations run from an installed
wheel as well as from a checkout.
"""

from __future__ import annotations

from alembic import context

from flightdeck.server.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through flightdeck.server.db.migrate (it passes a connection)")

context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    # SQLite cannot ALTER most things in place: batch mode copies the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
