"""Hypothesis against a real `flightdeck server` process, on real SQLite and PostgreSQL: malformed
and edge-case ingest batches (the wire format, field by field) and reads (every GET route of the
OpenAPI schema, and the dashboard pages) over one keep-alive HTTP connection.

No answer >= 500, no dropped connection, and every healthy snapshot sent beside the hostile ones
stored (tests/support/hostile_corpus.py builds the requests; bench/hostile_input.py runs a bigger corpus).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flightdeck.launch.demo.ranks import free_port
from flightdeck.server import store
from flightdeck.server.db import connect
from tests.support.hostile_corpus import Choice, Corpus, Tally, entries_lost, send

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: Requests per database: hypothesis examples (bounded, so each database takes well under a minute).
EXAMPLES = 300

choices = st.builds(
    Choice,
    kind=st.integers(0, 1000),
    where=st.integers(0, 1000),
    value=st.integers(0, 1000),
    extra=st.integers(0, 1000),
)


class RealServer:
    """A `flightdeck server` process on a database, its log in a file."""

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / "server.log"
        env = {
            **os.environ,
            "FLIGHTDECK_DATABASE_URL": database_url,
            "FLIGHTDECK_HOST": "127.0.0.1",
            "FLIGHTDECK_PORT": str(self.port),
            "FLIGHTDECK_ALLOW_UNAUTHENTICATED_INGEST": "true",
            "FLIGHTDECK_MIGRATE": "true",  # a fresh PostgreSQL schema is migrated only when told
        }
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flightdeck", "server"], env=env, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(self.base + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server did not come up")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


@pytest.fixture
def real_server(database_url: str, tmp_path: Path) -> Iterator[RealServer]:
    srv = RealServer(database_url, tmp_path)
    yield srv
    srv.stop()


def test_hostile_requests_get_no_5xx_and_keep_the_connection(
    real_server: RealServer, database_url: str
) -> None:
    with httpx.Client(base_url=real_server.base, timeout=30) as client:
        openapi = client.get("/openapi.json").json()
        corpus = Corpus(time.time_ns(), openapi=openapi)
        tally = Tally()
        last_addr: list[object] = [None]

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        )
        @given(choices)
        def one(c: Choice) -> None:
            before = (tally.five_xx, tally.dropped, len(tally.no_answer))
            send(client, corpus.request(c), tally, last_addr)
            assert (tally.five_xx, tally.dropped, len(tally.no_answer)) == before, (
                tally.server_errors[-1:] or tally.no_answer[-1:] or "connection dropped"
            )

        one()
        assert client.get("/healthz").status_code == 200
    assert tally.tried >= EXAMPLES and tally.five_xx == 0 and tally.dropped == 0 and not tally.no_answer
    assert len(tally.by_status) > 2, tally.by_status  # the corpus reached more than one answer
    assert tally.healthy, "no healthy snapshot was applied"
    assert entries_lost(tally.healthy, lambda jobs: stored_entries(database_url, jobs)) == 0
    assert real_server.proc.poll() is None


def stored_entries(database_url: str, jobs: Sequence[str]) -> dict[str, int]:
    """Entries the database holds per job name."""
    db = connect(database_url)
    try:
        out = {}
        with db.read() as session:
            for name in jobs:
                j = store.get_job(session=session, name=name)
                out[name] = 0 if j is None else store.count_entries(session=session, job_id=j.id)
        return out
    finally:
        db.dispose()
