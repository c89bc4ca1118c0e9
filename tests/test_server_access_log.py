"""The real `flightdeck server` at its default log level (info) writes no line per request: a
16,384-rank job on digests sends 1,024 requests a second. The access log is there when asked for
(`FLIGHTDECK_SERVER_ACCESS_LOG=true`)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.support.server_process import ServerProcess


@pytest.mark.parametrize("access_log", [None, "true"])
def test_requests_are_logged_only_when_asked(tmp_path: Path, access_log: str | None) -> None:
    env = {**os.environ, "FLIGHTDECK_SERVER_DATABASE_URL": f"sqlite:///{tmp_path}/flightdeck.db"}
    if access_log is not None:
        env["FLIGHTDECK_SERVER_ACCESS_LOG"] = access_log
    log = tmp_path / "server.log"
    with ServerProcess(env, log) as server:
        server.start()
        r = httpx.post(f"{server.url}/api/v1/digest", content=b"{}", timeout=10)
        assert r.status_code == 401  # no token: refused, and counted
        health = httpx.get(f"{server.url}/healthz", timeout=10)
        assert health.status_code == 200
    said = log.read_text()
    assert "Uvicorn running" in said or "Application startup complete" in said  # the info level is on
    logged = [line for line in said.splitlines() if '"POST /api/v1/digest HTTP/1.1" 401' in line]
    assert len(logged) == (1 if access_log else 0), said
