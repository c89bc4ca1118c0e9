"""Shared fixtures. Server tests: a real database per test (SQLite file, or a fresh schema in a
PostgreSQL database created for the test session), a fake clock. Collector tests: a recording ingest
endpoint. Web tests: the source of the pages' data. Helpers that are not fixtures live in
tests/support/."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.support.clock import FakeClock
from tests.support.collector_recorder import Recorder
from tests.support.postgres import PG_ADMIN_URL
from tests.support.web_pages import SOURCES, Source


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database created for this test session (dropped at the end)."""
    if not PG_ADMIN_URL:
        pytest.skip("FLIGHTDECK_TEST_PG is empty: PostgreSQL tests are off")
    psycopg = pytest.importorskip("psycopg")
    name = f"flightdeck_test_{uuid.uuid4().hex[:10]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {PG_ADMIN_URL}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1)
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# The PostgreSQL variant is a real service: `slow`, so the fast loop runs the SQLite one only.
@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)])
def database_url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    """A fresh, empty database: a SQLite file, or a new schema in the session's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/flightdeck.db"
    base: str = request.getfixturevalue("pg_database")
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return f"{base}?options=-csearch_path%3D{schema}"


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock at a fixed moment (tests move it)."""
    return FakeClock(1_800_000_000 * 1_000_000_000)


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    """A recording ingest endpoint on 127.0.0.1 for the collector tests (collector_recorder.py)."""
    with Recorder() as rec:
        yield rec


@pytest.fixture(scope="module", params=SOURCES)
def source(request: pytest.FixtureRequest) -> Source:
    """Where the pages' data comes from: the dumps analysed in process, or the server's store."""
    param: Source = request.param
    return param
