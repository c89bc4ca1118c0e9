"""The real collector (`flightdeck collector`, a subprocess) pushing to a real `flightdeck server`
process on SQLite: real committed dumps of a hung gloo job copied into a spool directory over time
(earlier snapshots of each rank's ring first, then the job's own periodic, stall and final files),
real NIXL ring files, the server stopped for a while and restarted on the same database, the
collector SIGKILLed while a push is in flight and restarted. Afterwards every entry is on the server
exactly once, with its final state, and the server's verdict is the scenario's.

And the token: revoked while the collector runs, nothing is dead-lettered or lost; with a new token
in its token_file the collector catches up without a restart.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from flightdeck.collector.frdump import load_raw, merge, read_dump_file
from flightdeck.launch.demo.ranks import free_port

if TYPE_CHECKING:
    from tests.test_collector_fixtures import FR_DATA, NIXL_DATA, write_atomic
else:
    from test_collector_fixtures import FR_DATA, NIXL_DATA, write_atomic

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SCENARIO = "skip"
JOB = "skip"
COLLECTOR_NAME = "node-a"
FLIGHTDECK = [sys.executable, "-m", "flightdeck"]


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll `cond` until true; fail the test naming `what` after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def get_json(url: str, timeout_s: float = 5.0) -> Any:
    """GET a JSON document."""
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        return json.loads(r.read())


class Server:
    """A `flightdeck server` process on 127.0.0.1 with its SQLite database in `data_dir`."""

    def __init__(self, data_dir: Path, log: Path) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")},
            "FLIGHTDECK_DATA_DIR": str(data_dir),
            "FLIGHTDECK_PORT": str(self.port),
            "FLIGHTDECK_STALL_AFTER_S": "5",
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def token(self, action: str, name: str, *scope: str) -> str:
        """`flightdeck token <action> <name> [scope...]` on the server's database; its output.
        Created tokens are unscoped unless a scope is given: the committed dumps name the host they
        were recorded on ("vm"), the collector calls itself "testhost"."""
        scope = scope or (("--any-host",) if action == "create" else ())
        out = subprocess.run(
            [*FLIGHTDECK, "token", action, name, *scope],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return out.stdout.strip()

    def start(self) -> None:
        """Start (or restart, same port and database) and wait until /healthz answers."""
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*FLIGHTDECK, "server", "--log-level", "warning"], env=self.env, stdout=out, stderr=out
            )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(up, 60, "the server to answer /healthz")

    def stop(self) -> None:
        """Stop the process (SIGTERM, SIGKILL after 30 s)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # in case it is paused
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, nothing is answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

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


class AnswerHoldingProxy:
    """A TCP forwarder between the collector and the server that can hold the server's answers back
    (`hold` set): the server applies a batch and the collector never hears so, a lost answer. While
    the server is down it accepts and closes, which the collector sees as a connection error."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.hold = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="proxy-accept", daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [client, upstream]
                for src, dst, answers in ((client, upstream, False), (upstream, client, True)):
                    t = threading.Thread(target=self._pump, args=(src, dst, answers), daemon=True)
                    self._threads.append(t)
                    t.start()

    def _pump(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers and self.hold.is_set():
                    continue  # the answer is lost on the way
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop accepting, close every connection, join the threads."""
        self._stop.set()
        self._listener.close()
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            threads = list(self._threads)
        for t in threads:
            t.join(10)


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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path / "server-data", tmp_path / "server.log")
    try:
        yield s
    finally:
        s.stop()


def _feeders(spool: Path) -> dict[int, RankFeeder]:
    dest = spool / JOB / "0"
    dest.mkdir(parents=True)
    ranks = sorted(
        int(p.name.split(".")[0].removeprefix("rank_")) for p in (FR_DATA / SCENARIO).glob("rank_*.pkl")
    )
    return {r: RankFeeder(r, dest) for r in dict.fromkeys(ranks)}


