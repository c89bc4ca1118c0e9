"""The incident dashboard served by the control plane, backed by the SQL store (`StoreData`).

Real batches built from the committed dumps of real gloo jobs are ingested into a real app
(SQLite file and PostgreSQL, via the `database_url` fixture), diagnosed by the live worker stepped
by hand, and the HTML pages are read through the FastAPI TestClient in process.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import quote

import pytest

from flightdeck.records import Frame
from flightdeck.web.routes import CSP
from flightdeck.wire import Snapshot
from tests.conftest import FakeClock
from tests.test_server_api import NS, STALL_S, Server, make_server, skip_stuck_view

EVIL = "<script>alert(1)</script>"
#: A job name cannot hold "/" (it is one path segment), so the name carries an unclosed tag.
EVIL_JOB = "<script>alert(1)"


@pytest.fixture
def server(database_url: str, clock: FakeClock) -> Iterator[Server]:
    """A server on a fresh database (SQLite file or PostgreSQL schema)."""
    srv = make_server(database_url, clock)
    yield srv
    srv.svc.close()


def _hung(server: Server, snaps: list[Snapshot]) -> None:
    """Ingest `snaps` and diagnose them past the stall threshold."""
    server.clock.now_ns = max(s.snapshot_time_ns for s in snaps) + int((STALL_S + 3) * NS)
    assert server.push(snaps).status_code == 200
    server.diagnose()


def _text(body: str) -> str:
    """Visible text of an HTML body, whitespace collapsed."""
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def test_jobs_page_lists_the_job(server: Server) -> None:
    _hung(server, skip_stuck_view())
    r = server.client.get("/")
    assert r.status_code == 200, r.text
    assert r.headers["content-security-policy"] == CSP
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "/jobs/skip" in r.text
    doc = server.client.get("/", params={"format": "json"}).json()
    assert [j["job"] for j in doc["jobs"]] == ["skip"]


def test_job_page_names_the_culprit(server: Server) -> None:
    _hung(server, skip_stuck_view())
    r = server.client.get("/jobs/skip")
    assert r.status_code == 200, r.text
    assert r.headers["content-security-policy"] == CSP
    assert r.text.lstrip().lower().startswith("<!doctype html")
    assert "rank 2" in _text(r.text).lower()

    doc: dict[str, Any] = server.client.get("/jobs/skip", params={"format": "json"}).json()
    assert doc["job"] == "skip" and not doc["healthy"]
    assert doc["banner"]["kind"] == "hang"
    assert [c["rank"] for c in doc["banner"]["culprits"]] == [2]
    assert doc["banner"]["waiting"] == "0–1, 3"
    assert doc["banner"]["group"] == "0" and doc["banner"]["seq"] == 12
    assert doc["group"] == "0"
    assert doc["window"]["first"] <= 12 <= doc["window"]["last"]
    assert doc["reporting_ranks"] == 4
    # The job's status as the API reports it: the page reads the same verdict.
    assert server.job("skip")["status"] == "hung"


def test_timeline_fragment_for_htmx(server: Server) -> None:
    _hung(server, skip_stuck_view())
    r = server.client.get("/jobs/skip", headers={"HX-Request": "true", "HX-Target": "timeline"})
    assert r.status_code == 200, r.text
    assert "<html" not in r.text.lower() and "<head" not in r.text.lower()
    assert "/jobs/skip/cell?" in r.text  # the cells link to their detail
    assert "HX-Request" in r.headers["vary"]
    whole = server.client.get("/jobs/skip").text
    assert len(r.text) < len(whole)


def test_stuck_cell_detail_shows_stack_frames(server: Server) -> None:
    snaps = skip_stuck_view()
    _hung(server, snaps)
    waiting = next(s for s in snaps if s.rank == 0)
    stuck = next(e for e in waiting.entries if e.group == "0" and e.collective_seq_id == 12 and not e.is_p2p)
    assert stuck.frames, "the stall snapshot carries the stuck collective's stack"
    r = server.client.get("/jobs/skip/cell", params={"group": "0", "seq": 12, "rank": 0})
    assert r.status_code == 200, r.text
    text = _text(r.text)
    assert any(f.name in text for f in stuck.frames)
    doc = server.client.get("/jobs/skip/cell", params={"group": "0", "seq": 12, "rank": 2, "format": "json"})
    assert doc.status_code == 200
    assert doc.json()["seq"] == 12
    frag = server.client.get(
        "/jobs/skip/cell",
        params={"group": "0", "seq": 12, "rank": 0},
        headers={"HX-Request": "true", "HX-Target": "cell"},
    )
    assert frag.status_code == 200 and "<html" not in frag.text.lower()
    assert server.client.get("/jobs/skip/ranks/0").status_code == 200
    assert (
        server.client.get("/jobs/skip/cell", params={"group": "0", "seq": 12, "rank": 9}).status_code == 404
    )


def test_unknown_job_is_404(server: Server) -> None:
    r = server.client.get("/jobs/nope")
    assert r.status_code == 404
    assert r.headers["content-security-policy"] == CSP


def test_script_in_job_name_and_frames_is_escaped(server: Server) -> None:
    evil_frame = Frame(EVIL, f"/tmp/{EVIL}.py", 7)
    snaps = []
    for s in skip_stuck_view():
        entries = [replace(e, frames=(evil_frame, *e.frames)) if e.frames else e for e in s.entries]
        snaps.append(replace(s, job=EVIL_JOB, entries=entries))
    _hung(server, snaps)
    pages = [
        server.client.get("/"),
        server.client.get("/jobs/" + quote(EVIL_JOB, safe="")),
        server.client.get(
            "/jobs/" + quote(EVIL_JOB, safe="") + "/cell", params={"group": "0", "seq": 12, "rank": 0}
        ),
    ]
    for r in pages:
        assert r.status_code == 200, r.text
        assert EVIL_JOB not in r.text and EVIL not in r.text
        assert "&lt;script&gt;alert(1)" in r.text
        assert r.headers["content-security-policy"] == CSP
    assert EVIL in _text(pages[2].text)  # the frame is shown, as text


def test_api_and_metrics_are_unchanged(server: Server) -> None:
    _hung(server, skip_stuck_view())
    api = server.client.get("/api/v1/jobs")
    assert api.status_code == 200 and api.json()[0]["job"] == "skip"
    assert "content-security-policy" not in api.headers
    m = server.client.get("/metrics")
    assert m.status_code == 200 and "content-security-policy" not in m.headers
    assert 'flightdeck_job_hang_active{group="0",job="skip"} 1.0' in m.text
    assert "content-security-policy" not in server.client.get("/docs").headers


def test_web_token_guards_the_pages_only(database_url: str, clock: FakeClock) -> None:
    token = "ui-token-0123456789abcdef"
    srv = make_server(database_url, clock, web_token=token)
    try:
        _hung(srv, skip_stuck_view())
        assert srv.client.get("/jobs/skip").status_code == 401
        ok = srv.client.get("/jobs/skip", headers={"Authorization": f"Bearer {token}"})
        assert ok.status_code == 200
        assert srv.client.get("/jobs/skip", auth=("anyone", token)).status_code == 200
        assert srv.client.get("/api/v1/jobs").status_code == 200  # the API has its own auth setting
    finally:
        srv.svc.close()
