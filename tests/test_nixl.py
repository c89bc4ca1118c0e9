"""Tests of the NIXL telemetry readers: `prometheus_mp` stores, ring files, records on the wire.

Three kinds of input, all real where NIXL can make them:
- live runs of `tests/nixl_jobs/pair.py` with the nixl 1.5.1 wheel (skipped when it is not
  installed; CI installs it), which know exactly what they transferred;
- files that same producer wrote with NIXL 1.0.1, 1.1.0, 1.2.0, 1.3.2 and 1.5.1 (every ring
  layout: v1, v2 48-byte, v2 16-byte, v3, v4), committed under tests/data/nixl by
  `tests/nixl_jobs/make_fixtures.py`, so the readers are tested without the wheel;
- a few rings built here from the layouts in docs/nixl-telemetry.md, only for what a real run
  cannot provoke cheaply (dropped-event counts, unknown event ids, garbage padding bytes).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from flightdeck.collector.nixl_consumer import OwnerFinder, RingConsumer, RingDirectory
from flightdeck.launch.demo.ranks import free_port
from flightdeck.nixl_records import Histogram, NixlSample
from flightdeck.readers.nixl import (
    DEFAULT_BUCKET_BOUNDS_US,
    EVENT_TYPE_IDS,
    EVENT_TYPES,
    Accumulator,
    NixlAccessError,
    NixlFormatError,
    event_type_id,
)
from flightdeck.readers.nixl_mp import read_mp_dir, read_mp_store
from flightdeck.readers.nixl_ring import read_ring

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "nixl"
PAIR = ROOT / "tests" / "nixl_jobs" / "pair.py"
EXPECTED: dict[str, Any] = json.loads((DATA / "expected.json").read_text())
RING_RELEASES = {"1.0.1": (1, "v1"), "1.1.0": (2, "v2-48"), "1.2.0": (2, "v2-16"), "1.3.2": (3, "v3")}
RING_RELEASES["1.5.1"] = (4, "v3")
REPORT_PREFIX = "PAIR-REPORT "

HAVE_NIXL = importlib.util.find_spec("nixl") is not None
needs_nixl = pytest.mark.skipif(not HAVE_NIXL, reason="nixl==1.5.1 / nixl-cu12==1.5.1 not installed")


# --- helpers -------------------------------------------------------------------------------------


def ticking_clock(start: int = 1_000_000_000) -> Callable[[], int]:
    """A clock that advances one second per call (an injected clock, not a mock of a reader)."""
    now = [start]

    def clock() -> int:
        now[0] += 1_000_000_000
        return now[0]

    return clock


def copy_fixture(name: str, tmp_path: Path) -> Path:
    """A writable copy of a fixture directory (consuming a ring writes to it)."""
    dest = tmp_path / name
    shutil.copytree(DATA / name, dest)
    return dest


def snapshot(path: Path) -> tuple[bytes, int]:
    """A file's bytes and mtime, to prove a reader wrote nothing."""
    return path.read_bytes(), path.stat().st_mtime_ns


def delta(rep2: dict[str, Any], rep1: dict[str, Any], key: str) -> int:
    """What the producer did between its two reports."""
    return int(rep2[key]) - int(rep1[key])


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


def build_ring(
    version: int, capacity: int, slots: list[bytes], *, write_pos: int, read_pos: int = 0
) -> bytes:
    """A ring file from the doc's header layout; `slots` are already-encoded events."""
    size = len(slots[0])
    body = b"".join(slots) + bytes(size * (capacity - len(slots)))
    return struct.pack("<QQiiQQ", write_pos, read_pos, version, version, capacity, capacity - 1) + body


# --- real ring files of every release (committed fixtures) ----------------------------------------


