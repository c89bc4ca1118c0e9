"""Real processes for the collector tests: a `flightdeck server` on SQLite, a `flightdeck collector`
with its TOML, rank feeders copying committed dumps into a spool, and what the server should hold."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from flightdeck.launch.demo.ranks import free_port
from flightdeck.readers.fr.decode import load_raw
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.fr.merge import merge
from tests.support.cli import FLIGHTDECK, clean_env, flightdeck
from tests.support.collector_fixtures import (
    FR_DATA,
    write_atomic,
)
from tests.support.server_process import ServerProcess
from tests.support.waiting import wait_until

SCENARIO = "skip"
JOB = "skip"


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    """GET a JSON document."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


class Server(ServerProcess):
    """A `flightdeck server` process on 127.0.0.1 with its SQLite database in `data_dir`."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **clean_env(),
            "FLIGHTDECK_SERVER_DATA_DIR": str(data_dir),
            "FLIGHTDECK_SERVER_STALL_AFTER_S": "5",
        }
        super().__init__(env, log, "--log-level", "warning")

    def token(self, action: str, name: str, *scope: str) -> str:
        """`flightdeck token <action> <name> [scope...]` on the server's database; its output.
        Created tokens are unscoped unless a scope is given: the committed dumps name the host they
        were recorded on ("vm"), the collector calls itself "testhost"."""
        scope = scope or (("--any-host",) if action == "create" else ())
        return flightdeck(self.env, "token", action, name, *scope)

    def timeline(self) -> list[dict[str, Any]]:
        """Every stored entry of the job (the JSON API), or [] before the job exists."""
        try:
            doc = get_json(f"{self.url}/api/v1/jobs/{JOB}/timeline?limit=10000")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise
        entries: list[dict[str, Any]] = doc["entries"]
        return entries

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the server's /metrics (0 when absent)."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=5) as r:
            return sample(r.read().decode(), name, labels)


def sample(text: str, name: str, labels: dict[str, str]) -> float:
    """The value of series `name{labels}` in a Prometheus text exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


class Collector:
    """`flightdeck collector --config <toml>` as a subprocess, with its own /metrics port."""

    def __init__(
        self,
        tmp: Path,
        server_url: str,
        token_file: Path,
        spool: Path,
        nixl: Path | None,
        host: str = "testhost",
    ) -> None:
        self.metrics_port = free_port()
        self.log = tmp / "collector.log"
        self.config = tmp / "collector.toml"
        lines = [
            f'server_url = "{server_url}"',
            f'token_file = "{token_file}"',
            f'spool_dirs = ["{spool}"]',
            "torch_dump_prefixes = []",
            f'state_dir = "{tmp / "collector-state"}"',
            f'metrics_listen = "127.0.0.1:{self.metrics_port}"',
            f'host = "{host}"',
            "push_interval_s = 0.2",
            "rescan_interval_s = 1.0",
            "push_deadline_s = 3.0",
            "retry_backoff_s = 0.1",
            "retry_backoff_max_s = 0.5",
            # Long enough that a request to a paused server is still waiting when the test kills us.
            "request_timeout_s = 20.0",
            "auth_retry_max_s = 1.0",
            "shutdown_grace_s = 5.0",
        ]
        if nixl is not None:
            lines.append(f'nixl_telemetry_dir = "{nixl}"')
        self.config.write_text("\n".join(lines) + "\n")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait for its /metrics."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*FLIGHTDECK, "collector", "--config", str(self.config), "--log-level", "INFO"],
                env=self.env,
                stdout=out,
                stderr=out,
            )
        wait_until(lambda: self._scrape() is not None, 60, "the collector's /metrics")

    def _scrape(self) -> str | None:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"collector exited with {self.proc.returncode}: {self.log.read_text()[-3000:]}"
            )
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                return str(r.read().decode())
        except OSError:
            return None

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the collector's /metrics."""
        text = self._scrape()
        assert text is not None, "collector /metrics did not answer"
        return sample(text, name, labels)

    def kill(self) -> None:
        """SIGKILL: no final flush, no drain, the queue as it is on disk."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
        self.proc = None

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code (None when it was not running)."""
        if self.proc is None:
            return None
        self.proc.terminate()
        try:
            code = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait(10)
        self.proc = None
        return code


