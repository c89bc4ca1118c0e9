"""The server gives back the memory its jobs left by restarting in place once it holds no job
(issue 22: "memory returned when a job ends"; flightdeck/server/idle_restart.py).

A real `flightdeck server` process on SQLite, a real gloo job's final snapshots posted over
HTTP: once the job ended and its series left /metrics, the process executes itself again under
the same process id, every /healthz asked meanwhile is answered (the listening socket stays
open across the exec), the job's history is still served and the new image takes new data. The
threshold and the series' retention are lowered so that it happens within the test (the
shipped defaults are measured by bench/server_memory.py).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from flightdeck.server.idle_restart import MIB, IdleRestart
from tests.support.clock import FakeClock
from tests.support.paging_stack import ServerProcess, healthy_job
from tests.support.server_app import healthy_prefix, make_server
from tests.support.waiting import wait_until


def _job(server: ServerProcess, job: str) -> dict[str, object]:
    with urllib.request.urlopen(f"{server.url}/api/v1/jobs/{job}", timeout=10) as r:
        doc = json.loads(r.read())
    assert isinstance(doc, dict)
    return doc


def test_server_restarts_in_place_once_its_jobs_are_gone(tmp_path: Path) -> None:
    server = ServerProcess(
        tmp_path / "server",
        env={
            "FLIGHTDECK_SERVER_IDLE_RESTART_ABOVE_MIB": "0.001",
            "FLIGHTDECK_SERVER_ENDED_SERIES_S": "1",
        },
    )
    failures: list[str] = []
    answered = [0]
    stop = threading.Event()

    def poll() -> None:
        # What a browser and a collector would see meanwhile: every request answered, none
        # refused: a page's poll, and an idle collector's heartbeat (a batch with no snapshot,
        # which opens no job) through the ingest path.
        while not stop.is_set():
            try:
                with urllib.request.urlopen(f"{server.url}/healthz", timeout=60) as r:
                    if r.status != 200:
                        failures.append(f"status {r.status}")
                server.post([])  # asserts 200
                answered[0] += 1
            except (OSError, AssertionError) as exc:
                failures.append(repr(exc))
            time.sleep(0.05)

    with server:
        server.start()
        pid = server.pid
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        try:
            server.post(healthy_job("restart-a"))
            log = server.data_dir / "server.log"
            wait_until(lambda: "restarted in place" in log.read_text(), 90, "the idle restart")
            n = answered[0]
            wait_until(lambda: answered[0] > n + 2, 60, "the new image to answer /healthz")
        finally:
            stop.set()
            poller.join(90)
        assert server.proc is not None and server.proc.poll() is None and server.pid == pid
        assert failures == [], failures
        assert answered[0] > 0
        said = log.read_text()
        assert said.index("no job held and RSS") < said.index("restarted in place")
        # The store carried everything over: the ended job's history, and new data is taken.
        assert _job(server, "restart-a")["status"] == "finished"
        server.post(healthy_job("restart-b"))
        wait_until(lambda: _job(server, "restart-b")["status"] == "finished", 60, "the second job to end")


@pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)
def test_worker_idle_only_once_every_job_it_held_is_gone(database_url: str, clock: FakeClock) -> None:
    """The worker says it holds no job when the last one's state leaves (its series gone after
    ended_series_s), not while another job is open, not when a job merely ends."""
    with make_server(database_url, clock, ended_series_s=60.0) as srv:
        idle: list[int] = []
        srv.svc.live.on_idle = lambda: idle.append(len(srv.svc.live.jobs))
        stuck, finals, _ = healthy_prefix(5)
        assert srv.push(stuck).status_code == 200  # healthy_4, open: inside its 5th collective
        assert srv.push(healthy_job("other")).status_code == 200  # ends at once
        srv.diagnose()
        assert srv.job("other")["status"] == "finished" and srv.job("healthy_4")["status"] == "hung"
        clock.advance(61)
        srv.diagnose()
        assert "other" not in {js.name for js in srv.svc.live.jobs.values()}
        assert idle == []  # healthy_4 is still open
        assert srv.push(finals).status_code == 200
        srv.diagnose()
        assert srv.job("healthy_4")["status"] == "finished" and idle == []  # ended, series kept
        clock.advance(61)
        srv.diagnose()
        srv.diagnose()
        assert idle == [0]


def test_restart_asked_only_above_the_threshold_and_once() -> None:
    rss = [100 * MIB]
    said: list[str] = []
    stops: list[int] = []
    restart = IdleRestart(above_mib=16, rss=lambda: rss[0], say=said.append)
    restart.idle()  # neither started nor wired to a server yet: nothing to do
    restart.at_rest()
    restart.stop = lambda: stops.append(1)
    rss[0] = 116 * MIB
    restart.idle()
    assert not restart.requested and stops == []
    rss[0] = 117 * MIB
    restart.idle()
    restart.idle()
    assert restart.requested and stops == [1]
    assert said == [
        "no job held and RSS 117 MiB, 17 MiB above its 100 MiB at rest (idle_restart_above_mib 16): "
        "restarting in place to give the memory back"
    ]


def test_restart_off_where_rss_is_unknown() -> None:
    restart = IdleRestart(above_mib=1, rss=lambda: None)
    restart.at_rest()
    restart.stop = lambda: None
    restart.idle()
    assert not restart.requested
