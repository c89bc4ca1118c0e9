"""The NIXL readers and the ring consumer on live runs of `tests/nixl_jobs/pair.py` with the
nixl 1.5.1 wheel (skipped when it is not installed; CI installs it), which know exactly what they
transferred: ring reads that see exactly the new events, an agent restart, a `prometheus_mp` store
and its writer's liveness."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flightdeck.collector.nixl_consumer import RingConsumer
from flightdeck.launch.demo.ranks import free_port
from flightdeck.nixl_records import NixlSample
from flightdeck.readers.nixl_mp import read_mp_dir
from tests.support.nixl_fixtures import ROOT, delta, ticking_clock

PAIR = ROOT / "tests" / "nixl_jobs" / "pair.py"
REPORT_PREFIX = "PAIR-REPORT "
HAVE_NIXL = importlib.util.find_spec("nixl") is not None
needs_nixl = pytest.mark.skipif(not HAVE_NIXL, reason="nixl==1.5.1 / nixl-cu12==1.5.1 not installed")


def nixl_env(extra: dict[str, str], local_rank: str = "3") -> dict[str, str]:
    """Environment of a NIXL producer on a host without RDMA: UCX over TCP on loopback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NIXL_", "UCX_"))}
    env.update(UCX_TLS="tcp,sm,self", UCX_NET_DEVICES="lo", LOCAL_RANK=local_rank)
    env.update(NIXL_TELEMETRY_ENABLE="y")
    env.update(extra)
    return env