@pytest.mark.parametrize("release", sorted(RING_RELEASES))
def test_real_ring_of_each_release_decodes_the_unread_events(release: str, tmp_path: Path) -> None:
    version, layout = RING_RELEASES[release]
    ring = copy_fixture(f"ring-{release}", tmp_path)
    rep1, rep2 = EXPECTED[release]["ring"]
    before = snapshot(ring / "initiator")

    peek = read_ring(ring / "initiator", consume=False)

    assert snapshot(ring / "initiator") == before  # a peek writes nothing
    h = peek.header
    assert (h.version, h.layout, h.capacity) == (version, layout, EXPECTED[release]["ring_capacity"])
    # The fixture holds phase 2 unread, wrapping past the end: positions are stored masked.
    assert h.read_pos > h.write_pos
    names = [EVENT_TYPES[t] for t, _ in peek.events]
    writes = delta(rep2, rep1, "tx_requests")
    per_write = ["agent_xfer_post_time", "agent_xfer_time", "agent_tx_bytes", "agent_tx_requests_num"]
    assert names == per_write * writes + ["agent_err_not_found", "agent_memory_deregistered"]
    size = delta(rep2, rep1, "tx_bytes") // writes
    assert [v for (t, v) in peek.events if t == EVENT_TYPE_IDS["agent_tx_bytes"]] == [size] * writes


@pytest.mark.parametrize("release", sorted(RING_RELEASES))
def test_consumer_counts_exactly_what_the_producer_did(release: str, tmp_path: Path) -> None:
    ring = copy_fixture(f"ring-{release}", tmp_path)
    rep1, rep2 = EXPECTED[release]["ring"]
    clock = ticking_clock()
    consumer = RingConsumer(ring / "initiator", host="h1", clock=clock, owner_finder=OwnerFinder(tmp_path))
    before = (ring / "initiator").read_bytes()

    s = consumer.poll()

    assert (s.host, s.agent, s.source, s.format_version) == (
        "h1",
        "initiator",
        "ring",
        RING_RELEASES[release][0],
    )
    assert s.tx_bytes == delta(rep2, rep1, "tx_bytes")
    assert s.tx_requests == delta(rep2, rep1, "tx_requests")
    assert (s.rx_bytes, s.rx_requests, s.memory_registered_bytes) == (0, 0, 0)
    assert s.memory_deregistered_bytes == rep2["memory_deregistered_bytes"]
    assert s.errors == (("not_found", 1),)
    assert s.xfer_time.count == s.post_time.count == s.tx_requests + s.rx_requests
    assert s.xfer_time.bounds_us == DEFAULT_BUCKET_BOUNDS_US
    assert (s.pid, s.local_rank, s.writer_alive) == (None, None, None)  # empty proc root: no owner
    assert consumer.last_read is not None and s.read_time_ns == consumer.last_read.read_time_ns

    # Only read_pos changed, to the write_pos we saw; nothing else in the file.
    after = (ring / "initiator").read_bytes()
    assert after[:8] + after[16:] == before[:8] + before[16:]
    assert struct.unpack_from("<Q", after, 8)[0] == struct.unpack_from("<Q", before, 0)[0]

    again = consumer.poll()  # nothing new: same totals, a later read time
    assert consumer.last_read.events == []
    assert dataclasses.replace(again, read_time_ns=s.read_time_ns) == s
    assert again.read_time_ns > s.read_time_ns
    assert (ring / "initiator").read_bytes() == after


