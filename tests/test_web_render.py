"""The web pages rendered from real flight-recorder dumps, through the real router, in process.

Data path: tests/data/fr/<scenario>/ (dumps of real gloo jobs) -> the reader
(flightdeck.readers.fr) -> merge, then
either summarize -> diagnose in process (tests/support/dump_data.py, `DumpData`), or the server's
path: ingest API -> SQLite store -> live diagnosis -> `StoreData` (`web_pages.web_data`); both ->
router -> HTML. Every test that reads `data` (or calls `make`) runs on both sources, and the
fragments of both are compared with the same golden files in tests/golden/web/; regenerate them with
`FLIGHTDECK_UPDATE_GOLDEN=1 pytest tests/test_web_render.py` and review the diff.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import httpx
import pytest

from flightdeck.analysis import Options
from flightdeck.nixl_rates import histogram_quantile
from flightdeck.readers.nixl_mp import read_mp_dir
from flightdeck.records import Frame, RankDump
from flightdeck.web import views
from flightdeck.web.data import WebData
from flightdeck.web.routes import CSP, WebSettings
from tests.support.dump_data import replicate_dumps
from tests.support.web_pages import (
    HX,
    REPO,
    XSS,
    Source,
    app_for,
    client_get,
    live_dumps,
    need_dumps,
    web_data,
)

NIXL_MP = REPO / "tests" / "data" / "nixl" / "mp-1.5.1"
GOLDEN = REPO / "tests" / "golden" / "web"
UPDATE = os.environ.get("FLIGHTDECK_UPDATE_GOLDEN") == "1"

#: The committed dumps hold each rank's last periodic snapshot, taken after the waiting ranks died
#: of the gloo timeout; judged at the culprit's last snapshot they would look "lost". The pages
#: are about what a live server showed while the job hung, so: no final snapshots ("live"), the
#: agent's stall threshold (2 s, from the sidecars), and a lost-rank threshold past that gap.
OPTIONS = Options(stall_after_s=2.0, lost_after_intervals=20)
#: hang: rank 2 skips an all_reduce; mismatch: rank 1 calls all_gather where the others
#: all_reduce; healthy: 4 ranks, no fault.
SCENARIOS = {"hang": "skip", "mismatch": "op_order", "healthy": "healthy_4"}

XSS_JOB = "<img src=x onerror=alert(2)>"


def poisoned(dumps: list[RankDump]) -> list[RankDump]:
    """The dumps with a hostile innermost user frame on every entry and stack snapshot."""
    evil = Frame(XSS, "/home/u/<b>train</b>.py", 7)
    out = []
    for d in dumps:
        entries = [replace(e, frames=(evil, *e.frames)) for e in d.entries]
        stacks = tuple(replace(s, frames=(evil, *s.frames)) for s in d.thread_stacks)
        out.append(replace(d, entries=entries, thread_stacks=stacks, host="<i>host</i>"))
    return out


@pytest.fixture(scope="module")
def data(source: Source, tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebData]:
    need_dumps(*SCENARIOS.values())
    nixl = read_mp_dir(NIXL_MP, host="nixl-host", clock=lambda: 1_800_000_000_000_000_000)[0]
    jobs = {n: live_dumps(n, final=kind == "healthy") for kind, n in SCENARIOS.items()}
    with web_data(
        source, jobs, db_dir=tmp_path_factory.mktemp("web"), options=OPTIONS, nixl=[s.to_wire() for s in nixl]
    ) as d:
        yield d


#: `make(jobs)`: the pages' data for other jobs from the same source, judged with OPTIONS.
Make = Callable[[Mapping[str, Sequence[RankDump]]], WebData]


@pytest.fixture
def make(source: Source, tmp_path: Path) -> Iterator[Make]:
    with ExitStack() as stack:
        n = iter(range(1_000))

        def build(jobs: Mapping[str, Sequence[RankDump]]) -> WebData:
            db_dir = tmp_path / f"db{next(n)}"
            return stack.enter_context(web_data(source, jobs, db_dir=db_dir, options=OPTIONS))

        yield build


def normalize(html: str) -> str:
    """Drop what changes when the dumps are regenerated: clock times, dates, pids, repo path."""
    html = html.replace(str(REPO), "$REPO")
    # The committed dumps recorded the checkout path of the machine that generated them.
    html = re.sub(r"/[\w./-]*?/(\.venv/|tests/fr_jobs/|flightdeck/)", r"$REPO/\1", html)
    html = re.sub(r"\d\d:\d\d:\d\d\.\d{3}", "HH:MM:SS.mmm", html)
    html = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "DATE", html)
    html = re.sub(r"pid \d+", "pid N", html)
    html = re.sub(r"\b\d+(\.\d+)? (s|ms)\b", "T", html)
    html = re.sub(r"site-packages/torch/([\w/]+)\.py:\d+", r"site-packages/torch/\1.py:L", html)
    return html


def check_golden(name: str, html: str) -> None:
    path = GOLDEN / name
    got = normalize(html)
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(got)
        if not UPDATE:
            pytest.fail(f"golden file {path} was missing and has been written; review and rerun")
    assert got == path.read_text(), f"{name} differs from its golden file (FLIGHTDECK_UPDATE_GOLDEN=1)"


@pytest.mark.parametrize("kind", sorted(SCENARIOS))
def test_live_fragment_matches_golden(data: WebData, kind: str) -> None:
    r = client_get(app_for(data), f"/jobs/{SCENARIOS[kind]}", HX)
    assert r.status_code == 200
    assert r.text.startswith('<div id="live"')
    check_golden(f"{kind}.live.html", r.text)


def test_walltime_fragment_matches_golden(data: WebData) -> None:
    r = client_get(app_for(data), "/jobs/skip?view=time", HX)
    assert r.status_code == 200
    check_golden("hang.walltime.html", r.text)


def test_walltime_view_shows_who_waits_and_who_never_came(data: WebData) -> None:
    view = client_get(app_for(data), "/jobs/skip?view=time&format=json").json()
    assert view["view"] == "time" and view["axis"]["ticks"][0] == view["axis"]["start"]
    lanes = {tuple(lane["row"]["ranks"]): lane for lane in view["lanes"]}
    assert set(lanes) == {(0, 1, 3), (2,)}
    waiting = {b["seq"]: b for b in lanes[(0, 1, 3)]["bars"]}
    stuck = waiting[12]
    assert stuck["state"] == "in_flight" and stuck["stuck"]
    # Still running at the verdict's "now", which is the right end of the axis.
    assert stuck["x"] + stuck["width"] == pytest.approx(views.TIME_WIDTH)
    assert "running since" in stuck["label"]
    assert all(b["state"] == "completed" and b["x"] <= stuck["x"] for s, b in waiting.items() if s != 12)
    culprit = lanes[(2,)]
    assert 12 not in {b["seq"] for b in culprit["bars"]}
    assert culprit["note"] == "∅ never entered: seq 12"
    # Bars are links to the same cell detail as the grid's cells, and the choice survives paging.
    html = client_get(app_for(data), "/jobs/skip?view=time").text
    assert 'href="/jobs/skip/cell?group=0&amp;seq=12&amp;rank=0"' in html
    assert 'href="/jobs/skip?group=0&amp;start=1&amp;expand=0&amp;view=time"' in html  # fold toggle
    assert 'href="/jobs/skip?group=0&amp;start=1"' in html  # back to the sequence view


def test_jobs_page_puts_hung_jobs_first(data: WebData) -> None:
    newest_first = [j["job"] for j in data.list_jobs()]
    assert newest_first.index("skip") > 0, "the hung job is not the newest: the order shows the sort"
    view = client_get(app_for(data), "/?format=json").json()
    order = [(j["job"], j["status"]) for j in view["jobs"]]
    assert order == [("skip", "hung"), ("op_order", "mismatch"), ("healthy_4", "finished")]
    skip = view["jobs"][0]
    assert skip["hosts"] == "1" and skip["findings"] >= 1 and skip["age"]
    html = client_get(app_for(data), "/").text
    assert "Open findings" in html and "Running for" in html


def test_cell_fragment_matches_golden(data: WebData) -> None:
    r = client_get(
        app_for(data),
        "/jobs/skip/cell?group=0&seq=12&rank=2",
        {"HX-Request": "true", "HX-Target": "cell-detail"},
    )
    assert r.status_code == 200
    check_golden("hang.cell.html", r.text)


def test_fragment_is_the_same_markup_as_in_the_page(data: WebData) -> None:
    app = app_for(data)
    page = client_get(app, "/jobs/skip").text
    fragment = client_get(app, "/jobs/skip", HX).text
    assert fragment.strip() in page
    assert "<html" not in fragment


def test_hang_banner_names_culprit_with_host_and_pid(data: WebData) -> None:
    report = data.job_report("skip")
    assert report is not None
    culprit = report["findings"][0]["culprits"][0]
    html = client_get(app_for(data), "/jobs/skip").text
    banner = html[html.index('id="banner"') : html.index('id="timeline"')]
    assert "Hang in group 0 (default_pg) at seq 12" in banner
    assert f"rank {culprit['rank']}</a> on {culprit['host']} pid {culprit['pid']}" in banner
    assert "Waiting</dt><dd>3 ranks: 0–1, 3" in banner
    # The banner comes before the timeline.
    assert html.index('id="banner"') < html.index('id="timeline"')


def test_mismatch_marks_the_culprit_cell(data: WebData) -> None:
    r = client_get(app_for(data), "/jobs/op_order?format=json")
    view = r.json()
    assert view["banner"]["kind"] == "collective_type_mismatch"
    stuck = [c for c in view["columns"] if c["stuck"]]
    assert [c["seq"] for c in stuck] == [view["banner"]["seq"]]
    states = {tuple(row["ranks"]): [c["state"] for c in row["cells"] if c["stuck"]] for row in view["rows"]}
    assert states[(1,)] == ["mismatched"]


def test_healthy_job_has_no_stuck_column(data: WebData) -> None:
    view = client_get(app_for(data), "/jobs/healthy_4?format=json").json()
    assert view["healthy"] and view["banner"] is None
    assert not any(c["stuck"] for c in view["columns"])
    assert len(view["rows"]) == 1 and view["rows"][0]["ranks"] == [0, 1, 2, 3]


def test_1024_ranks_fold_into_a_handful_of_rows(make: Make) -> None:
    """1,024 ranks made by replicating the real `skip` dumps (rank i copies real rank i % 4)."""
    need_dumps("skip")
    big = make({"big": replicate_dumps(live_dumps("skip"), 1024)})
    app = app_for(big)
    view = client_get(app, "/jobs/big?format=json").json()
    assert view["shown_ranks"] == 1024
    assert len(view["rows"]) <= 4
    html = client_get(app, "/jobs/big", HX).text
    assert html.count('<tr class="fold') == len(view["rows"])
    assert '<tr class="member' not in html
    culprit_row = next(r for r in view["rows"] if r["culprit"])
    assert len(culprit_row["ranks"]) == 256
    expanded = client_get(app, f"/jobs/big?expand={culprit_row['key']}", HX).text
    assert expanded.count('<tr class="member') == 256
    assert 'aria-expanded="true"' in expanded


def test_hostile_strings_render_as_text(make: Make) -> None:
    need_dumps("skip")
    evil = make({XSS_JOB: poisoned(live_dumps("skip"))})
    app = app_for(evil)
    quoted = httpx.URL("/jobs/").join(XSS_JOB.replace(" ", "%20")).raw_path.decode()
    pages = [
        client_get(app, "/").text,
        client_get(app, quoted).text,
        client_get(app, quoted + "/cell?group=0&seq=12&rank=0").text,
        client_get(app, quoted + "/ranks/0").text,
    ]
    for html in pages:
        assert "<script>alert" not in html and "<img src=x" not in html and "<b>train" not in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in pages[0]
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[1]  # waiting ranks' stack, in the banner
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in pages[2]
    assert "/home/u/&lt;b&gt;train&lt;/b&gt;.py:7" in pages[2]
    assert "&lt;i&gt;host&lt;/i&gt;" in pages[3]


def test_security_headers_everywhere(data: WebData) -> None:
    app = app_for(data)
    for url, headers in [
        ("/", None),
        ("/jobs/skip", HX),
        ("/static/htmx.min.js", None),
        ("/jobs/nope", None),
        ("/nixl", None),
    ]:
        r = client_get(app, url, headers)
        assert r.headers["content-security-policy"] == CSP, url
        assert r.headers["x-content-type-options"] == "nosniff", url
    assert client_get(app, "/jobs/nope").status_code == 404
    assert client_get(app, "/static/..%2Fviews.py").status_code == 404


def test_pages_use_no_inline_script_or_style(data: WebData) -> None:
    # The CSP forbids them: one would silently do nothing in the browser.
    app = app_for(data)
    for url in ["/", "/jobs/skip", "/jobs/skip/cell?group=0&seq=12&rank=0", "/jobs/skip/ranks/0", "/nixl"]:
        html = client_get(app, url).text
        assert " style=" not in html and "<style" not in html, url
        assert re.findall(r"<script(?![^>]*\bsrc=)", html) == [], url
        assert " hx-on" not in html and "javascript:" not in html, url


def test_login_when_configured(data: WebData) -> None:
    token = "s3cret-token-0123456789"
    app = app_for(data, WebSettings(token=token, basic_user="ops", basic_password="pw-of-ops"))
    assert client_get(app, "/").status_code == 401
    assert client_get(app, "/", {"Authorization": "Bearer wrong-token-0123456789"}).status_code == 401
    assert client_get(app, "/", {"Authorization": f"Bearer {token}"}).status_code == 200
    basic = base64.b64encode(b"ops:pw-of-ops").decode()
    assert client_get(app, "/static/web.css", {"Authorization": f"Basic {basic}"}).status_code == 200
    r = client_get(app, "/jobs/skip")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Basic")


def test_settings_refuse_weak_token() -> None:
    with pytest.raises(ValueError, match="token"):
        WebSettings(token="short")


def test_rank_page_lists_recent_collectives_and_stacks(data: WebData) -> None:
    html = client_get(app_for(data), "/jobs/skip/ranks/0").text
    assert "Latest stack snapshot" in html and "thread " in html
    assert "reduce_bucket" in html


def test_nixl_page_from_real_store(data: WebData) -> None:
    view = client_get(app_for(data), "/nixl?format=json").json()
    agents = {a["agent"]: a for h in view["hosts"] for a in h["agents"]}
    assert set(agents) == {"initiator", "target"}
    assert agents["initiator"]["errors"] == [["not_found", 1]]
    assert agents["initiator"]["problem"] is True
    assert agents["initiator"]["p50"] != "–" and agents["target"]["p50"] == "–"
    html = client_get(app_for(data), "/nixl").text
    assert "✗ not_found: 1" in html


def test_timeline_pages_around_the_incident() -> None:
    w = views.plan_window(min_seq=1, max_seq=2000, stuck_seq=1000, start=None, size=40)
    assert (w.first, w.last, w.prev_start, w.next_start) == (980, 1019, 940, 1020)
    w = views.plan_window(min_seq=1, max_seq=2000, stuck_seq=None, start=None, size=40)
    assert (w.first, w.last, w.next_start) == (1961, 2000, None)
    w = views.plan_window(min_seq=1, max_seq=12, stuck_seq=12, start=None, size=40)
    assert (w.first, w.last, w.prev_start, w.next_start) == (1, 12, None, None)


def test_rank_ranges() -> None:
    assert views.fmt_ranks([0, 1, 2, 3, 5, 7, 8]) == "0–3, 5, 7–8"
    assert views.parse_ranks("0-3, 7") == frozenset({0, 1, 2, 3, 7})
    assert views.parse_ranks("  ") is None
    with pytest.raises(ValueError):
        views.parse_ranks("5-2")


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    bounds, counts = [10.0, 20.0, 40.0], [0, 10, 10, 0]
    assert histogram_quantile(0.5, bounds, counts) == 20.0
    assert histogram_quantile(0.75, bounds, counts) == 30.0
    assert histogram_quantile(0.5, bounds, [0, 0, 0, 0]) is None
