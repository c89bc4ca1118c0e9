"""Replicas export once (issue 20): two real server replicas on one PostgreSQL
(FLIGHTDECK_CLUSTER=true) and a real Prometheus scraping both with the shipped configuration;
and a failover to the other replica under the shipped alert path (one page, nothing resolved).
Each job's series come from the replica owning the job, the cluster-wide ones (jobs by status,
collectors, NIXL agents) from the leader, so `sum()` over both replicas equals the figures of a
single server (SQLite) fed the same batches.

The batches are spread over the replicas as a load balancer would: a hung job through one, a
healthy job's ranks half through each, two NIXL agents one through each and a later sample of
the first through the other; one collector token pushes to both.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.ops_stack import (
    ALERTMANAGER_BINARIES,
    PROMETHEUS_BINARIES,
    HangTarget,
    OpsStack,
    find_binary,
)
from tests.support.paging_stack import (
    ServerProcess,
    feed,
    figures_from_prometheus,
    figures_of,
    incident,
    notifications,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        find_binary(PROMETHEUS_BINARIES) is None or find_binary(ALERTMANAGER_BINARIES) is None,
        reason="needs `prometheus` and `prometheus-alertmanager` (Debian packages of the same names)",
    ),
]


def _wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture
def replicas(pg_database: str, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two replicas on one PostgreSQL schema of their own, migrated once before they start."""
    import psycopg

    schema = f"replicas_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env = {
        "FLIGHTDECK_DATABASE_URL": f"{pg_database}?options=-csearch_path%3D{schema}",
        "FLIGHTDECK_CLUSTER": "true",
    }
    first = ServerProcess(tmp_path / "replica-0", env=env, migrate=True)
    second = ServerProcess(tmp_path / "replica-1", env=env, token=first.token)
    servers = [first, second]
    try:
        for srv in servers:
            srv.start()
        yield servers
    finally:
        for srv in servers:
            srv.close()
        with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.timeout(300)
def test_two_replicas_sum_to_one_servers_figures(replicas: list[ServerProcess], tmp_path: Path) -> None:
    single = ServerProcess(tmp_path / "single")
    single.start()
    try:
        now_ns = time.time_ns()
        feed([single], now_ns=now_ns)
        feed(replicas, now_ns=now_ns)
        _wait(lambda: figures_of(single.metrics())["hang active"] == 1, 60, "the single server's hang")
        expected = figures_of(single.metrics())
        assert expected["jobs"] == 2 and expected["collectors"] == 1, expected
        assert (
            expected["NIXL bytes written"] == 3_500_000 and expected["NIXL registered memory"] == 8192 + 2048
        )
        targets = [
            HangTarget(address=s.address, metrics_path="/metrics", trigger_hang=lambda: None)
            for s in replicas
        ]
        with OpsStack(rule_files=[], targets=targets, workdir=tmp_path / "ops", shipped=True) as stack:
            stack.wait_for_targets_up(timeout=90)
            got: dict[str, float] = {}

            def settled() -> bool:
                got.clear()
                got.update(figures_from_prometheus(stack))
                return got == expected

            try:
                _wait(settled, 90, "the replicas' sums to equal one server's")
            except AssertionError:
                raise AssertionError(f"two replicas {got} != one server {expected}") from None
            print(f"\nsummed over two replicas: {got}\none server: {expected}")
            # each replica alone holds only its share: the leader the cluster-wide series
            shares = [figures_of(s.metrics()) for s in replicas]
            assert sorted(s["collectors"] for s in shares) == [0, 1], shares
            assert sorted(s["jobs"] for s in shares) == [0, 2], shares
    finally:
        single.close()


def _exports_hang(server: ServerProcess, job: str) -> bool:
    try:
        return f'flightdeck_job_hang_active{{group="0",job="{job}"}} 1.0' in server.metrics()
    except OSError:
        return False


@pytest.mark.timeout(300)
def test_failover_to_the_other_replica_neither_resolves_nor_refires_the_page(
    replicas: list[ServerProcess], tmp_path: Path
) -> None:
    """A hang pages; the replica owning the job is SIGKILLed; the other takes the job over and
    exports the hang: still one page, nothing resolved (the shipped alert path)."""
    targets = [
        HangTarget(address=s.address, metrics_path="/metrics", trigger_hang=lambda: None) for s in replicas
    ]
    with OpsStack(rule_files=[], targets=targets, workdir=tmp_path / "ops", shipped=True) as stack:
        stack.wait_for_targets_up(timeout=90)
        stack.wait_for_alertmanager_discovered(timeout=90)
        replicas[0].post(incident("hang", "j"))
        stack.webhook.wait_for(lambda d: bool(notifications([d], "j", "firing")), timeout=120)
        owner = _wait(lambda: next((s for s in replicas if _exports_hang(s, "j")), None), 60, "the owner")
        other = next(s for s in replicas if s is not owner)
        owner.kill()
        _wait(lambda: _exports_hang(other, "j"), 120, "the other replica to export the hang")
        rows = stack.query('prometheus_rule_group_iterations_total{rule_group=~".*;flightdeck-page"}')
        start = float(rows[0]["value"][1]) if rows else 0.0
        _wait(
            lambda: any(
                float(r["value"][1]) >= start + 5
                for r in stack.query(
                    'prometheus_rule_group_iterations_total{rule_group=~".*;flightdeck-page"}'
                )
            ),
            120,
            "five more evaluations",
        )
        deliveries = list(stack.webhook.deliveries)
        assert len(notifications(deliveries, "j", "firing")) == 1, deliveries
        assert notifications(deliveries, "j", "resolved") == [], deliveries
