"""Test and bench helper: real `flightdeck server` processes under the shipped alert path, and the
incidents that must page exactly once (issue 20, "one page per incident").

`ServerProcess` is a real server on a fixed 127.0.0.1 port (so Prometheus' static target survives
a restart), with default thresholds, that can be SIGSTOPped, SIGCONTed, stopped and started again
on the same data. `incident(name)` gives the snapshots of real gloo jobs (tests/data/fr) that open
an incident when POSTed: `hang` (scenario `skip` as a live server sees it stuck: one hang, no lost
rank) and `lost_rank` (scenario `sigkill`: the killed rank's snapshots stop, the others' go on;
lost ranks and the hang they cause). `notifications()` counts what reached the paging receiver.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from flightdeck.nixl_records import Histogram, NixlSample
from flightdeck.readers.fr.merge import merge
from flightdeck.wire import Snapshot, snapshot_from_dump
from tests.support import server_process
from tests.support.cli import FLIGHTDECK, clean_env, create_token, flightdeck
from tests.support.ops_stack import (
    PAGE_PATH,
    Delivery,
    OpsStack,
)
from tests.support.server_batches import body, make_batch, scenario_dumps, scenario_snapshots, skip_stuck_view
from tests.support.waiting import wait_until


def incident(name: str, job: str) -> list[Snapshot]:
    """The snapshots that open incident `name` ("hang" or "lost_rank") for `job`."""
    if name == "hang":
        return skip_stuck_view(job)
    if name == "lost_rank":
        return scenario_snapshots("sigkill", job, live=True)
    raise ValueError(f"unknown incident {name!r}")


def healthy_job(job: str) -> list[Snapshot]:
    """The final snapshots of a real healthy 4-rank job (scenario `healthy_4`), rank order."""
    finals = [snapshot_from_dump(merge(ds), job=job) for _, ds in sorted(scenario_dumps("healthy_4").items())]
    return finals


def nixl_sample(
    host: str, agent: str, *, tx_bytes: int, read_time_ns: int, registered: int
) -> dict[str, Any]:
    """One NIXL telemetry sample (wire form) of a running agent."""
    bounds = (10.0, 100.0, 1000.0)
    return NixlSample(
        host=host,
        agent=agent,
        pid=42,
        local_rank=0,
        source="mp",
        read_time_ns=read_time_ns,
        run="run-1",
        format_version=1,
        tx_bytes=tx_bytes,
        rx_bytes=tx_bytes // 2,
        tx_requests=tx_bytes // 1000,
        rx_requests=tx_bytes // 2000,
        memory_registered_bytes=registered,
        memory_deregistered_bytes=0,
        errors=(),
        events_dropped=0,
        xfer_time=Histogram(bounds, (1, 1, 0, 0), 60, 2),
        post_time=Histogram.empty(bounds),
    ).to_wire()


class ServerProcess(server_process.ServerProcess):
    """A real `flightdeck server` on 127.0.0.1:`port` with default thresholds and a collector token.

    `env` adds settings (a PostgreSQL URL and FLIGHTDECK_SERVER_CLUSTER for replicas); without a
    database URL it uses SQLite in `data_dir`. The caller's FLIGHTDECK_* variables are dropped:
    they would change the defaults under test.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        env: dict[str, str] | None = None,
        token: str | None = None,
        migrate: bool = False,
    ) -> None:
        """`token`: use this collector token (a replica on a database another one made it in);
        `migrate`: run `flightdeck migrate` first (replicas: once, before any of them starts)."""
        self.data_dir = data_dir
        data_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(
            clean_env() | {"FLIGHTDECK_SERVER_DATA_DIR": str(data_dir)} | (env or {}), data_dir / "server.log"
        )
        if migrate:
            flightdeck(self.env, "migrate", timeout_s=120)
        self.token = token or create_token(self.env, "paging-test")

    @property
    def cmd(self) -> list[str]:
        """The `flightdeck` command line (add a subcommand; run it with `env`)."""
        return list(FLIGHTDECK)

    @property
    def address(self) -> str:
        """`127.0.0.1:port` for Prometheus."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90.0) -> None:
        """Start the process; return once /healthz answers 200."""
        super().start(timeout_s)

    def post(
        self, snaps: list[Snapshot], *, nixl: list[dict[str, Any]] | None = None, token: str | None = None
    ) -> None:
        """POST one batch holding `snaps` (and NIXL samples) to the ingest API, with `token`
        (default: this server's collector token)."""
        data, headers = body(make_batch(snaps, nixl=nixl))
        req = urllib.request.Request(
            f"{self.url}/api/v1/ingest",
            data=data,
            headers={**headers, "Authorization": f"Bearer {token or self.token}"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.status == 200

    def open_findings(self, job: str) -> list[dict[str, Any]]:
        """The job's open findings (GET /api/v1/jobs/{job}/findings); [] while unreachable."""
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/jobs/{job}/findings", timeout=5) as r:
                doc = json.loads(r.read())
        except OSError:
            return []
        return [row["finding"] for row in doc.get("findings", []) if row["open"]]

    def metrics(self) -> str:
        """The /metrics exposition."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as r:
            return str(r.read().decode())

    def close(self) -> None:
        """Stop the process."""
        self.stop()


def notifications(deliveries: list[Delivery], job: str, status: str) -> list[Delivery]:
    """Notifications to the paging receiver about `job` whose group status is `status` ("firing"
    or "resolved"): one per page the on-call engineer gets."""
    return [
        d
        for d in deliveries
        if d.path == PAGE_PATH
        and d.payload.get("status") == status
        and any(a["labels"].get("job") == job for a in d.payload.get("alerts", []))
    ]


#: The summed figures compared: PromQL over both replicas, and the same over one server's exposition.
SUMS = {
    "jobs": "sum(flightdeck_jobs)",
    "jobs hung": 'sum(flightdeck_jobs{status="hung"})',
    "hang active": "sum(flightdeck_job_hang_active)",
    "culprit ranks": "sum(flightdeck_job_culprit_ranks)",
    "NIXL bytes written": "sum(flightdeck_nixl_tx_bytes_total)",
    "NIXL registered memory": "sum(flightdeck_nixl_memory_registered_bytes)",
    "collectors": "count(flightdeck_collector_last_push_age_seconds)",
}
#: metric (sample name) and label filter of each figure, for one server's exposition.
_SAMPLES: dict[str, tuple[str, dict[str, str], str]] = {
    "jobs": ("flightdeck_jobs", {}, "sum"),
    "jobs hung": ("flightdeck_jobs", {"status": "hung"}, "sum"),
    "hang active": ("flightdeck_job_hang_active", {}, "sum"),
    "culprit ranks": ("flightdeck_job_culprit_ranks", {}, "sum"),
    "NIXL bytes written": ("flightdeck_nixl_tx_bytes_total", {}, "sum"),
    "NIXL registered memory": ("flightdeck_nixl_memory_registered_bytes", {}, "sum"),
    "collectors": ("flightdeck_collector_last_push_age_seconds", {}, "count"),
}


def figures_of(exposition: str) -> dict[str, float]:
    """The `SUMS` figures computed from one server's /metrics text."""
    samples = [s for fam in text_string_to_metric_families(exposition) for s in fam.samples]
    out = {}
    for key, (name, labels, how) in _SAMPLES.items():
        values = [
            s.value
            for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        out[key] = float(len(values)) if how == "count" else float(sum(values))
    return out


def figures_from_prometheus(stack: OpsStack) -> dict[str, float]:
    """The `SUMS` figures as Prometheus computes them over every scraped replica."""
    out = {}
    for key, expr in SUMS.items():
        rows = stack.query(expr)
        out[key] = float(rows[0]["value"][1]) if rows else 0.0
    return out


def feed(servers: list[ServerProcess], *, now_ns: int) -> None:
    """The same batches, spread over `servers` (one server gets them all)."""
    a, b = servers[0], servers[-1]
    a.post(incident("hang", "hung-job"))
    finals = healthy_job("healthy-job")
    a.post(finals[:2])
    b.post(finals[2:])
    a.post(
        [], nixl=[nixl_sample("node-1", "agent-a", tx_bytes=1_000_000, read_time_ns=now_ns, registered=4096)]
    )
    b.post(
        [], nixl=[nixl_sample("node-2", "agent-b", tx_bytes=500_000, read_time_ns=now_ns, registered=2048)]
    )
    # a later sample of agent-a through the other replica (the balancer moved its collector)
    b.post(
        [],
        nixl=[
            nixl_sample("node-1", "agent-a", tx_bytes=3_000_000, read_time_ns=now_ns + 10**9, registered=8192)
        ],
    )


def rule_evaluations(stack: OpsStack) -> float:
    """How many times Prometheus has evaluated the paging rule group."""
    rows = stack.query('prometheus_rule_group_iterations_total{rule_group=~".*;flightdeck-page"}')
    return float(rows[0]["value"][1]) if rows else 0.0


def more_evaluations(stack: OpsStack, n: int, timeout_s: float) -> None:
    """Wait until the paging rules have been evaluated `n` more times (what could page again has had
    its chance)."""
    start = rule_evaluations(stack)
    wait_until(
        lambda: rule_evaluations(stack) >= start + n, timeout_s, f"{n} more evaluations of the paging rules"
    )


def exports_hang(server: ServerProcess, job: str) -> bool:
    """Whether `server`'s /metrics shows `job`'s hang in group 0 (False while it does not answer)."""
    try:
        return f'flightdeck_job_hang_active{{group="0",job="{job}"}} 1.0' in server.metrics()
    except OSError:
        return False
