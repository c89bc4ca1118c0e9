"""The web pages in-process: the committed scenarios' merged dumps, the pages' data from them by
either source (`web_data`: analysed in process, or through the server's ingest, store and live
diagnosis), an app around the router with the security headers, one GET through ASGI, the htmx
headers of a live-fragment request."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import fields
from pathlib import Path
from typing import Any, Literal

import httpx
import pytest
from fastapi import FastAPI

from flightdeck.analysis import Options
from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import RankDump
from flightdeck.server.page_data import StoreData
from flightdeck.web.data import WebData
from flightdeck.web.routes import SecurityHeadersMiddleware, WebSettings, make_router
from flightdeck.wire import snapshot_from_dump
from tests.support.clock import FakeClock
from tests.support.dump_data import DumpData
from tests.support.server_app import make_server

REPO = Path(__file__).resolve().parents[2]
FR = REPO / "tests" / "data" / "fr"
XSS = "<script>alert(1)</script>"


def need_dumps(*names: str) -> None:
    missing = [n for n in names if not (FR / n).is_dir()]
    if missing:
        pytest.skip(f"real dumps not generated yet: {missing}")


def live_dumps(scenario: str, *, final: bool = False) -> list[RankDump]:
    """A scenario's merged dumps per rank, without final snapshots unless `final` (see OPTIONS).

    A healthy job is read with its final snapshots: its periodic ones were taken at slightly
    different moments, and the final ones show every rank done.
    """
    by_rank: dict[int, list[RankDump]] = defaultdict(list)
    for p in discover([FR / scenario]):
        if final or ".final." not in p.name:
            d = read_dump_file(p)
            by_rank[d.rank].append(d)
    return [merge(ds) for _, ds in sorted(by_rank.items())]


def client_get(app: FastAPI, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    """One GET through the ASGI app (no socket)."""

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
            return await c.get(url, headers=headers)

    return asyncio.run(go())


#: Where the pages' data comes from (`web_data`).
Source = Literal["dumps", "store"]
SOURCES: tuple[Source, ...] = ("dumps", "store")

#: The diagnosis options the server has settings for; `web_data` refuses others for "store".
_SERVER_OPTIONS = {"stall_after_s", "lost_after_intervals", "slow_ceiling_s"}
#: "store" with `live=False`: how long a job stays live, and so re-diagnosed, after its last data.
_IDLE_S = 5.0


@contextmanager
def web_data(
    source: Source,
    jobs: Mapping[str, Sequence[RankDump]],
    *,
    db_dir: Path,
    options: Options | None = None,
    nixl: Sequence[Mapping[str, Any]] = (),
    live: bool = False,
) -> Iterator[WebData]:
    """The pages' data for `jobs` (merged dumps, one per rank), judged with `options`.

    "dumps": `DumpData`, each job diagnosed at its newest snapshot. "store": the production path,
    `StoreData` over an in-process server on SQLite in `db_dir`: each job's dumps POSTed to the
    ingest API as its own collector would send them (one snapshot per rank), the server's clock
    at the job's newest snapshot, and diagnosed by the live diagnosis then, job after job in the
    order of their times. `live`: every job is shown live (for "store" the clock stays at the
    newest job's time, so the earlier ones were diagnosed again at the later jobs' times). Else
    none is: for "store" a job goes idle `_IDLE_S` after its data, so each verdict stays the one
    of its own time, as with "dumps", and the pages are read once every job is idle.
    """
    opts = options or Options()
    if source == "dumps":
        yield DumpData.from_dumps(jobs, options=opts, nixl=nixl, active=jobs if live else ())
        return
    default = Options()
    changed = {f.name for f in fields(Options) if getattr(opts, f.name) != getattr(default, f.name)}
    if changed - _SERVER_OPTIONS:
        raise ValueError(f"the server has no settings for {sorted(changed - _SERVER_OPTIONS)}")
    clock = FakeClock(0)
    overrides: dict[str, Any] = {k: getattr(opts, k) for k in _SERVER_OPTIONS}
    if not live:
        overrides["job_idle_s"] = _IDLE_S
    db_dir.mkdir(parents=True, exist_ok=True)
    server = make_server(f"sqlite:///{db_dir}/flightdeck.db", clock, **overrides)
    try:
        for name in sorted(jobs, key=lambda n: max(d.snapshot_time_ns or 0 for d in jobs[n])):
            clock.now_ns = max(d.snapshot_time_ns or 0 for d in jobs[name])
            snaps = [snapshot_from_dump(d, job=name) for d in jobs[name]]
            r = server.push(snaps, collector_host=f"collector-{name}")
            assert r.status_code == 200, r.text
            server.diagnose()
        if nixl:
            r = server.push([], nixl=[dict(a) for a in nixl], collector_host="collector-nixl")
            assert r.status_code == 200, r.text
        if not live:
            clock.advance(2 * _IDLE_S)
        yield StoreData(
            db=server.svc.db, live=server.svc.live, clock=clock, job_idle_s=server.svc.settings.job_idle_s
        )
    finally:
        server.svc.close()


def app_for(data: WebData, settings: WebSettings | None = None) -> FastAPI:
    app = FastAPI()
    app.add_middleware(SecurityHeadersMiddleware)
    app.include_router(make_router(data, settings))
    return app


HX = {"HX-Request": "true", "HX-Target": "live"}
