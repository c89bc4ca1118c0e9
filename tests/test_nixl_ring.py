"""The NIXL ring reader (`flightdeck/readers/nixl_ring.py`) and the collector's ring consumer
(`RingConsumer`, `RingDirectory` and the owner lookup of `flightdeck/collector/nixl_consumer.py`) on
the committed ring files of NIXL 1.0.1, 1.1.0, 1.2.0, 1.3.2 and 1.5.1 (every ring layout: v1, v2
48-byte, v2 16-byte, v3, v4), and on a few rings built here from the layouts in
docs/nixl-telemetry.md, only for what a real run cannot provoke cheaply (dropped-event counts,
unknown event ids, garbage padding bytes)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import struct
from pathlib import Path

import pytest

from flightdeck.collector.nixl_consumer import OwnerFinder, RingConsumer, RingDirectory
from flightdeck.readers.nixl import (
    DEFAULT_BUCKET_BOUNDS_US,
    EVENT_TYPE_IDS,
    EVENT_TYPES,
    NixlFormatError,
    event_type_id,
)
from flightdeck.readers.nixl_ring import read_ring
from tests.support.nixl_fixtures import (
    DATA,
    EXPECTED,
    RING_RELEASES,
    build_ring,
    copy_fixture,
    delta,
    patch_struct,
    snapshot,
    ticking_clock,
)

# --- real ring files of every release (committed fixtures) -----------------------------------


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


RING = (DATA / "ring-1.5.1" / "initiator").read_bytes()


BAD_RINGS: dict[str, tuple[bytes, str]] = {
    "truncated header": (RING[:20], r"truncated NIXL ring header: 20 bytes, need 40"),
    "empty file": (b"", r"truncated NIXL ring header: 0 bytes"),
    "version 5": (
        patch_struct(RING, "<ii", 16, 5, 5),
        r"unsupported NIXL ring version 5 \(this reader knows",
    ),
    "version 0": (patch_struct(RING, "<ii", 16, 0, 0), r"unsupported NIXL ring version 0"),
    "capacity not a power of two": (
        patch_struct(RING, "<QQ", 24, 24, 23)[: 40 + 24 * 16],
        r"ring capacity 24 is not a power of two",
    ),
    "mask not capacity - 1": (patch_struct(RING, "<Q", 32, 7), r"ring mask 7 is not capacity − 1 = 31"),
    "shorter than capacity implies": (
        RING[:-16],
        r"536 bytes but version 4 with capacity 32 needs 552 bytes",
    ),
    "v2 size fits neither layout": (
        patch_struct(RING, "<ii", 16, 2, 2)[:-8],
        r"version 2 with capacity 32 needs 1576 or 552 bytes",
    ),
    "version differs from expected_version": (
        patch_struct(RING, "<i", 20, 3),
        r"ring version 4 but expected_version 3",
    ),
    # Positions are stored masked: past the capacity they are no ring's (904 phantom events were
    # read from this before), and such a read_pos must never be written back.
    "write_pos past the capacity": (
        patch_struct(RING, "<Q", 0, 32 + 904),
        r"ring write_pos 936 is outside the ring \(capacity 32\); refused",
    ),
    "read_pos past the capacity": (
        patch_struct(RING, "<Q", 8, 2**63 + 5),
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


def test_ring_directory_keeps_going_past_a_bad_file(tmp_path: Path) -> None:
    ring = copy_fixture("ring-1.5.1", tmp_path)
    (ring / "broken").write_bytes(RING[:10])
    samples, failures = RingDirectory(ring, host="h", owner_finder=OwnerFinder(tmp_path)).poll()
    assert sorted(s.agent for s in samples) == ["initiator", "target"]
    assert len(failures) == 1 and "broken" in str(failures[0])
    assert sorted(p.name for p in ring.iterdir()) == ["broken", "initiator", "target"]


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