class PairJob:
    """A running `pair.py`: read its reports, tell it to go on, wait for it."""

    def __init__(self, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(PAIR), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def report(self) -> dict[str, Any]:
        """The next report line (NIXL's own log lines on stdout are skipped)."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPORT_PREFIX):
                result: dict[str, Any] = json.loads(line.removeprefix(REPORT_PREFIX))
                return result
        raise AssertionError(f"pair.py ended without a report, status {self.proc.wait(timeout=30)}")

    def go_on(self) -> None:
        """Let the producer leave its checkpoint."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()

    def finish(self) -> None:
        """Wait for a clean exit."""
        assert self.proc.wait(timeout=60) == 0

    def kill(self) -> None:
        """Stop the producer if it is still running (test failure paths)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def pair_jobs() -> Iterator[list[PairJob]]:
    """Collects started jobs and kills any still running at the end of the test."""
    jobs: list[PairJob] = []
    yield jobs
    for job in jobs:
        job.kill()


def poll_until(poll: Callable[[], NixlSample], done: Callable[[NixlSample], bool]) -> NixlSample:
    """Poll until `done` holds or 15 s pass; NIXL flushes its staging queue every 100 ms, and
    the producer's pause may be too short on a loaded CI machine. Returns the last sample."""
    deadline = time.monotonic() + 15
    while True:
        s = poll()
        if done(s) or time.monotonic() > deadline:
            return s
        time.sleep(0.05)


def reached(rep: dict[str, Any]) -> Callable[[NixlSample], bool]:
    """Whether a sample shows everything a producer report says, errors and deregistration too."""

    def done(s: NixlSample) -> bool:
        seen = (s.tx_requests, s.rx_requests, s.errors_by_kind, s.memory_deregistered_bytes)
        return seen == (
            rep["tx_requests"],
            rep["rx_requests"],
            rep["errors"],
            rep["memory_deregistered_bytes"],
        )

    return done


@pytest.mark.slow
@needs_nixl
def test_live_ring_two_reads_see_exactly_the_new_events(tmp_path: Path, pair_jobs: list[PairJob]) -> None:
    ring = tmp_path / "ring"
    ring.mkdir()  # NIXL refuses to create agents when the directory is missing
    env = nixl_env({"NIXL_TELEMETRY_DIR": str(ring), "NIXL_TELEMETRY_BUFFER_SIZE": "32"})
    # 21 events in phase 1, 18 in phase 2: the second read wraps around the 32-slot ring.
    job = PairJob(env, "--writes", "3", "--reads", "2", "--writes2", "4", "--fail", "--size", "8192")
    pair_jobs.append(job)
    rep1 = job.report()
    initiator = RingConsumer(ring / "initiator", host="h1", clock=ticking_clock())
    target = RingConsumer(ring / "target", host="h1")

    s = poll_until(initiator.poll, reached(rep1))
    assert (s.pid, s.local_rank, s.writer_alive, s.host, s.agent) == (rep1["pid"], 3, True, "h1", "initiator")
    assert (s.tx_bytes, s.rx_bytes, s.tx_requests, s.rx_requests) == (
        rep1["tx_bytes"],
        rep1["rx_bytes"],
        rep1["tx_requests"],
        rep1["rx_requests"],
    )
    assert s.memory_registered_bytes == rep1["memory_registered_bytes"] and s.errors == ()
    assert s.xfer_time.count == s.post_time.count == rep1["tx_requests"] + rep1["rx_requests"]
    assert initiator.events_read == 1 + 4 * 5
    assert struct.unpack_from("<QQ", (ring / "initiator").read_bytes(), 0) == (21, 21)  # read_pos advanced
    passive = target.poll()
    assert (passive.pid, passive.tx_requests, passive.memory_registered_bytes) == (rep1["pid"], 0, 65536)

    again = initiator.poll()  # the producer waits on stdin: a second read finds nothing new
    assert initiator.last_read is not None and initiator.last_read.events == []
    assert (
        dataclasses.replace(again, read_time_ns=s.read_time_ns) == s and again.read_time_ns > s.read_time_ns
    )

    job.go_on()
    rep2 = job.report()
    s = poll_until(initiator.poll, reached(rep2))
    # Only the new events: 4 per WRITE, the error, the deregistration.
    assert initiator.events_read == 21 + 4 * delta(rep2, rep1, "tx_requests") + 2
    assert (s.tx_bytes, s.tx_requests, s.rx_bytes) == (
        rep2["tx_bytes"],
        rep2["tx_requests"],
        rep2["rx_bytes"],
    )
    assert s.errors_by_kind == rep2["errors"] == {"not_found": 1}
    assert s.memory_deregistered_bytes == rep2["memory_deregistered_bytes"]
    assert s.xfer_time.count == s.post_time.count == rep2["tx_requests"] + rep2["rx_requests"]
    w, r = struct.unpack_from("<QQ", (ring / "initiator").read_bytes(), 0)
    assert w == r == (21 + 18) % 32  # wrapped, and consumed

    job.go_on()
    job.finish()
    final = initiator.poll()
    assert (final.tx_requests, final.pid, final.writer_alive) == (rep2["tx_requests"], None, None)
    assert initiator.restarts == 0
    assert sorted(p.name for p in ring.iterdir()) == ["initiator", "target"]  # nothing deleted


@pytest.mark.slow
@needs_nixl
def test_live_ring_survives_agent_restart(tmp_path: Path, pair_jobs: list[PairJob]) -> None:
    ring = tmp_path / "ring"
    ring.mkdir()
    env = nixl_env({"NIXL_TELEMETRY_DIR": str(ring)})
    consumer: RingConsumer | None = None
    runs: list[dict[str, Any]] = []
    for _ in range(2):  # the same agent name twice: NIXL reuses the file and resets its positions
        job = PairJob(env, "--no-wait", "--writes", "2", "--reads", "1", "--writes2", "1")
        pair_jobs.append(job)
        job.report()
        runs.append(job.report())
        job.finish()
        consumer = consumer or RingConsumer(ring / "initiator", host="h")
        total = {
            k: sum(r[k] for r in runs) for k in ("tx_requests", "rx_requests", "memory_deregistered_bytes")
        }
        s = poll_until(consumer.poll, reached(total | {"errors": {}}))
    assert consumer is not None and consumer.restarts == 1
    assert s.tx_bytes == sum(r["tx_bytes"] for r in runs) and s.rx_bytes == sum(r["rx_bytes"] for r in runs)
    assert s.xfer_time.count == sum(r["tx_requests"] + r["rx_requests"] for r in runs)
    assert s.memory_registered_bytes == sum(r["memory_registered_bytes"] for r in runs)
    assert (ring / "initiator").exists()


@pytest.mark.slow
@needs_nixl
def test_live_mp_store_and_writer_liveness(tmp_path: Path, pair_jobs: list[PairJob]) -> None:
    mp = tmp_path / "mp"
    mp.mkdir()
    env = nixl_env(
        {
            "NIXL_TELEMETRY_EXPORTER": "prometheus_mp",
            "NIXL_TELEMETRY_MULTIPROC_DIR": str(mp),
            "NIXL_TELEMETRY_PROMETHEUS_PORT": str(free_port()),
            "NIXL_TELEMETRY_PROMETHEUS_LOCAL": "1",  # bind 127.0.0.1 only
        },
        local_rank="1",
    )
    job = PairJob(env, "--fail")
    pair_jobs.append(job)

    def initiator() -> NixlSample:
        samples, failures = read_mp_dir(mp, host="h")
        assert failures == []
        return {x.agent: x for x in samples}["initiator"]

    rep1 = job.report()
    s = poll_until(initiator, reached(rep1))
    assert (s.pid, s.local_rank, s.writer_alive) == (rep1["pid"], 1, True)
    assert (s.tx_bytes, s.rx_bytes, s.errors) == (rep1["tx_bytes"], rep1["rx_bytes"], ())
    assert s.xfer_time.count == s.post_time.count == rep1["tx_requests"] + rep1["rx_requests"]
    # The writer waits on stdin: reading again finds the same counters (reading takes nothing).
    assert dataclasses.replace(initiator(), read_time_ns=s.read_time_ns) == s
    before = {p.name for p in mp.iterdir()}

    job.go_on()
    rep2 = job.report()
    s = poll_until(initiator, reached(rep2))
    assert (s.tx_bytes, s.tx_requests, s.errors_by_kind) == (
        rep2["tx_bytes"],
        rep2["tx_requests"],
        rep2["errors"],
    )
    assert s.memory_deregistered_bytes == rep2["memory_deregistered_bytes"]
    assert s.xfer_time.count == rep2["tx_requests"] + rep2["rx_requests"]
    job.go_on()
    job.finish()
    after = initiator()
    assert after.writer_alive is False and after.tx_bytes == rep2["tx_bytes"]
    assert before <= {p.name for p in mp.iterdir()}  # nothing deleted