def test_collector_to_real_server_through_outage_and_kill(tmp_path: Path, server: Server) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", COLLECTOR_NAME) + "\n")
    server.start()
    spool, nixl = tmp_path / "spool", tmp_path / "nixl"
    shutil.copytree(NIXL_DATA / "ring-1.5.1", nixl)  # consumed (read_pos advanced): a copy
    feeders = _feeders(spool)
    proxy = AnswerHoldingProxy(server.port)
    collector = Collector(tmp_path, proxy.url, token_file, spool, nixl)
    collector.start()
    try:
        # 1. Early snapshots: the first 4 entries of every ring, the 4th still running.
        for f in feeders.values():
            f.write_early(4, age_s=3.0)
        wait_until(lambda: len(server.timeline()) == 4 * len(feeders), 60, "the first snapshots")
        assert {r["retired"] for r in server.timeline() if r["record_id"] == 3} == {False}

        # 2. The server goes away; the ranks keep snapshotting; the collector queues.
        server.stop()
        for f in feeders.values():
            f.write_early(7, age_s=2.0)
        wait_until(
            lambda: collector.metric("flightdeck_collector_batches_failed_total", reason="connection") > 0,
            30,
            "the collector to notice the server is down",
        )
        for f in feeders.values():
            f.write_early(9, age_s=1.5)
        wait_until(
            lambda: collector.metric("flightdeck_collector_files_seen_total") >= 3 * len(feeders),
            30,
            "the snapshots taken during the outage to be read",
        )
        assert collector.metric("flightdeck_collector_queue_depth_batches") >= 1
        server.start()  # same port, same database
        wait_until(lambda: len(server.timeline()) == 9 * len(feeders), 60, "the outage's snapshots")
        wait_until(
            lambda: collector.metric("flightdeck_collector_queue_depth_batches") == 0, 30, "an empty queue"
        )

        # 3. A push in flight when the collector is SIGKILLed: the server is paused, so the request
        # waits in its socket; the collector dies; the server resumes (and drops the request).
        sent = collector.metric("flightdeck_collector_batches_sent_total")
        enqueued = collector.metric("flightdeck_collector_batches_enqueued_total")
        server.pause()
        for f in feeders.values():
            f.copy_committed(("",))
        wait_until(
            lambda: collector.metric("flightdeck_collector_batches_enqueued_total") > enqueued,
            30,
            "the committed periodic snapshots to be queued",
        )
        time.sleep(1.0)  # the pusher wakes on enqueue: by now its request waits on the paused server
        assert collector.metric("flightdeck_collector_batches_sent_total") == sent
        collector.kill()
        server.resume()
        collector.start()  # resends what it had queued
        wait_until(
            lambda: collector.metric("flightdeck_collector_queue_depth_batches") == 0, 30, "an empty queue"
        )

        # 4. A lost answer: the server applies the stall snapshots' batch, its answer never reaches
        # the collector, which is SIGKILLed; restarted, it sends the batch again: a duplicate.
        accepted = server.metric("flightdeck_ingest_batches_total", outcome="accepted")
        duplicates = server.metric("flightdeck_ingest_batches_total", outcome="duplicate")
        sent = collector.metric("flightdeck_collector_batches_sent_total")
        proxy.hold.set()
        for f in feeders.values():
            f.copy_committed((".stall",))
        wait_until(
            lambda: server.metric("flightdeck_ingest_batches_total", outcome="accepted") > accepted,
            30,
            "the server to apply the stall snapshots",
        )
        assert collector.metric("flightdeck_collector_batches_sent_total") == sent
        collector.kill()
        proxy.hold.clear()
        collector.start()
        wait_until(
            lambda: server.metric("flightdeck_ingest_batches_total", outcome="duplicate") > duplicates,
            60,
            "the batch sent again to be recognized as a duplicate",
        )

        # 5. The final snapshots; then every entry is stored once, with its final state.
        for f in feeders.values():
            f.copy_committed((".final",))
        want = expected_entries()
        try:
            wait_until(lambda: stored(server) == want, 90, "every entry with its final state")
        except AssertionError:
            got = stored(server)
            diff = {k: (want.get(k), got.get(k)) for k in set(want) | set(got) if want.get(k) != got.get(k)}
            raise AssertionError(f"(expected, stored) differ: {sorted(diff.items())}") from None
        wait_until(
            lambda: collector.metric("flightdeck_collector_queue_depth_batches") == 0, 30, "an empty queue"
        )
        assert stored(server) == want  # and nothing more arrived afterwards
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0

        # The server's verdict is the scenario's.
        exp = json.loads((FR_DATA / SCENARIO / "scenario.json").read_text())["expected"]

        def root_finding() -> dict[str, Any] | None:
            doc = get_json(f"{server.url}/api/v1/jobs/{JOB}")
            return doc["findings"][0] if doc["findings"] else None

        def diagnosed() -> bool:
            # Diagnosis follows ingest (debounced): wait for the one of the complete data.
            root = root_finding()
            return root is not None and root["kind"] == exp["kind"]

        try:
            wait_until(diagnosed, 60, "the server's diagnosis", interval_s=0.5)
        except AssertionError:
            raise AssertionError(f"the server's root finding: {root_finding()}") from None
        report = get_json(f"{server.url}/api/v1/jobs/{JOB}")
        assert report["healthy"] is exp["healthy"]
        root = report["findings"][0]
        assert (root["kind"], root["culprit_ranks"], root["process_group"]) == (
            exp["kind"],
            exp["culprit_ranks"],
            exp["process_group"],
        ), root["detail"]
        assert (root["collective_seq_id"], root["op"]) == (exp["collective_seq_id"], exp["op"])

        # NIXL: both agents' ring events arrived, attributed to this host.
        ring1, ring2 = json.loads((NIXL_DATA / "expected.json").read_text())["1.5.1"]["ring"]
        agents = {(a["agent"], a["source"]): a for a in get_json(f"{server.url}/api/v1/nixl/agents")}
        assert set(agents) == {("initiator", "ring"), ("target", "ring")}
        assert agents[("initiator", "ring")]["host"] == "testhost"
        assert agents[("initiator", "ring")]["totals"]["tx_bytes"] == ring2["tx_bytes"] - ring1["tx_bytes"]
    finally:
        code = collector.stop()
        proxy.close()
    assert code == 0


