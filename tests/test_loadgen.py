"""The load generator's batches are what a collector sends (bench/loadgen.py builds them as
columns, without `encode_batch`, to keep its own CPU low beside the server it measures)."""

from __future__ import annotations

import random

import orjson
import pytest

from bench.loadgen import NS, RankSim, Sim, Topology
from flightdeck.records import Entry
from flightdeck.wire import decode_batch, encode_batch


def _sim(fault: str, fault_at_s: float) -> Sim:
    topo = Topology(16, 2, 3)
    topo.build()
    rng = random.Random(3)
    i = int(fault_at_s * 10)
    return Sim(
        job="lg",
        topo=topo,
        rate=10.0,
        interval_s=2.0,
        t0_ns=10**18,
        fault=fault,
        fault_rank=5,
        fault_index=i + (-i) % 3,
        groups_resend_s=60.0,
        ranks=[RankSim(r, rng.randrange(2_000_000)) for r in range(16)],
    )


def _wire(doc: object) -> object:
    return orjson.loads(orjson.dumps(doc))


@pytest.mark.parametrize("fault", ["hang", "mismatch"])
def test_batches_are_what_encode_batch_writes_and_follow_the_job(fault: str) -> None:
    sim = _sim(fault, 3.0)
    seen: dict[tuple[int, int], list[str]] = {}
    last: dict[tuple[int, int], Entry] = {}
    for k in range(1, 5):
        now = sim.t0_ns + k * 2 * NS
        for h in range(2):
            doc = _wire(sim.host_doc(h, now))
            batch = decode_batch(doc)
            # Re-encoding the decoded batch gives the same document: the generator's columns,
            # signature table and left-out columns are exactly the collector encoder's.
            assert _wire(encode_batch(batch)) == doc
            assert [s.rank for s in batch.snapshots] == list(range(8 * h, 8 * h + 8))
            for s in batch.snapshots:
                assert bool(s.groups) == (k == 1)  # groups go with the first snapshot only
                for e in s.entries:
                    seen.setdefault((s.rank, e.record_id), []).append(e.state)
                    last[(s.rank, e.record_id)] = e
                    assert e.time_created_ns <= now
    fi = sim.fault_index
    assert fi is not None
    # Each collective is shipped when it appears, and again when it completed after having been
    # shipped in flight; by the end only the fault's collective is still in flight, on every
    # rank that entered it (the hung rank 5 never does).
    entered = [r for r in range(16) if not (fault == "hang" and r == 5)]
    assert {key for key, st in seen.items() if st[-1] != "completed"} == {(r, fi) for r in entered}
    assert all(st in (["completed"], ["started", "completed"], ["started"]) for st in seen.values())
    assert {rid for r, rid in seen if r == 5} == set(range(fi + (fault == "mismatch")))
    assert {rid for r, rid in seen if r == 4} == set(range(fi + 1))
    # A mismatch: rank 5 enters that collective with other sizes than its peers.
    sizes = {r: last[(r, fi)].input_sizes for r in entered}
    odd = {r for r in entered if sizes[r] != sizes[4]}
    assert odd == ({5} if fault == "mismatch" else set())
    # Nothing new once every rank waits in the fault's collective.
    later = decode_batch(_wire(sim.host_doc(0, sim.t0_ns + 10 * 2 * NS)))
    assert all(not s.entries for s in later.snapshots)
