"""The pages in a real headless Chromium against a real uvicorn server on 127.0.0.1.

Data: the real `skip` dumps (rank 2 skips an all_reduce, the others hang), the same scaled to
1,024 ranks by replication, and the same with a hostile frame and job name. Screenshots land in
test-artifacts/web/ (gitignored).
"""

from __future__ import annotations

import socket
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import quote

import pytest
import uvicorn
from fastapi import FastAPI
from playwright.sync_api import Browser, Dialog, Page, Request, expect, sync_playwright

from bench.web_render import synthetic_job
from flightdeck.analysis import Options
from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.readers.nixl_mp import read_mp_dir
from flightdeck.records import Frame, RankDump
from flightdeck.web.dump_data import DumpData, replicate_dumps
from flightdeck.web.routes import SecurityHeadersMiddleware, make_router

pytestmark = pytest.mark.slow
# Generous: the CI machine runs several suites on two cores; these are not timing assertions.
expect.set_options(timeout=20_000)


REPO = Path(__file__).resolve().parents[1]
FR = REPO / "tests" / "data" / "fr"
ARTIFACTS = REPO / "test-artifacts" / "web"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]
#: As in test_web_render: judge the hang as a live server saw it (see OPTIONS there).
OPTIONS = Options(stall_after_s=2.0, lost_after_intervals=20)
XSS = "<script>alert(1)</script>"
XSS_JOB = "<img src=x onerror=alert(2)>"


def live_dumps(scenario: str) -> list[RankDump]:
    """Merged dumps per rank, final snapshots left out."""
    by_rank: dict[int, list[RankDump]] = defaultdict(list)
    for p in discover([FR / scenario]):
        if ".final." not in p.name:
            d = read_dump_file(p)
            by_rank[d.rank].append(d)
    return [merge(ds) for _, ds in sorted(by_rank.items())]


def poisoned(dumps: list[RankDump]) -> list[RankDump]:
    """A hostile innermost frame on every entry and stack."""
    evil = Frame(XSS, "/home/u/train.py", 7)
    return [
        replace(
            d,
            entries=[replace(e, frames=(evil, *e.frames)) for e in d.entries],
            thread_stacks=tuple(replace(s, frames=(evil, *s.frames)) for s in d.thread_stacks),
        )
        for d in dumps
    ]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    if not (FR / "skip").is_dir():
        pytest.skip("real dumps not generated yet")
    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium")
    dumps = live_dumps("skip")
    # NIXL: the real samples of the committed prometheus_mp store of a real nixl agent pair.
    nixl = read_mp_dir(FR.parent / "nixl" / "mp-1.5.1", host="nixl-host")[0]
    data = DumpData.from_dumps(
        {
            "skip": dumps,
            "big": replicate_dumps(dumps, 1024),
            # 500 collectives, the last one stuck: the window ends on the stuck column.
            "long": synthetic_job(64, 500),
            XSS_JOB: poisoned(dumps),
            # Three groups: the world, pair 0-1, pair 2-3; rank 3 hangs pair23, then the world.
            "subgroup_hang": live_dumps("subgroup_hang"),
        },
        options=OPTIONS,
        active=["skip", "long"],  # live jobs: the page polls as it would during an incident
        nixl=[s.to_wire() for s in nixl],
    )
    app = FastAPI()
    app.add_middleware(SecurityHeadersMiddleware)
    app.include_router(make_router(data))
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    assert not thread.is_alive(), "uvicorn thread leaked"


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=ARGS)
        yield b
        b.close()


@pytest.fixture()
def page(browser: Browser) -> Iterator[Page]:
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    # A CSP violation (inline script/style, eval in htmx) shows up as a console error.
    pg.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg
    ctx.close()
    assert errors == [], errors


