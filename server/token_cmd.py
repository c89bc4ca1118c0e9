"""`flightdeck token create|revoke|list`: manage collector bearer tokens.

`create NAME --host HOST [--jobs PATTERN ...]` prints the token once; the database keeps only its
SHA-256. The token may then write only the ranks of HOST (and of the jobs the patterns match);
`--any-host` makes an unscoped token instead, which `list` flags.
"""

from __future__ import annotations

import argparse
import sys
import time


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of `flightdeck token`."""
    parser.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: FLIGHTDECK_SERVER_DATABASE_URL)"
    )
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("create", help="create a token for a collector and print it (once)")
    p.add_argument("name", help="collector name (the `collector` label of the metrics)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument(
        "--host",
        help="the host the collector runs on (the host name it reports: its `host` setting, default the machine's name): the token "
        "may write only that host's ranks",
    )
    scope.add_argument(
        "--any-host",
        action="store_true",
        help="an unscoped token that may write any host's ranks (one collector for several hosts)",
    )
    p.add_argument(
        "--jobs",
        action="append",
        metavar="PATTERN",
        help="only jobs whose name matches this shell-style pattern (repeat for several; default: any job)",
    )
    p = sub.add_parser("revoke", help="revoke a collector's token")
    p.add_argument("name")
    sub.add_parser("list", help="list collectors and whether their token is active")


def run(args: argparse.Namespace) -> int:
    """Run the token action; returns the exit code."""
    from pydantic import ValidationError
    from sqlalchemy.exc import IntegrityError

    from flightdeck.server import store
    from flightdeck.server.cmd import EXIT_SETTINGS, database_failure
    from flightdeck.server.db import connect
    from flightdeck.server.ingest import hash_token, new_token
    from flightdeck.server.schema import (
        DatabaseUnreachableError,
        SchemaError,
        ensure_schema,
        wait_for_database,
    )
    from flightdeck.server.settings import ServerSettings, settings_problems
    from flightdeck.server.token_scope import TokenScope

    def say(line: str) -> None:
        print(f"flightdeck token: {line}", file=sys.stderr, flush=True)

    try:
        settings = ServerSettings(**({"database_url": args.database_url} if args.database_url else {}))
    except ValidationError as exc:
        for line in settings_problems(exc):
            say(line)
        return EXIT_SETTINGS
    url = settings.effective_database_url
    db = connect(url)

    try:
        # As the server does: wait for the database, and migrate only what it would migrate.
        try:
            wait_for_database(db, url=url, deadline_s=settings.db_startup_timeout_s, report=say)
            ensure_schema(db, migrate_if_needed=settings.effective_migrate)
        except (DatabaseUnreachableError, SchemaError) as exc:
            return database_failure(exc, say)
        now = time.time_ns()
        with db.write() as session, session.begin():
            if args.action == "create":
                if not args.host and not args.any_host:
                    print(
                        "say which host the collector runs on: --host HOST "
                        "(or --any-host for a token that may write any host's ranks)",
                        file=sys.stderr,
                    )
                    return 2
                token = new_token()
                try:
                    store.create_token(
                        session=session,
                        name=args.name,
                        token_hash=hash_token(token),
                        now_ns=now,
                        host=args.host or None,
                        job_patterns=args.jobs,
                    )
                except IntegrityError:
                    print(f"a collector named {args.name!r} exists already", file=sys.stderr)
                    return 1
                print(token)
                return 0
            if args.action == "revoke":
                if not store.revoke_token(session=session, name=args.name, now_ns=now):
                    print(f"no active token for {args.name!r}", file=sys.stderr)
                    return 1
                return 0
            for t in store.list_tokens(session=session):
                state = "revoked" if t.revoked_at_ns is not None else "active"
                created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t.created_at_ns / 1e9))
                scope = TokenScope.of(t.host, t.job_patterns).describe()
                print(f"{t.name}\t{state}\tcreated {created}\t{scope}")
            return 0
    finally:
        db.dispose()
