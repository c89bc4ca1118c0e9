"""The NIXL `prometheus_mp` store reader (`flightdeck/readers/nixl_mp.py`) on the committed
store files of NIXL 1.5.1, and what it and the ring consumer refuse: bad stores, FIFOs, files
they may not open."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flightdeck.collector.nixl_consumer import OwnerFinder, RingDirectory
from flightdeck.readers.nixl import DEFAULT_BUCKET_BOUNDS_US, NixlAccessError, NixlFormatError
from flightdeck.readers.nixl_mp import read_mp_dir, read_mp_store
from tests.support.nixl_fixtures import DATA, EXPECTED, copy_fixture, patch_struct, snapshot, ticking_clock


def test_fifo_named_like_an_mp_store_is_refused_without_blocking(tmp_path: Path) -> None:
    mp = copy_fixture("mp-1.5.1", tmp_path)
    os.mkfifo(mp / "nixl.999.1.0.mmap")
    samples, failures = read_mp_dir(mp, host="h")
    assert samples and [str(f) for f in failures] == [
        f"{mp / 'nixl.999.1.0.mmap'}: not a regular file; not opened"
    ]


MP = next((DATA / "mp-1.5.1").glob("nixl.*.0.mmap")).read_bytes()


BAD_MP: dict[str, tuple[bytes, str]] = {
    "wrong magic": (
        patch_struct(MP, "<Q", 0, 0x1122334455667788),
        r"magic 0x1122334455667788, expected 0x3153504d4c58494e",
    ),
    "schema version 2": (patch_struct(MP, "<I", 8, 2), r"unsupported prometheus_mp schema version 2"),
    "short": (MP[:6000], r"size 6000 bytes, expected 6800"),
    "long": (MP + b"\0", r"size 6801 bytes, expected 6800"),
    "slot count": (patch_struct(MP, "<I", 12, 22), r"slot count 22, expected 21"),
    "bucket count": (patch_struct(MP, "<Q", 40, 40), r"bucket count 40 outside 1..32"),
    "bounds not increasing": (
        patch_struct(MP, "<d", 496 + 8, 5.0),
        r"bucket bounds are not finite and increasing",
    ),
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