def test_hang_banner_and_stuck_cell(page: Page, base_url: str) -> None:
    pg = page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.goto(f"{base_url}/jobs/skip")
    banner = pg.locator("#banner")
    expect(banner).to_contain_text("Hang in group 0")
    expect(banner.locator(".culprit")).to_contain_text("rank 2 on vm pid")
    pg.screenshot(path=str(ARTIFACTS / "hang-job.png"), full_page=True)
    # The stuck cell of the waiting ranks' row (folded: ranks 0-1, 3) -> its stack, beside the culprit.
    cell = pg.locator("#c-0-12")
    expect(cell).to_have_attribute("aria-label", "ranks 0–1, 3, seq 12 all_reduce: in flight")
    cell.focus()
    pg.keyboard.press("Enter")
    detail = pg.locator("#cell-detail")
    expect(detail).to_contain_text("reduce_bucket")
    expect(detail).to_contain_text("culprit 2")
    expect(detail).to_contain_text("never entered")
    expect(pg.locator("#cell-heading")).to_be_focused()
    pg.screenshot(path=str(ARTIFACTS / "hang-cell.png"), full_page=True)
    # Still polling (the job is active), and the detail survives a refresh of the live block.
    with pg.expect_response(lambda r: "/jobs/skip" in r.url and "cell" not in r.url):
        pass
    expect(detail).to_contain_text("reduce_bucket")


def test_folded_rows_expand_on_click(page: Page, base_url: str) -> None:
    pg = page
    pg.goto(f"{base_url}/jobs/big")
    rows = pg.locator("tr.fold")
    assert rows.count() <= 4
    assert pg.locator("tr.member").count() == 0
    toggle = pg.locator("a.fold-toggle", has_text="×256")
    toggle.click()
    expect(pg.locator("tr.member")).to_have_count(256)
    expect(pg.locator("a.fold-toggle", has_text="×256")).to_have_attribute("aria-expanded", "true")
    assert "expand=" in pg.url
    pg.screenshot(path=str(ARTIFACTS / "fold-1024-expanded.png"))


def test_hostile_frame_is_inert(page: Page, base_url: str) -> None:
    pg = page
    dialogs: list[str] = []

    def on_dialog(d: Dialog) -> None:
        dialogs.append(d.message)
        d.dismiss()

    pg.on("dialog", on_dialog)
    job = quote(XSS_JOB, safe="")
    pg.goto(f"{base_url}/")
    expect(pg.get_by_text(XSS_JOB)).to_be_visible()
    pg.goto(f"{base_url}/jobs/{job}")
    expect(pg.locator("#banner")).to_contain_text(XSS)
    pg.locator("#c-0-12").click()
    expect(pg.locator("#cell-detail")).to_contain_text(XSS)
    pg.screenshot(path=str(ARTIFACTS / "xss-inert.png"), full_page=True)
    assert dialogs == []
    assert pg.locator("script:not([src])").count() == 0


def _is_poll(r: Request) -> bool:
    return r.headers.get("hx-request") == "true"


def _set_visibility(pg: Page, state: str) -> None:
    """Tell the page its tab is hidden or visible, as the browser does when one switches tabs."""
    pg.evaluate(
        """(state) => {
            Object.defineProperty(document, "visibilityState", {configurable: true, get: () => state});
            Object.defineProperty(document, "hidden", {configurable: true, get: () => state === "hidden"});
            document.dispatchEvent(new Event("visibilitychange"));
        }""",
        state,
    )


def test_live_refresh_pauses_while_the_tab_is_hidden(page: Page, base_url: str) -> None:
    pg = page
    polls: list[str] = []
    pg.on("request", lambda r: polls.append(r.url) if _is_poll(r) else None)
    pg.goto(f"{base_url}/")  # the jobs page refreshes itself: one of its jobs is live
    with pg.expect_request(_is_poll, timeout=15_000):
        pass
    _set_visibility(pg, "hidden")
    polls.clear()
    pg.wait_for_timeout(5_000)  # two and a half polling periods
    assert polls == [], "a hidden tab kept polling"
    _set_visibility(pg, "visible")
    with pg.expect_request(_is_poll, timeout=15_000):
        pass


def test_walltime_view_by_keyboard(page: Page, base_url: str) -> None:
    pg = page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.goto(f"{base_url}/jobs/skip")
    pg.get_by_role("link", name="wall time").click()
    expect(pg.locator("#t-0-12")).to_be_attached()
    assert "view=time" in pg.url
    expect(pg.locator(".lane-note")).to_have_text("∅ never entered: seq 12")
    # The stuck bar reaches the right end of the axis: the waiting ranks are still in it.
    lane = pg.locator("tr.fold").first.locator("svg.lane").bounding_box()
    bar = pg.locator("#t-0-12 rect").bounding_box()
    assert lane is not None and bar is not None
    assert abs((bar["x"] + bar["width"]) - (lane["x"] + lane["width"])) < 2
    pg.screenshot(path=str(ARTIFACTS / "hang-walltime.png"), full_page=True)
    pg.locator("#t-0-12").focus()
    pg.keyboard.press("Enter")
    expect(pg.locator("#cell-detail")).to_contain_text("reduce_bucket")
    expect(pg.locator("#cell-heading")).to_be_focused()