class RankFeeder:
    """Writes one rank's snapshots into the spool as the agent would: earlier rings built from the
    committed periodic dump (fewer entries, the newest not finished), then the committed files."""

    def __init__(self, rank: int, dest: Path) -> None:
        self.rank = rank
        self.dest = dest
        src = FR_DATA / SCENARIO / f"rank_{rank}.pkl"
        self.raw: dict[str, Any] = load_raw(src.read_bytes())
        self.meta: dict[str, Any] = json.loads(src.with_name(src.name + ".meta.json").read_text())

    def write_early(self, n_entries: int, age_s: float) -> None:
        """The ring as it was when it held only its first `n_entries`, the last one not finished
        (gloo's entries stay `scheduled`; `retired` is what says they finished)."""
        entries = [dict(e) for e in self.raw["entries"][:n_entries]]
        if entries:
            entries[-1]["retired"] = False
        meta = dict(self.meta, snapshot_time_ns=self.meta["snapshot_time_ns"] - int(age_s * 1e9))
        name = f"rank_{self.rank}.pkl"
        write_atomic(self.dest / (name + ".meta.json"), json.dumps(meta).encode())
        # Plain data, as PyTorch writes it (pickle protocol 2+); read back by the safe reader.
        write_atomic(self.dest / name, pickle.dumps(dict(self.raw, entries=entries), protocol=4))

    def copy_committed(self, kinds: tuple[str, ...]) -> None:
        """Copy the committed files of these kinds ("" periodic, ".stall", ".final"), sidecar first."""
        for kind in kinds:
            src = FR_DATA / SCENARIO / f"rank_{self.rank}{kind}.pkl"
            if not src.exists():
                continue
            meta = src.with_name(src.name + ".meta.json")
            write_atomic(self.dest / meta.name, meta.read_bytes())
            write_atomic(self.dest / src.name, src.read_bytes())


def expected_entries() -> dict[tuple[int, int], tuple[str, bool, bool]]:
    """(rank, record_id) -> (state, retired, has frames) after every committed snapshot is merged."""
    by_rank: dict[int, list[Any]] = {}
    for p in sorted((FR_DATA / SCENARIO).glob("rank_*.pkl")):
        d = read_dump_file(p)
        by_rank.setdefault(d.rank, []).append(d)
    out: dict[tuple[int, int], tuple[str, bool, bool]] = {}
    for rank, dumps in by_rank.items():
        for e in merge(dumps).entries:
            out[(rank, e.record_id)] = (e.state, e.retired, bool(e.frames))
    return out


def stored(server: Server) -> dict[tuple[int, int], tuple[str, bool, bool]]:
    """(rank, record_id) -> (state, retired, has a stack) of the server's entries; asserts each once."""
    rows = server.timeline()
    keys = [(r["rank"], r["record_id"]) for r in rows]
    assert len(keys) == len(set(keys)), "an entry is stored twice"
    return {(r["rank"], r["record_id"]): (r["state"], r["retired"], r["stack_id"] is not None) for r in rows}


def rank_feeders(spool: Path) -> dict[int, RankFeeder]:
    dest = spool / JOB / "0"
    dest.mkdir(parents=True)
    ranks = sorted(
        int(p.name.split(".")[0].removeprefix("rank_")) for p in (FR_DATA / SCENARIO).glob("rank_*.pkl")
    )
    return {r: RankFeeder(r, dest) for r in dict.fromkeys(ranks)}


def write_config(tmp_path: Path, url: str, **extra: Any) -> Path:
    values: dict[str, Any] = {
        "server_url": url,
        "token": "tok",
        "spool_dirs": [str(tmp_path / "spool")],
        "torch_dump_prefixes": [],
        "state_dir": str(tmp_path / "state"),
        "metrics_listen": "",
        "host": "node-k",
        "push_interval_s": 0.1,
        "rescan_interval_s": 1.0,
        "retry_backoff_s": 0.05,
        "retry_backoff_max_s": 0.2,
        "shutdown_grace_s": 3.0,
    }
    values.update(extra)
    lines = []
    for k, v in values.items():
        if isinstance(v, str):
            lines.append(f'{k} = "{v}"')
        elif isinstance(v, list):
            lines.append(f"{k} = [{', '.join(repr(x).replace(chr(39), chr(34)) for x in v)}]")
        else:
            lines.append(f"{k} = {v}")
    cfg = tmp_path / "collector.toml"
    cfg.write_text("\n".join(lines) + "\n")
    return cfg


def timeline(server: Server, job: str) -> dict[tuple[int, int], tuple[str, bool]]:
    """(rank, record_id) -> (state, retired) of the job's stored entries ({} before the job exists)."""
    try:
        doc = get_json(f"{server.url}/api/v1/jobs/{job}/timeline?limit=10000")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return {}
        raise
    return {(r["rank"], r["record_id"]): (r["state"], r["retired"]) for r in doc["entries"]}


def expected(directory: Path) -> dict[tuple[int, int], tuple[str, bool]]:
    """What the server should hold of the dumps in `directory`, every snapshot of a rank merged."""
    by_rank: dict[int, list[Any]] = {}
    for p in sorted(directory.glob("rank_*.pkl")):
        d = read_dump_file(p)
        by_rank.setdefault(d.rank, []).append(d)
    return {(r, e.record_id): (e.state, e.retired) for r, ds in by_rank.items() for e in merge(ds).entries}


def stop_promptly(collector: Collector) -> None:
    """SIGTERM: the collector exits by itself with 0 (Collector.stop SIGKILLs after 30 s)."""
    assert collector.proc is not None
    proc = collector.proc
    code = collector.stop()
    assert code == 0, f"exit {code} (-9: SIGTERM was not honoured): {collector.log.read_text()[-2000:]}"
    assert proc.returncode == 0
