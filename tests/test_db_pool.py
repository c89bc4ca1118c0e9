"""Pooled PostgreSQL connections (`server/db.py`): checked before use only after sitting idle."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from flightdeck.server.db import Database, connect


def _backend_pid(db: Database) -> int:
    with db.read() as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(url: str, pid: int) -> None:
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as c:
        c.execute("SELECT pg_terminate_backend(%s)", [pid])
    time.sleep(0.2)  # the backend is gone once the signal is handled


@pytest.mark.slow
def test_a_connection_that_sat_idle_is_checked_and_replaced(pg_database: str) -> None:
    db = connect(pg_database, pool_size=1, ping_idle_s=0.0)  # every checkout counts as idle
    try:
        pid = _backend_pid(db)
        _terminate(pg_database, pid)
        # The ping finds the dead connection; the pool opens a new one and the query succeeds.
        assert _backend_pid(db) != pid
    finally:
        db.dispose()


@pytest.mark.slow
def test_a_connection_used_a_moment_ago_is_not_pinged(pg_database: str) -> None:
    db = connect(pg_database, pool_size=1, ping_idle_s=3600.0)
    try:
        pid = _backend_pid(db)
        _terminate(pg_database, pid)
        # No ping: the statement itself meets the dead connection (the batch would be answered
        # 503 and resent), SQLAlchemy drops it, and the next checkout connects anew.
        with pytest.raises(OperationalError, match="terminat"):
            _backend_pid(db)
        assert _backend_pid(db) != pid
    finally:
        db.dispose()
