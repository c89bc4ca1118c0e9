"""Hypothesis against a real `flightdeck server` process, on real SQLite and PostgreSQL: malformed
and edge-case ingest batches (the wire format, field by field) and reads (every GET route of the
OpenAPI schema, and the dashboard pages) over one keep-alive HTTP connection.

No answer >= 500, no dropped connection, and every healthy snapshot sent beside the hostile ones
stored (tests/support/hostile_corpus.py builds the requests; bench/hostile_input.py runs a bigger corpus).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.hostile_corpus import Choice, Corpus, Tally, entries_lost, send, stored_entries
from tests.support.server_process import ServerProcess

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


@pytest.fixture
def real_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A `flightdeck server` process on `database_url`, unauthenticated ingest, its log in a file."""
    env = {
        **os.environ,
        "FLIGHTDECK_SERVER_DATABASE_URL": database_url,
        "FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST": "true",
        "FLIGHTDECK_SERVER_MIGRATE": "true",  # a fresh PostgreSQL schema is migrated only when told
    }
    with ServerProcess(env, tmp_path / "server.log") as srv:
        srv.start()
        yield srv


def test_hostile_requests_get_no_5xx_and_keep_the_connection(
    real_server: ServerProcess, database_url: str
) -> None:
    with httpx.Client(base_url=real_server.url, timeout=30) as client:
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
    assert real_server.proc is not None and real_server.proc.poll() is None
