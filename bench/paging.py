"""Pages per incident, and summed series with two replicas vs one (issue 20), with the SHIPPED
alert path.

    python bench/paging.py [--scenarios stall,restart,lost_rank,failover,replicas] [--stall-s 60]

Prometheus and Alertmanager run the shipped files (dashboards/prometheus/prometheus.yml, the
shipped rule file, dashboards/alertmanager/alertmanager.yml) rendered by `tests/support/ops_stack.py`
(`render_shipped`): only the scrape targets, the Alertmanager address and the receivers' host:port
change. Real `flightdeck server` processes with default settings; the incidents are POSTed
snapshots of real gloo jobs (tests/support/paging_stack.py). A page is a notification of the paging
receiver (`/flightdeck/critical`) about the incident's job: `firing` ones are pages, `resolved`
ones mean the incident was closed (then a later firing one is a second page).

- stall: a hang opens and pages; the server is SIGSTOPped `--stall-s`, SIGCONTed; counted until
  ten more evaluations of the paging rules after its first successful scrape again.
- restart: the same, the server stopped (SIGTERM) and started again on the same SQLite file.
- lost_rank: a job whose rank was SIGKILLed (lost ranks and the hang they cause); counted for
  70 s after the first page (past the critical route's 1 m group_interval).
- failover: two replicas on PostgreSQL (FLIGHTDECK_SERVER_CLUSTER=true), Prometheus scraping both; the
  replica owning the hung job is SIGKILLed; counted until ten evaluations after the other one
  exports the hang.
- replicas: the summed figures of tests/test_replica_export.py (two replicas, one Prometheus)
  against one server's /metrics fed the same batches.
Target: exactly 1 page and 0 resolved per incident; summed series equal.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from tests.support.ops_stack import HangTarget, OpsStack
from tests.support.paging_stack import (
    ServerProcess,
    exports_hang,
    feed,
    figures_from_prometheus,
    figures_of,
    incident,
    more_evaluations,
    notifications,
)
from tests.support.postgres import PG_ADMIN_URL
from tests.support.waiting import wait_until

SCENARIOS = ("stall", "restart", "lost_rank", "failover", "replicas")


def _stack(servers: list[ServerProcess], work: Path) -> OpsStack:
    targets = [
        HangTarget(address=s.address, metrics_path="/metrics", trigger_hang=lambda: None) for s in servers
    ]
    return OpsStack(rule_files=[], targets=targets, workdir=work / "ops", shipped=True)


def _page(stack: OpsStack, server: ServerProcess, name: str, job: str) -> float:
    """POST the incident; return the monotonic arrival time of its first page."""
    stack.wait_for_targets_up(timeout=120)
    stack.wait_for_alertmanager_discovered(timeout=120)
    server.post(incident(name, job))
    page = stack.webhook.wait_for(lambda d: bool(notifications([d], job, "firing")), timeout=180)
    return page.received_at


def _count(stack: OpsStack, job: str) -> dict[str, Any]:
    deliveries = list(stack.webhook.deliveries)
    firing = notifications(deliveries, job, "firing")
    return {
        "pages": len(firing),
        "resolved": len(notifications(deliveries, job, "resolved")),
        "server-down pages": len(notifications(deliveries, "flightdeck", "firing")),
        "alerts in the page": sorted({a["labels"]["alertname"] for d in firing for a in d.alerts("firing")}),
    }


def run_stall(work: Path, stall_s: float) -> dict[str, Any]:
    server = ServerProcess(work / "data")
    server.start()
    try:
        with _stack([server], work) as stack:
            _page(stack, server, "hang", "j")
            server.pause()
            time.sleep(stall_s)
            server.resume()
            wait_until(lambda: stack.query('up{job="flightdeck"} == 1'), 60, "a scrape again")
            more_evaluations(stack, 10, 180)
            return _count(stack, "j")
    finally:
        server.close()


def run_restart(work: Path) -> dict[str, Any]:
    server = ServerProcess(work / "data")
    server.start()
    try:
        with _stack([server], work) as stack:
            _page(stack, server, "hang", "j")
            down = time.monotonic()
            server.stop()
            server.start()
            out = {"restart (s)": round(time.monotonic() - down, 1)}
            wait_until(lambda: stack.query('up{job="flightdeck"} == 1'), 60, "a scrape again")
            more_evaluations(stack, 10, 180)
            return out | _count(stack, "j")
    finally:
        server.close()


def run_lost_rank(work: Path) -> dict[str, Any]:
    server = ServerProcess(work / "data")
    server.start()
    try:
        with _stack([server], work) as stack:
            first = _page(stack, server, "lost_rank", "k")
            wait_until(lambda: time.monotonic() - first > 70, 90, "a group_interval")
            out = {"findings open": sorted({f["kind"] for f in server.open_findings("k")})}
            return out | _count(stack, "k")
    finally:
        server.close()


def _pg_schema() -> tuple[str, str]:
    """A fresh schema in the test database: (SQLAlchemy URL using it, schema name)."""
    import psycopg

    schema = f"bench_paging_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    url = PG_ADMIN_URL.replace("postgresql://", "postgresql+psycopg://", 1)
    return f"{url}?options=-csearch_path%3D{schema}", schema


def _drop(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _replicas(work: Path, url: str) -> list[ServerProcess]:
    env = {"FLIGHTDECK_SERVER_DATABASE_URL": url, "FLIGHTDECK_SERVER_CLUSTER": "true"}
    first = ServerProcess(work / "replica-0", env=env, migrate=True)
    servers = [first, ServerProcess(work / "replica-1", env=env, token=first.token)]
    for s in servers:
        s.start()
    return servers


def run_failover(work: Path) -> dict[str, Any]:
    url, schema = _pg_schema()
    servers = _replicas(work, url)
    try:
        with _stack(servers, work) as stack:
            _page(stack, servers[0], "hang", "j")
            owner = wait_until(
                lambda: next((s for s in servers if exports_hang(s, "j")), None), 60, "the owner"
            )
            other = next(s for s in servers if s is not owner)
            killed = time.monotonic()
            owner.kill()
            wait_until(lambda: exports_hang(other, "j"), 120, "the other replica to export the hang")
            out = {"takeover (s)": round(time.monotonic() - killed, 1)}
            more_evaluations(stack, 10, 180)
            return out | _count(stack, "j")
    finally:
        for s in servers:
            s.close()
        _drop(schema)


def run_replicas(work: Path) -> dict[str, Any]:
    url, schema = _pg_schema()
    servers = _replicas(work, url)
    single = ServerProcess(work / "single")
    single.start()
    try:
        now_ns = time.time_ns()
        feed([single], now_ns=now_ns)
        feed(servers, now_ns=now_ns)
        wait_until(lambda: figures_of(single.metrics())["hang active"] == 1, 60, "the single server's hang")
        one = figures_of(single.metrics())
        with _stack(servers, work) as stack:
            stack.wait_for_targets_up(timeout=120)
            got: dict[str, float] = {}

            def settled() -> bool:
                got.clear()
                got.update(figures_from_prometheus(stack))
                return got == one

            with contextlib.suppress(RuntimeError):  # unequal after 90 s: print what it is
                wait_until(settled, 90, "equal sums")
            return {"two replicas": dict(got), "one server": one, "equal": got == one}
    finally:
        single.close()
        for s in servers:
            s.close()
        _drop(schema)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help=f"comma-separated: {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--stall-s", type=float, default=60.0, help="how long the server is SIGSTOPped (60 s)"
    )
    args = parser.parse_args()
    chosen = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios: {sorted(unknown)}")
    results: dict[str, dict[str, Any]] = {}
    for name in chosen:
        with tempfile.TemporaryDirectory(prefix=f"fd-paging-{name}-") as tmp:
            work = Path(tmp)
            started = time.monotonic()
            if name == "stall":
                results[name] = run_stall(work, args.stall_s)
            elif name == "restart":
                results[name] = run_restart(work)
            elif name == "lost_rank":
                results[name] = run_lost_rank(work)
            elif name == "failover":
                results[name] = run_failover(work)
            else:
                results[name] = run_replicas(work)
            print(f"{name}: {results[name]} ({time.monotonic() - started:.0f} s)", flush=True)
    print("\n| scenario | pages | resolved | details |\n|---|---|---|---|")
    for name, r in results.items():
        if name == "replicas":
            continue
        rest = {k: v for k, v in r.items() if k not in ("pages", "resolved")}
        print(f"| {name} | {r['pages']} | {r['resolved']} | {rest} |")
    if "replicas" in results:
        r = results["replicas"]
        print("\n| figure | two replicas (sum) | one server |\n|---|---|---|")
        for key, v in r["one server"].items():
            print(f"| {key} | {r['two replicas'].get(key)} | {v} |")
    ok = all(r.get("pages") == 1 and r.get("resolved") == 0 for n, r in results.items() if n != "replicas")
    ok = ok and results.get("replicas", {"equal": True})["equal"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
