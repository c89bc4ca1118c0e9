"""Replicas export once (issue 20): two real server replicas on one PostgreSQL
(FLIGHTDECK_SERVER_CLUSTER=true) and a real Prometheus scraping both with the shipped configuration;
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

import pytest

from tests.support.markers import needs_ops_binaries
from tests.support.ops_stack import (
    HangTarget,
    OpsStack,
)
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
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.slow,
    needs_ops_binaries,
]


@pytest.fixture
def replicas(pg_database: str, tmp_path: Path) -> Iterator[list[ServerProcess]]:
    """Two replicas on one PostgreSQL schema of their own, migrated once before they start."""
    import psycopg

    schema = f"replicas_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_database.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    env = {
        "FLIGHTDECK_SERVER_DATABASE_URL": f"{pg_database}?options=-csearch_path%3D{schema}",
        "FLIGHTDECK_SERVER_CLUSTER": "true",
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
        wait_until(
            lambda: figures_of(single.metrics())["hang active"] == 1,
            60,
            "the single server's hang",
            poll_s=0.5,
        )
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
                wait_until(settled, 90, "the replicas' sums to equal one server's", poll_s=0.5)
            except AssertionError:
                raise AssertionError(f"two replicas {got} != one server {expected}") from None
            print(f"\nsummed over two replicas: {got}\none server: {expected}")
            # each replica alone holds only its share: the leader the cluster-wide series
            shares = [figures_of(s.metrics()) for s in replicas]
            assert sorted(s["collectors"] for s in shares) == [0, 1], shares
            assert sorted(s["jobs"] for s in shares) == [0, 2], shares
    finally:
        single.close()


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
        owner = wait_until(
            lambda: next((s for s in replicas if exports_hang(s, "j")), None), 60, "the owner", poll_s=0.5
        )
        other = next(s for s in replicas if s is not owner)
        owner.kill()
        wait_until(lambda: exports_hang(other, "j"), 120, "the other replica to export the hang", poll_s=0.5)
        more_evaluations(stack, 5, 120)
        deliveries = list(stack.webhook.deliveries)
        assert len(notifications(deliveries, "j", "firing")) == 1, deliveries
        assert notifications(deliveries, "j", "resolved") == [], deliveries
