"""Engines, sessions and migrations for SQLite (WAL) and PostgreSQL."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DisconnectionError
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

#: Key of the PostgreSQL advisory lock that serializes migrations of several starting servers.
_MIGRATION_LOCK_KEY = 0x46444B  # "FDK"


@dataclass(frozen=True, slots=True)
class Database:
    """The engines and session factories of one server process.

    `write` sessions take SQLite's write lock at BEGIN (BEGIN IMMEDIATE): a deferred transaction
    that reads and then writes can fail at once with "database is locked" instead of waiting,
    because WAL cannot upgrade a stale read snapshot. PostgreSQL uses one engine for both.
    """

    engine: Engine
    write_engine: Engine
    read: sessionmaker[Session]
    write: sessionmaker[Session]

    @property
    def dialect(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self.engine.dialect.name

    def dispose(self) -> None:
        """Close every pooled connection."""
        self.engine.dispose()
        if self.write_engine is not self.engine:
            self.write_engine.dispose()


def _sqlite_engine(url: str, *, immediate: bool, busy_timeout_s: float) -> Engine:
    engine = create_engine(url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN itself (pysqlite's implicit BEGIN is deferred).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        # NORMAL in WAL mode is durable against application crashes; only a power cut can lose
        # the last commits, which the collectors resend anyway (idempotent batches).
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        # 64 MiB page cache per connection (default 2 MiB): entry upserts land all over the
        # (job, group, seq) index, and a cache smaller than the index's hot part re-reads pages.
        cur.execute("PRAGMA cache_size=-65536")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _ping_when_idle(engine: Engine, idle_s: float) -> None:
    """Check a pooled PostgreSQL connection before use when it sat idle for `idle_s` or more.

    SQLAlchemy's `pool_pre_ping` pings on every checkout: a round trip per transaction, on the
    ingest writers' critical path (a sixth of their statements at thousands of ranks). A
    connection used a moment ago is alive unless the server went away since, and then its
    statement fails, SQLAlchemy drops it, and the batch is answered 503 and sent again.
    """

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        if time.monotonic() - record.info.get("checked_in_at", -math.inf) < idle_s:
            return
        try:
            dbapi_conn.execute("SELECT 1")
            dbapi_conn.rollback()
        except Exception as exc:
            raise DisconnectionError(str(exc)) from exc  # the pool reconnects and tries again

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_conn: Any, record: Any) -> None:
        record.info["checked_in_at"] = time.monotonic()


def connect(
    url: str, *, pool_size: int = 8, busy_timeout_s: float = 10.0, ping_idle_s: float = 1.0
) -> Database:
    """Open the database at `url` (SQLAlchemy URL); creates a SQLite file's directory.

    `busy_timeout_s`: how long a SQLite writer waits for the lock before failing (then: 503).
    `ping_idle_s`: a PostgreSQL connection idle this long is checked before use.
    """
    u = make_url(url)
    if u.get_backend_name() == "sqlite":
        if u.database and u.database != ":memory:":
            Path(u.database).parent.mkdir(parents=True, exist_ok=True)
        read = _sqlite_engine(url, immediate=False, busy_timeout_s=busy_timeout_s)
        write = _sqlite_engine(url, immediate=True, busy_timeout_s=busy_timeout_s)
    else:
        # A host that drops packets would hold a connection attempt for minutes (libpq waits
        # forever by default); an unreachable database is then reported and retried instead.
        args = {} if "connect_timeout" in u.query else {"connect_timeout": 10}
        read = write = create_engine(url, pool_size=pool_size, max_overflow=pool_size, connect_args=args)
        _ping_when_idle(read, ping_idle_s)

        @event.listens_for(read, "connect")
        def _on_pg_connect(dbapi_conn: Any, _record: Any) -> None:
            from flightdeck.server.pg_arrays import register

            register(dbapi_conn.adapters)  # the entries upsert sends binary arrays

    return Database(
        engine=read,
        write_engine=write,
        read=sessionmaker(read, expire_on_commit=False),
        write=sessionmaker(write, expire_on_commit=False),
    )


def alembic_config() -> Config:
    """Alembic configuration built in code (works from an installed wheel: no ini file needed)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def migrate(db: Database, revision: str = "head") -> None:
    """Upgrade the schema to `revision`; concurrent servers on one PostgreSQL take turns."""
    cfg = alembic_config()
    with db.write_engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Transaction-scoped: released at commit, after the migration.
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)
