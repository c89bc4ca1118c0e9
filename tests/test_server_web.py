"""The incident dashboard served by the control plane, backed by the SQL store (`StoreData`).

Real batches built from the committed dumps of real gloo jobs are ingested into a real app
(SQLite file and PostgreSQL, via the `database_url` fixture), diagnosed by the live worker stepped
by hand, and the HTML pages are read through the FastAPI TestClient in process.
"""

from __future__ import annotations

import html
import json
import re
import struct
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from flightdeck.collector.nixl_consumer import OwnerFinder, RingConsumer
from flightdeck.nixl_rates import histogram_quantile
from flightdeck.nixl_records import NixlSample
from flightdeck.records import Frame
from flightdeck.server.page_data import StoreData
from flightdeck.web import views
from flightdeck.web.routes import CSP
from flightdeck.wire import Snapshot
from tests.support.clock import FakeClock
from tests.support.server_app import NS, STALL_S, Server, make_server
from tests.support.server_batches import skip_stuck_view

EVIL = "<script>alert(1)</script>"
#: A job id with a slash, a space and an unclosed tag: one URL path segment cannot hold it.
EVIL_JOB = "team a/<script>alert(1)"


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
    (row,) = doc["jobs"]
    assert (row["status"], row["hosts"], row["findings"]) == ("hung", "1", 1)
    assert row["summary"] == "Hang: group 0, seq 12, all_reduce, culprit 2"


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


@pytest.mark.parametrize("view", ["seq", "time"])
def test_the_page_from_cells_shows_what_it_shows_from_whole_entries(server: Server, view: str) -> None:
    """The page reads each entry's cell (`window_cells`), not the whole record: what it shows,
    every cell's state, op and label and the wall-time bars, is the same as from whole entries."""
    _hung(server, skip_stuck_view())
    data = StoreData(db=server.svc.db, live=server.svc.live, clock=server.clock, job_idle_s=3600)
    report, meta = data.job_report("skip"), data.job_meta("skip")
    assert report is not None and meta is not None
    (g,) = [g for g in meta["groups"] if g["name"] == "0"]
    window = views.plan_window(min_seq=g["min_seq"], max_seq=g["max_seq"], stuck_seq=12, start=None)
    shown = []
    for detail in ("entries", "spans" if view == "time" else "cells"):
        tl = data.timeline("skip", group="0", ranks=None, seqs=(window.first, window.last), detail=detail)
        shown.append(views.job_view(report, meta, tl, group="0", window=window, view=view))  # type: ignore[arg-type]
    whole, cells = shown
    assert cells.rows and cells == whole
    # Read as the driver's plain rows: the flags are still booleans (SQLite holds them as 0/1).
    tl = data.timeline("skip", group="0", ranks=None, seqs=(window.first, window.last))
    assert {type(e.retired) for t in tl.ranks for e in t.entries} == {bool}  # type: ignore[union-attr]
    if view == "time":
        assert cells.lanes and any(lane.bars for lane in cells.lanes)
    assert {c.state for r in cells.rows for c in r.cells} >= {"completed", "never_entered"}


