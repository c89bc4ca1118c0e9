"""The web pages in-process: the committed scenarios' merged dumps, an app around the router with the
security headers, one GET through ASGI, the htmx headers of a live-fragment request."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from flightdeck.readers.fr.files import discover, read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import RankDump
from flightdeck.web.dump_data import DumpData
from flightdeck.web.routes import SecurityHeadersMiddleware, WebSettings, make_router

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


def app_for(data: DumpData, settings: WebSettings | None = None) -> FastAPI:
    app = FastAPI()
    app.add_middleware(SecurityHeadersMiddleware)
    app.include_router(make_router(data, settings))
    return app


HX = {"HX-Request": "true", "HX-Target": "live"}
