"""The in-process collector of the tests: settings in a temporary directory, a harness that owns its
client and registry, agent stand-ins per rank of a committed scenario."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from flightdeck.collector.daemon import Collector
from flightdeck.collector.settings import CollectorSettings
from tests.support.collector_fixtures import FR_DATA, AgentStandIn


def settings_for(tmp_path: Path, url: str, **overrides: Any) -> CollectorSettings:
    """Settings with every path in tmp_path and short intervals."""
    values: dict[str, Any] = {
        "server_url": url,
        "token": "s3cret",
        "spool_dirs": [tmp_path / "spool"],
        "torch_dump_prefixes": [str(tmp_path / "torch" / "comm_lib_trace_rank_")],
        "state_dir": tmp_path / "state",
        "metrics_listen": "",
        "host": "node-a",
        "push_interval_s": 0.05,
        "rescan_interval_s": 0.001,  # flush() in tests: every call rescans (no watcher running)
        "push_deadline_s": 5.0,
        "retry_backoff_s": 0.05,
        "retry_backoff_max_s": 0.2,
    }
    values.update(overrides)
    return CollectorSettings(**values)


class Harness:
    """A Collector with its own httpx client and registry; `close` releases everything."""

    def __init__(self, settings: CollectorSettings, **kwargs: Any) -> None:
        self.client = httpx.Client()
        self.registry = CollectorRegistry()
        self.collector = Collector(settings, client=self.client, registry=self.registry, **kwargs)

    def flush_and_push(self) -> None:
        self.collector.flush()
        assert self.collector.pusher.drain(timeout_s=10)

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def close(self) -> None:
        self.collector.close(drain_s=0)
        self.client.close()


def stand_ins(spool: Path, scenario: str) -> dict[int, AgentStandIn]:
    """One agent stand-in per rank of a committed scenario, writing into `<spool>/<scenario>/0/`."""
    dest = spool / scenario / "0"
    dest.mkdir(parents=True, exist_ok=True)
    return {
        int(p.name.split(".")[0].removeprefix("rank_")): AgentStandIn(p, dest / p.name)
        for p in sorted((FR_DATA / scenario).glob("rank_*.pkl"))
        if p.name.count(".") == 1
    }