def test_a_quiet_job_page_answers_304_until_it_changes(server: Server) -> None:
    """The live fragment a browser polls carries an ETag; the same poll of an unchanged job is a
    304 without a body, also after more diagnoses (elapsed times grow, nothing shown changes),
    and a new snapshot of the job makes it a 200 again with another ETag."""
    snaps = skip_stuck_view()
    _hung(server, snaps)
    poll = {"HX-Request": "true", "HX-Target": "live"}
    first = server.client.get("/jobs/skip", headers=poll)
    assert first.status_code == 200
    etag = first.headers["etag"]
    assert first.headers["cache-control"] == "private, no-cache"
    server.clock.now_ns += 5 * NS
    server.diagnose()
    quiet = server.client.get("/jobs/skip", headers={**poll, "If-None-Match": etag})
    assert (quiet.status_code, quiet.content, quiet.headers["etag"]) == (304, b"", etag)
    # Another view of the same job (the whole page, another window) is another entity.
    whole = server.client.get("/jobs/skip", headers={"If-None-Match": etag})
    assert whole.status_code == 200 and whole.headers["etag"] != etag
    later = [replace(s, snapshot_time_ns=s.snapshot_time_ns + 4 * NS) for s in snaps]
    assert server.push(later).status_code == 200
    server.diagnose()
    changed = server.client.get("/jobs/skip", headers={**poll, "If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert "rank 2" in _text(changed.text).lower()


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


def test_page_errors_are_html_pages_and_api_errors_stay_json(server: Server) -> None:
    """A person who mistypes a job, a path or a rank filter gets a page of the dashboard saying
    so; the API (and a page's ?format=json twin) keeps answering JSON."""
    _hung(server, skip_stuck_view())
    for path, params, status, reason in [
        ("/jobs/nope", {}, 404, "no such job"),
        ("/no/such/page", {}, 404, "Not Found"),
        ("/jobs/skip", {"ranks": "1-x"}, 400, "bad filter"),
        ("/jobs/skip", {"start": "-1"}, 422, "bad parameter: start"),
        ("/jobs/skip/ranks/9", {}, 404, "no such job or rank"),
    ]:
        r = server.client.get(path, params=params)
        assert r.status_code == status, (path, r.text)
        assert r.headers["content-type"].startswith("text/html"), (path, r.headers)
        assert r.headers["content-security-policy"] == CSP
        assert "<h1>" in r.text and reason in html.unescape(r.text), (path, r.text)
        assert '"detail"' not in r.text
    api = server.client.get("/api/v1/jobs/nope")
    assert api.status_code == 404 and api.json()["detail"] == "no job 'nope'"
    twin = server.client.get("/jobs/nope", params={"format": "json"})
    assert twin.status_code == 404 and twin.json() == {"detail": "no such job"}
    bad_api = server.client.get("/api/v1/jobs/skip/timeline", params={"limit": "0"})
    assert bad_api.status_code == 422 and bad_api.headers["content-type"] == "application/json"


def test_login_required_page_is_html_and_keeps_the_challenge(database_url: str, clock: FakeClock) -> None:
    srv = make_server(database_url, clock, web_token="ui-token-0123456789abcdef")
    try:
        r = srv.client.get("/")
        assert r.status_code == 401 and r.headers["content-type"].startswith("text/html")
        assert r.headers["www-authenticate"].startswith("Basic ")
        assert "Login required" in r.text
    finally:
        srv.svc.close()


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


@pytest.mark.slow
def test_job_id_with_slash_space_and_tag(server: Server) -> None:
    snaps = [replace(s, job=EVIL_JOB) for s in skip_stuck_view()]
    _hung(server, snaps)
    # Every link the pages print leads somewhere: the jobs page to the job, the job page to its
    # cells, ranks and polling URL, the cell page back to the job.
    jobs = server.client.get("/").text
    (job_href,) = re.findall(r'href="(/jobs/[^"]*)"', jobs)
    assert job_href == "/jobs/team%20a/%3Cscript%3Ealert%281%29"
    r = server.client.get(html.unescape(job_href))
    assert r.status_code == 200, r.text
    doc = server.client.get(html.unescape(job_href), params={"format": "json"}).json()
    assert doc["job"] == EVIL_JOB and [c["rank"] for c in doc["banner"]["culprits"]] == [2]
    links = {html.unescape(u) for u in re.findall(r'(?:href|hx-get)="(/jobs/[^"]*)"', r.text)}
    assert any("/cell?" in u for u in links) and any("/ranks/" in u for u in links)
    for url in sorted(links):
        page = server.client.get(url)
        assert page.status_code == 200, url
        assert EVIL_JOB not in page.text and "&lt;script&gt;alert(1)" in page.text, url
    # The same id, sent as the decoded path a proxy might forward, and with the slash escaped.
    for prefix in ["/jobs/team a/<script>alert(1)", "/jobs/" + quote(EVIL_JOB, safe="")]:
        assert server.client.get(prefix).status_code == 200, prefix
        assert server.client.get(prefix + "/ranks/2").status_code == 200, prefix
        cell = server.client.get(prefix + "/cell", params={"group": "0", "seq": 12, "rank": 0})
        assert cell.status_code == 200, prefix
    assert server.client.get("/jobs/team a").status_code == 404
    assert server.client.get("/jobs/team a/<script>alert(1)/ranks/9").status_code == 404
    # The JSON API takes the same ids.
    api = "/api/v1/jobs/" + quote(EVIL_JOB)
    assert server.client.get(api).json()["job"] == EVIL_JOB
    assert server.client.get(api + "/findings").json()["findings"][0]["kind"] == "hang"
    entries = server.client.get(api + "/timeline", params={"group": "0", "seq_from": 12, "seq_to": 12})
    assert entries.status_code == 200 and entries.json()["entries"]
    assert server.client.get("/api/v1/jobs/team%20a").status_code == 404


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


# --- NIXL: rates from the kept history of real samples --------------------------------------------

NIXL_DATA = Path(__file__).resolve().parent / "data" / "nixl"


class RingReads:
    """Real samples of the committed NIXL 1.5.1 ring `initiator` (tests/data/nixl, written by a
    real nixl agent pair), read by the collector's `RingConsumer` at chosen times.

    The fixture holds phase 2 of the producer unread (4 WRITEs of 4 KiB, one failed post); phase 1
    was consumed when it was made. `before_phase_2` puts the file as it was between the phases
    (write position back at the read position: nothing unread), `phase_2` puts the real bytes
    back, so a consumer polled in between sees exactly what the producer did in phase 2.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "ring" / "initiator"
        self.path.parent.mkdir()
        self.real = (NIXL_DATA / "ring-1.5.1" / "initiator").read_bytes()
        self.now_ns = 0
        self.finder = OwnerFinder(tmp_path)  # an empty /proc root: no owner process

    def clock(self) -> int:
        return self.now_ns

    def consumer(self, at_ns: int) -> RingConsumer:
        """A collector's consumer of the ring, started at `at_ns` (its counter run)."""
        self.now_ns = at_ns
        return RingConsumer(self.path, host="gpu-node-1", clock=self.clock, owner_finder=self.finder)

    def before_phase_2(self) -> None:
        data = bytearray(self.real)
        _write_pos, read_pos = struct.unpack_from("<QQ", data, 0)
        struct.pack_into("<Q", data, 0, read_pos)
        self.path.write_bytes(bytes(data))

    def phase_2(self) -> None:
        self.path.write_bytes(self.real)

    def poll(self, consumer: RingConsumer, at_ns: int) -> NixlSample:
        self.now_ns = at_ns
        return consumer.poll()


def _agent(server: Server) -> dict[str, Any]:
    (agent,) = server.client.get("/api/v1/nixl/agents").json()
    assert isinstance(agent, dict)
    return agent


def test_nixl_rates_from_two_real_samples(server: Server, tmp_path: Path) -> None:
    ring = RingReads(tmp_path)
    expected = json.loads((NIXL_DATA / "expected.json").read_text())["1.5.1"]["ring"]
    t0 = 1_800_000_000 * NS
    consumer = ring.consumer(t0)
    ring.before_phase_2()
    s0 = ring.poll(consumer, t0)
    ring.phase_2()
    s1 = ring.poll(consumer, t0 + 20 * NS)
    assert (s0.tx_bytes, s0.tx_requests) == (0, 0)
    tx_bytes = expected[1]["tx_bytes"] - expected[0]["tx_bytes"]
    tx_requests = expected[1]["tx_requests"] - expected[0]["tx_requests"]
    assert (s1.tx_bytes, s1.tx_requests, s1.errors) == (tx_bytes, tx_requests, (("not_found", 1),))

    assert server.push([], nixl=[s0.to_wire()]).status_code == 200
    assert _agent(server)["window"] is None  # one sample: no rate yet
    assert server.push([], nixl=[s1.to_wire()]).status_code == 200
    assert server.counts()["nixl_samples"] == 2

    window = _agent(server)["window"]
    assert window["seconds"] == 20.0
    assert window["tx_bytes_per_s"] == tx_bytes / 20  # 16 KiB in 20 s
    assert window["tx_requests_per_s"] == tx_requests / 20
    assert window["rx_bytes_per_s"] == 0.0
    assert window["errors"] == {"not_found": 1} and window["events_dropped"] == 0
    # The quantiles are those of phase 2's transfers: the first sample had none.
    xfer = s1.xfer_time
    assert window["xfer_time_us"] == {
        "count": tx_requests,
        "p50": histogram_quantile(0.5, xfer.bounds_us, xfer.counts),
        "p90": histogram_quantile(0.9, xfer.bounds_us, xfer.counts),
        "p99": histogram_quantile(0.99, xfer.bounds_us, xfer.counts),
    }
    assert window["xfer_time_us"]["p50"] is not None

    # The page shows the same, as text, and its JSON twin carries the numbers.
    view = server.client.get("/nixl", params={"format": "json"}).json()
    (row,) = view["hosts"][0]["agents"]
    assert row["rates"] == window
    assert row["tx_rate"] == "819 B/s" and row["req_rate"] == "0.2/s"
    assert row["window"] == "last 20.0 s" and row["new_errors"] == 1 and row["problem"] is True
    text = _text(server.client.get("/nixl").text)
    assert "819 B/s" in text and "✗ not_found: 1" in text and "1 new error" in text


def test_nixl_rates_across_a_collector_restart(server: Server, tmp_path: Path) -> None:
    ring = RingReads(tmp_path)
    t0 = 1_800_000_000 * NS
    first = ring.consumer(t0)
    ring.before_phase_2()
    s0 = ring.poll(first, t0)
    ring.phase_2()
    s1 = ring.poll(first, t0 + 20 * NS)
    # The collector restarts (a new consumer: a new counter run) and finds phase 2 unread again.
    ring.phase_2()
    second = ring.consumer(t0 + 30 * NS)
    s2 = ring.poll(second, t0 + 40 * NS)
    assert s2.run != s1.run and s2.tx_bytes == s1.tx_bytes
    for s in (s0, s1, s2):
        assert server.push([], nixl=[s.to_wire()]).status_code == 200
    agent = _agent(server)
    window = agent["window"]
    # Counted: phase 2 by the first run, then phase 2 again since the reset; none lost, none negative.
    assert window["resets"] == 1 and window["seconds"] == 40.0
    assert window["tx_bytes_per_s"] == 2 * s1.tx_bytes / 40
    assert window["errors"] == {"not_found": 2}
    assert window["xfer_time_us"]["count"] == 2 * s1.tx_requests
    assert agent["totals"]["tx_bytes"] == 2 * s1.tx_bytes  # the metrics' totals agree


def test_nixl_history_is_thinned_and_expires(server: Server, tmp_path: Path) -> None:
    ring = RingReads(tmp_path)
    t0 = server.clock.now_ns
    consumer = ring.consumer(t0)
    ring.phase_2()
    # A collector pushing every 2 s for a minute: the history keeps one sample per 10 s.
    for i in range(31):
        assert server.push([], nixl=[ring.poll(consumer, t0 + 2 * i * NS).to_wire()]).status_code == 200
    assert server.counts()["nixl_samples"] == 7  # t0, +10 s, ..., +60 s
    window = _agent(server)["window"]
    assert window["seconds"] == 60.0 and window["tx_bytes_per_s"] == 0.0  # nothing new after phase 2
    server.clock.now_ns = t0 + 60 * NS
    (row,) = server.client.get("/nixl", params={"format": "json"}).json()["hosts"][0]["agents"]
    assert not row["stale"] and row["sampled"].endswith("UTC, 0 ms ago")
    server.clock.advance(server.svc.settings.retention_days * 86400 + 120)
    server.svc.run_retention()
    assert server.counts()["nixl_samples"] == 0
    agent = _agent(server)
    assert agent["window"] is None and agent["latest"]["tx_requests"] == 4  # the agent stays
    # The page says the agent went quiet, rather than showing old numbers as current.
    (row,) = server.client.get("/nixl", params={"format": "json"}).json()["hosts"][0]["agents"]
    assert row["stale"] and row["window"] == "no rate yet: one sample"
    assert "⚠ no new sample" in server.client.get("/nixl").text