def test_nixl_page(page: Page, base_url: str) -> None:
    pg = page
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    pg.goto(f"{base_url}/nixl")
    expect(pg.locator("#agents")).to_contain_text("initiator")
    expect(pg.locator("#agents")).to_contain_text("✗ not_found: 1")
    pg.screenshot(path=str(ARTIFACTS / "nixl.png"), full_page=True)


def test_group_selector_and_rank_filter(page: Page, base_url: str) -> None:
    pg = page
    pg.goto(f"{base_url}/jobs/subgroup_hang")
    expect(pg.locator("#banner h2")).to_contain_text("Hang in group 2 (pair23) at seq 5")
    expect(pg.locator("#timeline h2")).to_contain_text("Group 2")  # the root cause's group first
    pg.locator("select[name=group]").select_option("0")
    pg.get_by_role("button", name="Show").click()
    expect(pg.locator("#timeline h2")).to_contain_text("Group 0 (default_pg)")
    assert "group=0" in pg.url
    expect(pg.locator("#c-0-13")).to_have_attribute("aria-label", "ranks 0–1, seq 13 barrier: in flight")
    ranks = pg.locator("input[name=ranks]")
    ranks.fill("2-3")
    ranks.press("Enter")
    expect(pg.locator("#timeline .summary")).to_contain_text("2 ranks in 1 row (filter: 2-3)")
    expect(pg.locator("#c-0-13")).to_have_count(0)
    expect(pg.locator("#c-2-13")).to_have_attribute("aria-label", "ranks 2–3, seq 13 barrier: never entered")
    assert "ranks=2-3" in pg.url


#: The stuck column's place in the grid's visible area, and the grid's scroll position.
_STUCK_IN_VIEW = """() => {
  const wrap = document.querySelector('.grid-wrap');
  const stuck = wrap.querySelector('th.seq.stuck');
  const who = wrap.querySelector('thead th.who');
  const w = wrap.getBoundingClientRect(), s = stuck.getBoundingClientRect();
  const labels = who.getBoundingClientRect();
  return {left: s.left, right: s.right, viewLeft: Math.max(w.left, labels.right),
          viewRight: Math.min(w.right, window.innerWidth), scroll: wrap.scrollLeft,
          scrollable: wrap.scrollWidth > wrap.clientWidth};
}"""


@pytest.mark.parametrize("width", [1024, 1280, 1400, 1920])
@pytest.mark.parametrize("job", ["skip", "big", "long"])
def test_timeline_opens_with_the_stuck_collective_in_view(
    browser: Browser, base_url: str, job: str, width: int
) -> None:
    """At every width down to a small laptop screen, the stuck column is visible on load, beside
    the rank labels (they stay put while the grid scrolls), and the reader can still scroll."""
    ctx = browser.new_context(viewport={"width": width, "height": 800})
    try:
        pg = ctx.new_page()
        pg.goto(f"{base_url}/jobs/{job}")
        expect(pg.locator("th.seq.stuck")).to_have_count(1)
        box = pg.evaluate(_STUCK_IN_VIEW)
        assert box["viewLeft"] <= box["left"] and box["right"] <= box["viewRight"], box
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(ARTIFACTS / f"stuck-in-view-{job}-{width}.png"))
        if job == "long" and box["scrollable"]:
            # Scrolling stays possible, and the live refresh keeps where the reader scrolled to.
            assert box["scroll"] > 0, box
            pg.evaluate("() => { document.querySelector('.grid-wrap').scrollLeft = 0; }")
            with pg.expect_response(lambda r: "/jobs/long" in r.url and "hx-request" in r.request.headers):
                pass  # the next poll of the live fragment (every 2 s)
            pg.wait_for_function("() => document.querySelector('#live.htmx-settling') === null")
            assert pg.evaluate("() => document.querySelector('.grid-wrap').scrollLeft") == 0
    finally:
        ctx.close()
