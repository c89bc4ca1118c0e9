"""`flightdeck collector` as a real process: --check, --once, SIGKILL mid-push and restart, SIGTERM."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.collector_fixtures import REPO, thread_guard
from tests.support.collector_harness import stand_ins
from tests.support.collector_recorder import Recorder, wait_for
from tests.support.collector_stack import Server, write_config


@pytest.fixture(autouse=True)
def _no_leaked_threads() -> Iterator[None]:
    yield from thread_guard()


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def collector(cfg: Path, *args: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed when the process is reaped
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), *args],
            env=clean_env(),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    finally:
        if log:
            out.close()  # type: ignore[union-attr]


@pytest.mark.slow
def test_check_prints_what_it_watches_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "spool").mkdir()
    cfg = write_config(tmp_path, "http://127.0.0.1:1", nixl_multiproc_dir=str(tmp_path / "mp"))
    r = subprocess.run(
        [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), "--check"],
        env=clean_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        f"spool  {tmp_path / 'spool'}/<job>/<attempt>/rank_<R>[.recent|.stall|.final].pkl  (exists)"
        in r.stdout
    )
    assert f"nixl mp   {tmp_path / 'mp'}  (missing" in r.stdout
    assert "server:     http://127.0.0.1:1" in r.stdout
    spool = tmp_path / "spool"
    assert (
        f"note: the agents must write to a spool watched here ({spool}): FLIGHTDECK_AGENT_SPOOL_DIR={spool}"
        in r.stdout
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("extra", "message"),
    [({"server_url": "nope"}, "http:// or https://"), ({"bogus_key": 1}, "bogus_key")],
)
def test_check_refuses_bad_config_with_exit_2(tmp_path: Path, extra: dict[str, Any], message: str) -> None:
    cfg = write_config(tmp_path, "http://127.0.0.1:1", **extra)
    r = subprocess.run(
        [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), "--check"],
        env=clean_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 2
    assert message in r.stderr


@pytest.mark.slow
def test_sigkill_mid_push_then_restart_delivers_every_entry_exactly_once(tmp_path: Path) -> None:
    with Recorder() as rec:
        in_flight = threading.Event()
        rec.on_request = in_flight.set
        rec.delay_s = 0.3  # each request stays in flight long enough to be killed during it
        cfg = write_config(tmp_path, rec.url)
        agents = stand_ins(tmp_path / "spool", "healthy_4")
        for a in agents.values():
            a.write()
        log = tmp_path / "collector.log"

        def advance() -> None:
            for a in agents.values():
                a.finish(2)
                a.write()

        first = collector(cfg, log=log)
        try:
            wait_for(lambda: len(rec.requests) >= 1, timeout_s=20, what="first batch")
            advance()
            in_flight.clear()
            wait_for(in_flight.is_set, timeout_s=20, what="a request in flight")
            first.send_signal(signal.SIGKILL)  # while the server holds that request
            assert first.wait(10) == -signal.SIGKILL
        finally:
            if first.poll() is None:
                first.kill()
                first.wait()
        advance()  # the job goes on while the collector is down
        rec.delay_s = 0.05
        second = collector(cfg, log=log)
        try:
            for _ in range(3):
                time.sleep(0.2)
                advance()
            for a in agents.values():  # the job ends: everything finished
                a.finish(10_000)
                a.write()
            want = {(r, e["record_id"]) for r, a in agents.items() for e in a.entries}

            def all_finished_arrived() -> bool:
                return {(row[2], row[3]) for row in rec.entry_rows() if row[5]} == want

            wait_for(all_finished_arrived, timeout_s=30, what="every entry's final state")
            second.send_signal(signal.SIGTERM)
            assert second.wait(15) == 0, log.read_text()
        finally:
            if second.poll() is None:
                second.kill()
                second.wait()

        rows = rec.entry_rows()  # deduplicated by batch_id (the recorder's idempotency)
        assert {(r[2], r[3]) for r in rows} == want  # every entry at least once
        dupes = [k for k, n in collections.Counter(rows).items() if n > 1]
        assert dupes == []  # and each (job, attempt, rank, record_id, state, retired, frames) once
        sent = collections.Counter(bid for bid, _, _ in rec.requests)
        assert any(n > 1 for n in sent.values()), "the batch in flight at the kill was not resent"
        assert all(r[0] == "healthy_4" for r in rows)


@pytest.mark.slow
def test_once_ships_everything_and_exits_0(tmp_path: Path) -> None:
    with Recorder() as rec:
        cfg = write_config(tmp_path, rec.url)
        agents = stand_ins(tmp_path / "spool", "healthy_2")
        for a in agents.values():
            a.write()
        r = subprocess.run(
            [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), "--once"],
            env=clean_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(rec.entry_rows()) == sum(len(a.entries) for a in agents.values())


@pytest.mark.slow
@pytest.mark.parametrize("token", ["wrong", "revoked"])
def test_once_with_a_rejected_token_exits_4_with_the_reason(tmp_path: Path, token: str) -> None:
    """A real server refuses the token (unknown, or revoked): `--once` stops at the first 401
    with one line naming the server's reason and exit code 4, instead of waiting for a token;
    the batches stay queued for a run with a good one."""
    server = Server(tmp_path / "server", tmp_path / "server.log")
    server.start()
    try:
        secret = "fdk_not-a-token-of-this-server-0123456789"
        if token == "revoked":
            secret = server.token("create", "node-k")
            server.token("revoke", "node-k")
        cfg = write_config(tmp_path, server.url, token=secret)
        agents = stand_ins(tmp_path / "spool", "healthy_2")
        for a in agents.values():
            a.write()
        r = subprocess.run(
            [sys.executable, "-m", "flightdeck", "collector", "--config", str(cfg), "--once"],
            env=clean_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
    assert r.returncode == 4, r.stdout + r.stderr
    assert f"flightdeck collector: the server at {server.url} rejected the token (HTTP 401: " in r.stderr
    assert "the batches stay queued" in r.stderr
    assert secret not in r.stderr + r.stdout
