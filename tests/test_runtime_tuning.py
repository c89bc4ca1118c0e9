"""The interpreter's tuning (flightdeck/runtime_tuning.py): applied while the server app runs,
and given back after it, so that a process running several apps (these tests) keeps its own."""

from __future__ import annotations

import asyncio
import gc
import sys
from pathlib import Path

from prometheus_client import CollectorRegistry

from flightdeck.runtime_tuning import SERVER, Tuning, tuned
from flightdeck.server.app import create_app
from flightdeck.server.settings import ServerSettings


def current() -> tuple[tuple[int, int, int], float]:
    """The GC thresholds and the GIL switch interval now."""
    t0, t1, t2 = gc.get_threshold()
    return (t0, t1, t2), sys.getswitchinterval()


def test_tuned_applies_then_restores_and_nests() -> None:
    before = current()
    tuning = Tuning(gc_threshold=(12_345, 11, 12), switch_interval_s=0.002)
    with tuned(tuning):
        assert current() == ((12_345, 11, 12), 0.002)
        assert gc.get_freeze_count() > 0  # start-up's objects are out of every collection
        with tuned(SERVER):  # a second app in the same process shares the first one's tuning
            assert current() == ((12_345, 11, 12), 0.002)
        assert current() == ((12_345, 11, 12), 0.002)
    assert current() == before
    assert gc.get_freeze_count() == 0


def test_the_server_app_runs_tuned(tmp_path: Path) -> None:
    settings = ServerSettings(database_url=f"sqlite:///{tmp_path}/f.db", migrate=True)
    app = create_app(settings, registry=CollectorRegistry(), start_workers=False)
    before = current()

    async def serve() -> None:
        async with app.router.lifespan_context(app):
            assert current() == (SERVER.gc_threshold, SERVER.switch_interval_s)

    asyncio.run(serve())
    assert current() == before
