"""`flightdeck server`: run the control plane (ingest, live diagnosis, API, metrics) with uvicorn."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flightdeck.server.schema import DatabaseUnreachableError, SchemaError


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of `flightdeck server` (everything else: FLIGHTDECK_SERVER_* settings)."""
    parser.add_argument(
        "--host", default=None, help="bind address (default: FLIGHTDECK_SERVER_HOST or 127.0.0.1)"
    )
    parser.add_argument(
        "--port", type=int, default=None, help="TCP port (default: FLIGHTDECK_SERVER_PORT or 8470)"
    )
    parser.add_argument(
        "--database-url", default=None, help="SQLAlchemy URL (default: FLIGHTDECK_SERVER_DATABASE_URL)"
    )
    parser.add_argument(
        "--migrate",
        action="store_true",
        default=None,
        help="bring a missing or older database schema up to this version at start "
        "(default: FLIGHTDECK_SERVER_MIGRATE; unset: SQLite yes, PostgreSQL no)",
    )
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    # The listening socket an idle restart hands to the new image (flightdeck/server/idle_restart.py).
    parser.add_argument("--listen-fd", type=int, default=None, help=argparse.SUPPRESS)


#: Exit codes of `flightdeck server` that say why it did not start (1: anything else).
EXIT_SETTINGS = 2
EXIT_DB_UNREACHABLE = 3
EXIT_SCHEMA = 4
#: uvicorn's own when the server did not start (uvicorn.run's STARTUP_FAILURE), kept as it was.
EXIT_STARTUP = 3


def database_failure(exc: DatabaseUnreachableError | SchemaError, say: Callable[[str], None]) -> int:
    """For the commands that only use the database (`migrate`, `token`): say why it cannot be
    used and return the exit code for that (unreachable, or its schema not usable)."""
    from flightdeck.server.schema import DatabaseUnreachableError

    if isinstance(exc, DatabaseUnreachableError):
        say(f"giving up: {exc}")
        return EXIT_DB_UNREACHABLE
    say(str(exc))
    return EXIT_SCHEMA


def _say(line: str) -> None:
    print(f"flightdeck server: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Build the settings, then serve until interrupted; returns the exit code."""
    import uvicorn
    from pydantic import ValidationError

    from flightdeck.server.app import create_app
    from flightdeck.server.idle_restart import IdleRestart, exec_again, supported
    from flightdeck.server.schema import DatabaseUnreachableError, SchemaError
    from flightdeck.server.settings import ServerSettings, settings_problems

    overrides: dict[str, object] = {
        k: v for k, v in (("host", args.host), ("port", args.port), ("database_url", args.database_url)) if v
    }
    if getattr(args, "migrate", None):
        overrides["migrate"] = True
    try:
        settings = ServerSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        for line in settings_problems(exc):
            _say(f"refusing to start: {line}")
        return EXIT_SETTINGS
    restart = (
        IdleRestart(above_mib=settings.idle_restart_above_mib, say=_say)
        if args.as_program and settings.idle_restart_above_mib > 0 and supported()
        else None
    )
    try:
        app = create_app(settings, report=_say, idle_restart=restart)
    except DatabaseUnreachableError as exc:
        _say(f"giving up: {exc}")
        return EXIT_DB_UNREACHABLE
    except SchemaError as exc:
        _say(f"refusing to start: {exc}")
        return EXIT_SCHEMA
    config = uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level=args.log_level, access_log=settings.access_log
    )
    if args.listen_fd is not None:
        sock = socket.socket(fileno=args.listen_fd)
        _say(f"restarted in place, serving {settings.host}:{settings.port} again")
    else:
        sock = config.bind_socket()
    server = uvicorn.Server(config)
    if restart is not None:
        restart.stop = lambda: setattr(server, "should_exit", True)
    # uvicorn closes its socket when it stops; this copy keeps the listener open for the new image.
    kept = os.dup(sock.fileno())
    # The interpreter is tuned for the server in the app's lifespan (flightdeck/runtime_tuning.py).
    try:
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # Ctrl-C: a quiet stop, as uvicorn.run has it
            return 0
        if not server.started:  # uvicorn.run's exit code when the app did not start
            return EXIT_STARTUP
        if restart is not None and restart.requested:
            # (A SIGTERM during the shutdown ended the process above: it is not restarted.)
            try:
                exec_again(sys.argv[1:], kept)
            except OSError as exc:  # the interpreter gone (a venv replaced): the supervisor restarts
                _say(f"could not restart in place ({exc}); exiting")
                return 1
        return 0
    finally:
        os.close(kept)  # (an exec that succeeded never comes here: the new image holds it)
