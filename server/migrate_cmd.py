"""`flightdeck migrate`: bring the database schema up to this version (Alembic head), then exit.

For a PostgreSQL database, which `flightdeck server` does not migrate unless told to
(`--migrate`, `FLIGHTDECK_SERVER_MIGRATE`): run it once per upgrade, before the new servers start.
Several at once take turns (an advisory lock); an up-to-date schema is left as it is.
"""

from __future__ import annotations

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of `flightdeck migrate`."""
    parser.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: FLIGHTDECK_SERVER_DATABASE_URL)"
    )
    parser.add_argument(
        "--check", action="store_true", help="only say whether the schema is current (exit 0) or not (exit 4)"
    )


def run(args: argparse.Namespace) -> int:
    """Migrate (or check) the schema; returns the exit code (3: unreachable, 4: schema not usable)."""
    from flightdeck.server.cmd import EXIT_SCHEMA, database_failure
    from flightdeck.server.db import connect
    from flightdeck.server.schema import (
        DatabaseUnreachableError,
        SchemaError,
        current_revision,
        ensure_schema,
        safe_url,
        schema_problem,
        wait_for_database,
    )
    from flightdeck.server.settings import ServerSettings

    settings = ServerSettings(**({"database_url": args.database_url} if args.database_url else {}))
    url = settings.effective_database_url

    def say(line: str) -> None:
        print(f"flightdeck migrate: {line}", file=sys.stderr, flush=True)

    db = connect(url)
    try:
        wait_for_database(db, url=url, deadline_s=settings.db_startup_timeout_s, report=say)
        before = current_revision(db)
        if args.check:
            problem = schema_problem(before)
            print(problem[1] if problem else f"{safe_url(url)}: schema at revision {before} (current)")
            return EXIT_SCHEMA if problem else 0
        after = ensure_schema(db, migrate_if_needed=True)
    except (DatabaseUnreachableError, SchemaError) as exc:
        return database_failure(exc, say)
    finally:
        db.dispose()
    print(f"{safe_url(url)}: schema at revision {after}" + ("" if before == after else f" (was {before})"))
    return 0
