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
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.collector_fixtures import FR_DATA, NIXL_DATA, write_atomic
from tests.support.collector_stack import (
    JOB,
    SCENARIO,
    Collector,
    Server,
    expected_entries,
    get_json,
    rank_feeders,
    stored,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

COLLECTOR_NAME = "node-a"


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


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    with Server(tmp_path / "server-data", tmp_path / "server.log") as s:
        yield s


def test_collector_to_real_server_through_outage_and_kill(tmp_path: Path, server: Server) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token("create", COLLECTOR_NAME) + "\n")
    server.start()
    spool, nixl = tmp_path / "spool", tmp_path / "nixl"
    shutil.copytree(NIXL_DATA / "ring-1.5.1", nixl)  # consumed (read_pos advanced): a copy
    feeders = rank_feeders(spool)
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
        # The failure noticed may be a heartbeat's, before these files were read: the next
        # snapshots must not replace them unread (the count below would then never be reached).
        wait_until(
            lambda: collector.metric("flightdeck_collector_files_seen_total") >= 2 * len(feeders),
            30,
            "the snapshots taken at the outage's start to be read",
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
            wait_until(diagnosed, 60, "the server's diagnosis", poll_s=0.5)
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
    feeders = rank_feeders(spool)
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
    feeders = rank_feeders(tmp_path / "a" / "spool")
    a = Collector(tmp_path / "a", server.url, token_file, tmp_path / "a" / "spool", None, host="vm")
    a.start()
    try:
        for f in feeders.values():
            f.write_early(4, age_s=3.0)
        wait_until(lambda: len(server.timeline()) == 4 * len(feeders), 60, "host vm's snapshots")
    finally:
        assert a.stop() == 0
    others = rank_feeders(tmp_path / "b" / "spool")
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
