"""The database at start-up and while serving: reachable (with retries), and on the schema version
this code needs (the Alembic head).

A server refuses a database whose schema is missing or older than its own unless told to
migrate (`ServerSettings.migrate`), and one written by a newer version always; while serving,
`SchemaGuard` notices a schema that went away (a database dropped and recreated empty) so that
/healthz and ingest answer 503 with the reason instead of failing on every statement.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable

from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from flightdeck.server.db import Database, alembic_config, migrate

log = logging.getLogger(__name__)


class DatabaseUnreachableError(Exception):
    """The database did not answer within the start-up deadline (the message says why)."""


class SchemaError(Exception):
    """The database's schema is not the one this server needs (the message says what to do)."""


@functools.cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revisions() -> tuple[str, ...]:
    """The schema revision(s) this code needs (one, unless branches are merged later)."""
    return tuple(sorted(_script().get_heads()))


def current_revision(db: Database) -> str | None:
    """The database's schema revision; None when it has no schema (no `alembic_version` table).
    Raises `sqlalchemy.exc.DBAPIError` when the database cannot be reached."""
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def schema_problem(revision: str | None) -> tuple[str, str] | None:
    """Why a database at `revision` cannot be served by this code, or None when it can:
    (kind, reason), kind `missing`, `older` (both fixed by migrating) or `newer`."""
    heads = head_revisions()
    if revision in heads:
        return None
    want = ", ".join(heads)
    if revision is None:
        return (
            "missing",
            f"the database has no Flightdeck schema (empty database?); this server needs revision {want}",
        )
    try:
        known = _script().get_revision(revision) is not None
    except Exception:  # alembic raises its own errors for an unknown id
        known = False
    if known:
        return "older", f"the database schema is at revision {revision}, older than this server's {want}"
    return "newer", (
        f"the database schema is at revision {revision}, unknown to this server (written by a newer "
        f"Flightdeck?); this server needs {want}: upgrade the server"
    )


#: What the operator does about a missing or older schema.
HOW_TO_MIGRATE = (
    "run `flightdeck migrate`, or start the server with --migrate (FLIGHTDECK_SERVER_MIGRATE=true)"
)


def ensure_schema(db: Database, *, migrate_if_needed: bool) -> str:
    """Check the schema and migrate it when allowed; returns the revision served.

    Raises `SchemaError` (a one-line reason and what to do) when the schema is missing or older
    and migrating is not allowed, or when it is newer than this code (never downgraded here).
    """
    revision = current_revision(db)
    problem = schema_problem(revision)
    if problem is None:
        return str(revision)
    kind, reason = problem
    if kind == "newer":
        raise SchemaError(reason)
    if not migrate_if_needed:
        raise SchemaError(f"{reason}: {HOW_TO_MIGRATE}")
    log.warning(
        "migrating the database schema from %s to %s", revision or "nothing", ", ".join(head_revisions())
    )
    migrate(db)
    return ", ".join(head_revisions())


def safe_url(url: str) -> str:
    """The URL without its password, for messages."""
    return make_url(url).render_as_string(hide_password=True)


def _first_line(exc: BaseException) -> str:
    msg = str(getattr(exc, "orig", None) or exc).strip()
    return msg.splitlines()[0] if msg else type(exc).__name__


def wait_for_database(
    db: Database,
    *,
    url: str,
    deadline_s: float,
    backoff_initial_s: float = 0.5,
    backoff_max_s: float = 5.0,
    report: Callable[[str], None] = log.warning,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> int:
    """Wait until the database answers a query, retrying with exponential backoff and one
    `report` line per failed attempt; returns the number of attempts.

    Raises `DatabaseUnreachableError` once `deadline_s` has passed without an answer.
    """
    started = monotonic()
    delay = backoff_initial_s
    attempt = 0
    where = safe_url(url)
    while True:
        attempt += 1
        try:
            with db.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return attempt
        except DBAPIError as exc:
            reason = _first_line(exc)
        left = deadline_s - (monotonic() - started)
        if left <= 0:
            raise DatabaseUnreachableError(
                f"database {where} not reachable after {attempt} attempts in {deadline_s:g} s "
                f"(FLIGHTDECK_SERVER_DB_STARTUP_TIMEOUT_S): {reason}"
            )
        wait = min(delay, left)
        report(f"database {where} not reachable (attempt {attempt}: {reason}); retrying in {wait:.1f} s")
        sleep(wait)
        delay = min(delay * 2, backoff_max_s)


class SchemaGuard:
    """Whether the schema is still one this process can serve, checked when asked and at most
    every `min_interval_s` (after failed statements and on /healthz, never per request).

    `on_lost` runs when the schema is found gone or changed: the caller drops whatever it holds
    of the old database's rows (cached ids, in-memory jobs), which a recreated database does
    not have. With `migrate_if_needed`, a missing or older schema is migrated on the spot.
    """

    def __init__(
        self,
        db: Database,
        *,
        on_lost: Callable[[], None],
        migrate_if_needed: bool = False,
        min_interval_s: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = db
        self._on_lost = on_lost
        self._migrate = migrate_if_needed
        self._min_interval_s = min_interval_s
        self._mono = monotonic
        self._lock = threading.Lock()
        self._checked = -float("inf")
        #: Why the schema cannot be used now; None while it is fine.
        self.problem: str | None = None

    def explains(self, exc: BaseException) -> str | None:
        """The schema problem behind a failed statement (already logged once, when found), or
        None when `exc` is something else: a worker then stays quiet instead of logging a
        traceback per step for as long as the schema is gone."""
        if not isinstance(exc, DBAPIError):
            return None
        try:
            return self.check(failed=True)
        except DBAPIError:
            return None

    def check(self, *, force: bool = False, failed: bool = False) -> str | None:
        """The current problem (None: fine), asking the database unless asked very recently.
        `failed`: asked because a statement failed, when "fine" a moment ago is not good enough
        (a known problem is still not asked again more than every `min_interval_s`).
        Raises `DBAPIError` when the database cannot be reached (that is not a schema problem)."""
        with self._lock:
            recent = self._mono() - self._checked < self._min_interval_s
            if not force and recent and (self.problem is not None or not failed):
                return self.problem
            self._checked = self._mono()
            found = schema_problem(current_revision(self._db))
            if found is not None and self.problem is None:
                log.error("database schema lost: %s", found[1])
                self._on_lost()
            if found is not None and found[0] != "newer" and self._migrate:
                ensure_schema(self._db, migrate_if_needed=True)
                found = None
            if found is None:
                self.problem = None
            else:
                kind, reason = found
                self.problem = reason if kind == "newer" else f"{reason}: {HOW_TO_MIGRATE}"
            return self.problem
