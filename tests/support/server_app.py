"""The server in-process for the tests: a FastAPI test client on a real database (SQLite or
PostgreSQL) with the test token, workers off (`start_workers=False`) and a fake clock, the diagnosis
stepped by hand, so every test is deterministic; batches built from the committed dumps of real gloo
jobs (tests/data/fr/); a real `flightdeck server` process for the tests that need one."""

from __future__ import annotations

import os
import subprocess
import warnings
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from flightdeck.nixl_records import Histogram, NixlSample
from flightdeck.readers.fr.merge import merge
from flightdeck.server import store
from flightdeck.server.app import create_app
from flightdeck.server.ingest import hash_token
from flightdeck.server.services import Services
from flightdeck.server.settings import ServerSettings
from flightdeck.wire import Snapshot, snapshot_from_dump
from tests.support.clock import FakeClock
from tests.support.server_batches import body, make_batch, scenario_dumps
from tests.support.server_process import ServerProcess

with warnings.catch_warnings():
    # starlette warns at import that it prefers httpx2; the TestClient itself works unchanged.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


NS = 1_000_000_000
TOKEN = "fdk_test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
STALL_S = 2.0


class Server:
    """One in-process server: its test client, services and clock."""

    def __init__(self, client: TestClient, clock: FakeClock) -> None:
        self.client = client
        self.clock = clock
        services: Services = client.app.state.services  # type: ignore[attr-defined]
        self.svc = services

    def push(
        self,
        snaps: list[Snapshot],
        *,
        batch_id: str | None = None,
        headers: dict[str, str] | None = None,
        **kw: Any,
    ) -> httpx.Response:
        """POST a batch of these snapshots with the test token, sent now by the server's clock
        (unless `sent_at_ns` says otherwise: a late batch)."""
        kw.setdefault("sent_at_ns", self.clock.now_ns)
        data, base = body(make_batch(snaps, batch_id=batch_id, **kw))
        resp: httpx.Response = self.client.post(
            "/api/v1/ingest", content=data, headers={**base, **AUTH, **(headers or {})}
        )
        return resp

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.svc.close()

    def diagnose(self) -> None:
        """Fold everything in and diagnose every job now."""
        self.svc.live.step(force=True)

    def counts(self) -> dict[str, int]:
        """Row counts of the data tables."""
        with self.svc.db.read() as session:
            return store.table_counts(session=session)

    def job(self, name: str) -> dict[str, Any]:
        """GET /api/v1/jobs/{name} (asserting 200)."""
        r = self.client.get(f"/api/v1/jobs/{name}")
        assert r.status_code == 200, r.text
        doc: dict[str, Any] = r.json()
        return doc


def make_server(url: str, clock: FakeClock, **overrides: Any) -> Server:
    """An app on `url` with a collector token, workers off, a fresh registry."""
    # Tests feed whole pictures of old dumps at once: judged as they come, unless a test asks.
    settings = ServerSettings(
        database_url=url, **{"stall_after_s": STALL_S, "migrate": True, "job_settle_s": 0.0, **overrides}
    )
    app = create_app(settings, clock=clock, registry=CollectorRegistry(), start_workers=False)
    services: Services = app.state.services
    with services.db.write() as session, session.begin():
        if store.active_token(session=session, token_hash=hash_token(TOKEN)) is None:
            store.create_token(
                session=session, name="test-collector", token_hash=hash_token(TOKEN), now_ns=clock()
            )
    return Server(TestClient(app), clock)


def healthy_prefix(k: int) -> tuple[list[Snapshot], list[Snapshot], int]:
    """healthy_4 cut at its k-th default-group collective: ranks 0-2 inside it (unfinished),
    rank 3 not there yet. Returns (stuck snapshots, the real final snapshots, stuck seq's time)."""
    dumps = {r: merge(ds) for r, ds in scenario_dumps("healthy_4").items()}
    stuck: list[Snapshot] = []
    t_k = 0
    for r, d in sorted(dumps.items()):
        cut = next(i for i, e in enumerate(d.entries) if e.group == "0" and e.collective_seq_id == k)
        entries = list(d.entries[: cut + 1] if r != 3 else d.entries[:cut])
        if r != 3:
            e = entries[-1]
            entries[-1] = replace(
                e, state="scheduled", retired=False, time_completed_ns=None, duration_ms=None
            )
            t_k = max(t_k, e.time_created_ns)
        stuck.append(snapshot_from_dump(replace(d, kind="periodic", entries=entries, snapshot_time_ns=0)))
    for s in stuck:
        s.snapshot_time_ns = t_k + NS // 2
    finals = [snapshot_from_dump(d) for d in dumps.values()]
    return stuck, finals, t_k


def start_server_process(env: Mapping[str, str], log: Any) -> tuple[subprocess.Popen[bytes], str]:
    """A real `flightdeck server` process on a free port, with quick diagnosis settings and `env`
    on top of ours, its output to the open file `log`; returns (process, base URL) once /healthz
    answers."""
    full = {
        **os.environ,
        "FLIGHTDECK_SERVER_STALL_AFTER_S": str(STALL_S),
        "FLIGHTDECK_SERVER_DIAGNOSIS_DEBOUNCE_S": "0.1",
        "FLIGHTDECK_SERVER_DIAGNOSIS_INTERVAL_S": "0.3",
        **env,
    }
    server = ServerProcess(full, log, "--log-level", "warning")
    server.start()
    assert server.proc is not None
    return server.proc, server.url


def nixl_wire_sample(run: str, tx: int) -> dict[str, Any]:
    bounds = (10.0, 100.0, 1000.0)
    return NixlSample(
        host="node-1",
        agent="agent-a",
        pid=42,
        local_rank=0,
        source="mp",
        read_time_ns=1,
        run=run,
        format_version=1,
        tx_bytes=tx,
        rx_bytes=10,
        tx_requests=2,
        rx_requests=1,
        memory_registered_bytes=4096,
        memory_deregistered_bytes=1024,
        errors=(("backend", 1),),
        events_dropped=0,
        xfer_time=Histogram(bounds, (1, 1, 0, 0), 60, 2),
        post_time=Histogram.empty(bounds),
    ).to_wire()