def test_revoked_token_keeps_batches_until_a_new_token_is_given(tmp_path: Path, server: Server) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", COLLECTOR_NAME) + "\n")
    server.start()
    spool = tmp_path / "spool"
    feeders = _feeders(spool)
    collector = Collector(tmp_path, server.url, token_file, spool, None)
    collector.start()
    try:
        for f in feeders.values():
            f.write_early(4, age_s=3.0)
        wait_until(lambda: len(server.timeline()) == 4 * len(feeders), 60, "the first snapshots")

        server.token("revoke", COLLECTOR_NAME)
        time.sleep(1.2)  # the server trusts a verified token for auth_cache_s (1 s)
        for f in feeders.values():
            f.write_early(8, age_s=2.0)
        wait_until(
            lambda: collector.metric("flightdeck_collector_token_rejected") == 1,
            30,
            "the token to be refused",
        )
        time.sleep(2.0)  # several backoff rounds (auth_retry_max_s = 1): still nothing dead-lettered
        assert collector.metric("flightdeck_collector_auth_failures_total") >= 2
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0
        assert collector.metric("flightdeck_collector_queue_depth_batches") >= 1
        assert len(server.timeline()) == 4 * len(feeders)
        assert server.metric("flightdeck_ingest_rejects_total", reason="auth") >= 2
        log = collector.log.read_text()
        assert log.count("server rejected the collector token: HTTP 401 unknown or revoked token") == 1

        # The operator issues a new token and writes it to the token file: no restart needed.
        write_atomic(token_file, (server.token("create", COLLECTOR_NAME + "-new") + "\n").encode())
        wait_until(lambda: len(server.timeline()) == 8 * len(feeders), 60, "the held-back snapshots")
        assert collector.metric("flightdeck_collector_token_rejected") == 0
        assert collector.metric("flightdeck_collector_dead_letter_batches") == 0
        assert "the collector token changed" in collector.log.read_text()
    finally:
        code = collector.stop()
    assert code == 0


def test_a_host_bound_token_delivers_its_hosts_ranks_and_nothing_from_another_host(
    tmp_path: Path, server: Server
) -> None:
    """`flightdeck token create --host vm`: the collector of host vm delivers (the committed dumps
    were recorded on vm); the same token on a collector that calls itself node-9 is refused with
    403 and the reason, and that collector keeps its batches (nothing dead-lettered or stored)."""
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", "node-vm", "--host", "vm") + "\n")
    server.start()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    feeders = _feeders(tmp_path / "a" / "spool")
    a = Collector(tmp_path / "a", server.url, token_file, tmp_path / "a" / "spool", None, host="vm")
    a.start()
    try:
        for f in feeders.values():
            f.write_early(4, age_s=3.0)
        wait_until(lambda: len(server.timeline()) == 4 * len(feeders), 60, "host vm's snapshots")
    finally:
        assert a.stop() == 0
    others = _feeders(tmp_path / "b" / "spool")
    b = Collector(tmp_path / "b", server.url, token_file, tmp_path / "b" / "spool", None, host="node-9")
    b.start()
    try:
        for f in others.values():
            f.write_early(8, age_s=2.0)
        wait_until(lambda: b.metric("flightdeck_collector_token_rejected") == 1, 30, "the 403")
        assert server.metric("flightdeck_ingest_rejects_total", reason="scope") >= 1
        assert b.metric("flightdeck_collector_dead_letter_batches") == 0
        assert b.metric("flightdeck_collector_queue_depth_batches") >= 1
        assert len(server.timeline()) == 4 * len(feeders)  # nothing of node-9's batch
        assert (
            "HTTP 403 token 'node-vm' is bound to host 'vm'; this batch comes from collector host 'node-9'"
            in (b.log.read_text())
        )
    finally:
        assert b.stop() == 0