def test_passive_side_ring_has_memory_events_only(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    consumer = RingConsumer(ring / "target", host="h", owner_finder=OwnerFinder(tmp_path))
    before = snapshot(ring / "target")
    s = consumer.poll()
    assert consumer.last_read is not None and consumer.last_read.events == []  # consumed by fixture run
    assert (s.tx_requests, s.rx_requests, s.xfer_time.count) == (0, 0, 0)
    assert snapshot(ring / "target") == before  # nothing to consume: nothing written


def test_agent_restart_resets_positions_and_counting_goes_on(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path) / "initiator"
    consumer = RingConsumer(ring, host="h", owner_finder=OwnerFinder(tmp_path))
    first = consumer.poll()
    # What NIXL does when an agent of the same name starts again: both positions back to 0, then
    # it writes new events. Here: pretend the 5 events in slots 0..4 are the new agent's.
    data = bytearray(ring.read_bytes())
    struct.pack_into("<QQ", data, 0, 5, 0)
    ring.write_bytes(bytes(data))
    slots = read_ring(ring, consume=False).events
    second = consumer.poll()
    assert consumer.restarts == 1 and second.restarts == 1
    assert consumer.last_read is not None and consumer.last_read.events == slots
    new_requests = sum(v for t, v in slots if t == EVENT_TYPE_IDS["agent_tx_requests_num"])
    assert len(slots) == 5 and new_requests == 2
    assert second.tx_requests == first.tx_requests + new_requests  # cumulative across the restart
    assert second.events_dropped == 0 and second.run == first.run
    assert struct.unpack_from("<Q", ring.read_bytes(), 8)[0] == 5


# --- rings built from the documented layouts (what a real run cannot cheaply provoke) -----------


def test_v4_dropped_events_unknown_ids_and_garbage_bytes(tmp_path: Path) -> None:
    def ev(type_id: int, value: int) -> bytes:
        # The 4 bytes after the id are uninitialised in NIXL ≥ 1.3: fill them with junk.
        return struct.pack("<I4sQ", type_id, b"\xde\xad\xbe\xef", value)

    path = tmp_path / "agent-x"
    events = [ev(20, 7), ev(99, 1), ev(6, 10), ev(6, 11), ev(7, 10_000_001), ev(17, 1)]
    path.write_bytes(build_ring(4, 8, events, write_pos=len(events)))
    s = RingConsumer(path, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert s.events_dropped == 7
    assert s.unknown_events == 1
    assert s.errors == (("remote_disconnect", 1),)
    # Prometheus `le` buckets: 10 is in the first (≤ 10), 11 in the second, 10 000 001 in +Inf.
    assert s.xfer_time.counts[:2] == (1, 1) and s.xfer_time.sum_us == 21
    assert s.post_time.counts[-1] == 1


def test_v1_unknown_names_are_counted_not_guessed(tmp_path: Path) -> None:
    def ev(name: bytes, value: int) -> bytes:
        return struct.pack("<Qi32s4xQ", 1_700_000_000_000_000, 1, name, value)

    path = tmp_path / "old"
    events = [ev(b"agent_tx_bytes", 100), ev(b"NIXL_ERR_BACKEND", 1), ev(b"something_new", 5)]
    path.write_bytes(build_ring(1, 4, events, write_pos=3))
    s = RingConsumer(path, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert (s.tx_bytes, s.errors, s.unknown_events) == (100, (("backend", 1),), 1)


def test_full_ring_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "full"
    events = [struct.pack("<I4xQ", 2, 1)] * 3
    path.write_bytes(build_ring(4, 4, events, write_pos=3))  # capacity − 1 unread: full
    s = RingConsumer(path, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert (s.tx_requests, s.ring_full_reads) == (3, 1)


def test_event_names_of_old_releases_map_to_ids() -> None:
    assert event_type_id("agent_rx_bytes") == 1
    assert event_type_id("NIXL_ERR_NOT_FOUND") == EVENT_TYPE_IDS["agent_err_not_found"]
    assert event_type_id("NIXL_ERR_REMOTE_DISCONNECT") == 17
    assert event_type_id("NIXL_ERR_SOMETHING") is None


# --- bad input: a clear NixlFormatError, and nothing written -------------------------------------


def _patch(data: bytes, fmt: str, offset: int, *values: float) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


RING = (DATA / "ring-1.5.1" / "initiator").read_bytes()
BAD_RINGS: dict[str, tuple[bytes, str]] = {
    "truncated header": (RING[:20], r"truncated NIXL ring header: 20 bytes, need 40"),
    "empty file": (b"", r"truncated NIXL ring header: 0 bytes"),
    "version 5": (_patch(RING, "<ii", 16, 5, 5), r"unsupported NIXL ring version 5 \(this reader knows"),
    "version 0": (_patch(RING, "<ii", 16, 0, 0), r"unsupported NIXL ring version 0"),
    "capacity not a power of two": (
        _patch(RING, "<QQ", 24, 24, 23)[: 40 + 24 * 16],
        r"ring capacity 24 is not a power of two",
    ),
    "mask not capacity - 1": (_patch(RING, "<Q", 32, 7), r"ring mask 7 is not capacity − 1 = 31"),
    "shorter than capacity implies": (
        RING[:-16],
        r"536 bytes but version 4 with capacity 32 needs 552 bytes",
    ),
    "v2 size fits neither layout": (
        _patch(RING, "<ii", 16, 2, 2)[:-8],
        r"version 2 with capacity 32 needs 1576 or 552 bytes",
    ),
    "version differs from expected_version": (
        _patch(RING, "<i", 20, 3),
        r"ring version 4 but expected_version 3",
    ),
    # Positions are stored masked: past the capacity they are no ring's (904 phantom events were
    # read from this before), and such a read_pos must never be written back.
    "write_pos past the capacity": (
        _patch(RING, "<Q", 0, 32 + 904),
        r"ring write_pos 936 is outside the ring \(capacity 32\); refused",
    ),
    "read_pos past the capacity": (
        _patch(RING, "<Q", 8, 2**63 + 5),
        r"ring read_pos 9223372036854775813 is outside the ring \(capacity 32\)",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RINGS))
def test_bad_ring_is_refused_and_left_alone(case: str, tmp_path: Path) -> None:
    data, message = BAD_RINGS[case]
    path = tmp_path / "agent"
    path.write_bytes(data)
    before = snapshot(path)
    with pytest.raises(NixlFormatError, match=message):
        RingConsumer(path, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    with pytest.raises(NixlFormatError, match=message):
        read_ring(path, consume=True)
    assert snapshot(path) == before


def test_fifo_in_the_telemetry_dir_is_refused_without_blocking(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    os.mkfifo(ring / "pipe")  # opening it for reading would wait for a writer for ever
    with pytest.raises(NixlFormatError, match="not a regular file"):
        read_ring(ring / "pipe", consume=True)
    samples, failures = RingDirectory(ring, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert sorted(s.agent for s in samples) == ["initiator", "target"]
    assert failures == []


def test_fifo_named_like_an_mp_store_is_refused_without_blocking(tmp_path: Path) -> None:
    mp = copy_fixture("mp-1.5.1", tmp_path)
    os.mkfifo(mp / "nixl.999.1.0.mmap")
    samples, failures = read_mp_dir(mp, host="h")
    assert samples and [str(f) for f in failures] == [
        f"{mp / 'nixl.999.1.0.mmap'}: not a regular file; not opened"
    ]


def test_ring_directory_keeps_going_past_a_bad_file(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    (ring / "broken").write_bytes(RING[:10])
    samples, failures = RingDirectory(ring, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert sorted(s.agent for s in samples) == ["initiator", "target"]
    assert len(failures) == 1 and "broken" in str(failures[0])
    assert sorted(p.name for p in ring.iterdir()) == ["broken", "initiator", "target"]


MP = next((DATA / "mp-1.5.1").glob("nixl.*.0.mmap")).read_bytes()
BAD_MP: dict[str, tuple[bytes, str]] = {
    "wrong magic": (
        _patch(MP, "<Q", 0, 0x1122334455667788),
        r"magic 0x1122334455667788, expected 0x3153504d4c58494e",
    ),
    "schema version 2": (_patch(MP, "<I", 8, 2), r"unsupported prometheus_mp schema version 2"),
    "short": (MP[:6000], r"size 6000 bytes, expected 6800"),
    "long": (MP + b"\0", r"size 6801 bytes, expected 6800"),
    "slot count": (_patch(MP, "<I", 12, 22), r"slot count 22, expected 21"),
    "bucket count": (_patch(MP, "<Q", 40, 40), r"bucket count 40 outside 1..32"),
    "bounds not increasing": (_patch(MP, "<d", 496 + 8, 5.0), r"bucket bounds are not finite and increasing"),
}


@pytest.mark.parametrize("case", sorted(BAD_MP))
def test_bad_mp_store_is_refused_and_left_alone(case: str, tmp_path: Path) -> None:
    data, message = BAD_MP[case]
    path = tmp_path / "nixl.1.2.0.mmap"
    path.write_bytes(data)
    before = snapshot(path)
    with pytest.raises(NixlFormatError, match=message):
        read_mp_store(path)
    samples, failures = read_mp_dir(tmp_path, host="h")
    assert samples == [] and len(failures) == 1
    assert snapshot(path) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root may open any file")
def test_unwritable_ring_and_unreadable_store_are_clear_errors(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    (ring / "initiator").chmod(0o444)
    samples, failures = RingDirectory(ring, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert [s.agent for s in samples] == ["target"]
    assert isinstance(failures[0], NixlAccessError) and "cannot open read-write" in str(failures[0])
    mp = copy_fixture("mp-1.5.1", tmp_path)
    store = next(mp.glob("nixl.*.0.mmap"))
    store.chmod(0)
    samples, failures = read_mp_dir(mp, host="h")
    assert len(samples) == 1 and isinstance(failures[0], NixlAccessError)


# --- prometheus_mp store files (committed fixture) -----------------------------------------------


def test_real_mp_store_matches_what_the_producer_did(tmp_path: Path) -> None:
    mp = copy_fixture("mp-1.5.1", tmp_path)
    _, rep = EXPECTED["1.5.1"]["mp"]
    before = {p.name: snapshot(p) for p in mp.iterdir()}

    samples, failures = read_mp_dir(mp, host="h1", clock=ticking_clock())

    assert failures == []  # the owner-election lock file is skipped, not an error
    by_agent = {s.agent: s for s in samples}
    s = by_agent[rep["initiator"]]
    assert (s.host, s.pid, s.local_rank, s.source, s.format_version) == ("h1", rep["pid"], 0, "mp", 1)
    assert s.writer_alive is False  # the fixture's writer is long gone
    assert (s.tx_bytes, s.rx_bytes) == (rep["tx_bytes"], rep["rx_bytes"])
    assert (s.tx_requests, s.rx_requests) == (rep["tx_requests"], rep["rx_requests"])
    assert s.memory_registered_bytes == rep["memory_registered_bytes"]
    assert s.memory_deregistered_bytes == rep["memory_deregistered_bytes"]
    assert s.errors_by_kind == rep["errors"]
    assert s.xfer_time.count == s.post_time.count == rep["tx_requests"] + rep["rx_requests"]
    assert s.xfer_time.bounds_us == DEFAULT_BUCKET_BOUNDS_US  # NIXL's defaults, from this header
    store = read_mp_store(next(mp.glob("nixl.*.0.mmap")))
    assert s.run == store.run and store.run.endswith(".0") and store.hostname
    passive = by_agent[rep["target"]]
    assert (passive.tx_requests, passive.memory_registered_bytes) == (0, rep["region_bytes"])
    assert {p.name: snapshot(p) for p in mp.iterdir()} == before


# --- owner lookup through a /proc tree ------------------------------------------------------------


def _fake_proc(root: Path, pid: int, *, maps: str, environ: bytes, start: int) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "maps").write_text(maps)
    (d / "environ").write_bytes(environ)
    # comm with a space and a parenthesis, as real process names can have.
    fields = ["S"] + ["0"] * 18 + [str(start)] + ["0"] * 10
    (d / "stat").write_text(f"{pid} (vllm (worker) 0) " + " ".join(fields) + "\n")


def test_owner_found_through_maps_with_local_rank(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path) / "initiator"
    st = ring.stat()
    dev = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}"
    proc = tmp_path / "proc"
    line = (
        f"7f0000000000-7f0000001000 rw-s 00000000 {dev} {st.st_ino}                    /elsewhere/initiator\n"
    )
    other = "7f0000000000-7f0000001000 r--p 00000000 00:00 0 \n"
    _fake_proc(proc, 4242, maps=other + line, environ=b"A=1\0LOCAL_RANK=5\0B=2\0", start=777)
    _fake_proc(proc, 4243, maps=line, environ=b"", start=778)  # a forked child: later pid
    _fake_proc(proc, 17, maps=other, environ=b"LOCAL_RANK=0\0", start=1)
    (proc / "self").mkdir()
    finder = OwnerFinder(proc, exclude_pid=1)
    consumer = RingConsumer(ring, host="h", owner_finder=finder, clock=ticking_clock(), owner_rescan_ns=0)

    s = consumer.poll()
    assert (s.pid, s.local_rank, s.writer_alive) == (4242, 5, True)

    # The pid is reused by another process (new start time): the owner is looked up again.
    shutil.rmtree(proc / "4242")
    _fake_proc(proc, 4242, maps=other, environ=b"LOCAL_RANK=9\0", start=999)
    s = consumer.poll()
    assert (s.pid, s.local_rank) == (4243, None)
    shutil.rmtree(proc / "4243")
    assert consumer.poll().pid is None


# --- records on the wire --------------------------------------------------------------------------


def _sample() -> NixlSample:
    acc = Accumulator()
    for type_id, value in read_ring(DATA / "ring-1.5.1" / "initiator", consume=False).events:
        acc.add(type_id, value)
    return acc.sample(
        host="h",
        agent="a",
        pid=1,
        local_rank=0,
        source="ring",
        read_time_ns=5,
        run="r",
        format_version=4,
        writer_alive=True,
        restarts=0,
        ring_full_reads=0,
    )


def test_wire_round_trip_through_json(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    for s in (
        RingDirectory(ring, host="h", owner_finder=OwnerFinder(tmp_path)).poll()[0]
        + read_mp_dir(copy_fixture("mp-1.5.1", tmp_path), host="h")[0]
    ):
        assert NixlSample.from_wire(json.loads(json.dumps(s.to_wire()))) == s


def _wire_with(**changes: Any) -> dict[str, Any]:
    w = _sample().to_wire()
    for k, v in changes.items():
        if v is ...:
            del w[k]
        else:
            w[k] = v
    return w


BAD_WIRE: dict[str, tuple[object, str]] = {
    "not an object": ([], r"nixl sample: expected an object, got list"),
    "no version": ({}, r"unsupported wire version None"),
    "wire version": (_wire_with(v=2), r"unsupported wire version 2"),
    "missing field": (_wire_with(tx_bytes=...), r"tx_bytes must be a non-negative integer, got None"),
    "negative": (_wire_with(rx_bytes=-1), r"rx_bytes must be a non-negative integer, got -1"),
    "bool for int": (_wire_with(tx_requests=True), r"tx_requests must be a non-negative integer"),
    "source": (_wire_with(source="http"), r"source must be 'mp' or 'ring'"),
    "error kind": (_wire_with(errors={"Not Found": 1}), r"bad error kind 'Not Found'"),
    "agent": (_wire_with(agent=""), r"agent must not be empty"),
    "alive": (_wire_with(writer_alive="yes"), r"writer_alive must be a boolean or null"),
}


@pytest.mark.parametrize("case", sorted(BAD_WIRE))
def test_bad_wire_sample_is_refused_clearly(case: str) -> None:
    raw, message = BAD_WIRE[case]
    with pytest.raises(ValueError, match=message):
        NixlSample.from_wire(raw)


@pytest.mark.parametrize(
    ("hist", "message"),
    [
        ({"bounds_us": [1, 2], "counts": [1, 0], "sum_us": 1, "count": 1}, r"expected 3 bucket counts"),
        ({"bounds_us": [2, 1], "counts": [0, 0, 0], "sum_us": 0, "count": 0}, r"strictly increasing"),
        ({"bounds_us": [1], "counts": [1, 1], "sum_us": 3, "count": 1}, r"count 1 differs from .* 2"),
        (
            {"bounds_us": [1], "counts": [0, -1], "sum_us": 0, "count": 0},
            r"counts\[1\] must be a non-negative",
        ),
        ({"bounds_us": "1", "counts": [0], "sum_us": 0, "count": 0}, r"bounds_us must be a list"),
    ],
)
def test_bad_wire_histogram_is_refused_clearly(hist: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        NixlSample.from_wire(_wire_with(xfer_time=hist))


def test_accumulator_le_buckets() -> None:
    acc = Accumulator((10.0, 100.0))
    for v in (0, 10, 11, 100, 101):
        acc.add(EVENT_TYPE_IDS["agent_xfer_time"], v)
    assert acc.histogram(EVENT_TYPE_IDS["agent_xfer_time"]) == Histogram((10.0, 100.0), (2, 2, 1), 222, 5)


# --- live NIXL 1.5.1 ------------------------------------------------------------------------------


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
