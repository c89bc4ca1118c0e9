"""A live server keeps the enqueue times of each track's newest collectives only
(`enqueue_times_kept`, `fold.bound_track`): the times held stay aligned with the newest sequence
ids through cuts, re-sent entries and late older snapshots, the diagnosis finds what it finds
with every time kept, and a restart's rebuild holds what the fold held."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from flightdeck.analysis import RankSummary, diagnose
from flightdeck.analysis.frontier import group_frontiers
from flightdeck.analysis.summary import GroupTrack, summarize
from flightdeck.readers.fr.merge import merge
from flightdeck.records import Entry, GroupInfo, RankDump
from flightdeck.server.live.fold import TIMES_SLACK, fold_snapshot
from flightdeck.server.live.state import JobState
from flightdeck.server.settings import ServerSettings
from flightdeck.wire import Snapshot, decode_batch, encode_batch, snapshot_from_dump
from tests.support.clock import FakeClock
from tests.support.server_app import make_server
from tests.support.server_batches import make_batch, scenario_dumps

MS = 1_000_000
T0 = 1_800_000_000 * 1_000_000_000
KEPT = ServerSettings().enqueue_times_kept


def _template() -> list[Entry]:
    """rank 0's default-group collectives of the real healthy_4 job (ops, sizes, stacks)."""
    dump = merge(scenario_dumps("healthy_4")[0])
    return [e for e in dump.entries if e.group == "0" and not e.is_p2p]


TPL = _template()


def created(rank: int, seq: int, late_rank: int | None) -> int:
    """When `rank` enqueued collective `seq`: 1 ms apart, each rank a few µs after the one before,
    `late_rank` (a straggler) 20 ms after the others."""
    return T0 + seq * MS + rank * 3_000 + (20 * MS if rank == late_rank else 0)


def entries(rank: int, seqs: range, *, late_rank: int | None = None) -> list[Entry]:
    """Collectives `seqs` of one rank (record id = seq - 1), real entries re-numbered and timed."""
    out = []
    for seq in seqs:
        t = created(rank, seq, late_rank)
        out.append(
            replace(
                TPL[seq % len(TPL)],
                record_id=seq - 1,
                collective_seq_id=seq,
                op_id=seq,
                state="completed",
                retired=True,
                time_created_ns=t,
                time_started_ns=t + 10_000,
                time_completed_ns=t + 200_000,
                duration_ms=0.2,
            )
        )
    return out


def snap(rank: int, world: int, es: list[Entry], t_ns: int) -> Snapshot:
    """A periodic snapshot of `rank` holding `es`, as the agent ships it."""
    return snapshot_from_dump(dump(rank, world, es, t_ns), job="win")


def dump(rank: int, world: int, es: list[Entry], t_ns: int) -> RankDump:
    """A periodic dump of `rank` holding `es`."""
    return RankDump(
        rank=rank,
        source="test",
        job="win",
        world_size=world,
        host=f"node-{rank}",
        pid=100 + rank,
        backend="gloo",
        version="2.10",
        snapshot_time_ns=t_ns,
        kind="periodic",
        interval_s=1.0,
        groups={"0": GroupInfo("0", "default_pg", tuple(range(world)))},
        entries=es,
    )


def fold_all(snaps: list[Snapshot], *, max_seqs: int = 8192, max_times: int = KEPT) -> dict[int, RankSummary]:
    """The summaries the live fold makes of these snapshots, through the wire, in this order."""
    doc = json.loads(json.dumps(encode_batch(make_batch(snaps))))
    js = JobState(job_id=1, name="win", attempt=0, summaries={})
    for s in decode_batch(doc).snapshots:
        fold_snapshot(js, s, max_seqs=max_seqs, max_times=max_times)
    assert js.summaries is not None
    return js.summaries


def rounds(world: int, last: int, per_round: int, late_rank: int | None = None) -> list[RankDump]:
    """Each rank's dumps of collectives 1..last, `per_round` new ones each round."""
    out = []
    for k, first in enumerate(range(1, last + 1, per_round)):
        seqs = range(first, min(first + per_round, last + 1))
        out += [
            dump(r, world, entries(r, seqs, late_rank=late_rank), T0 + (k + 1) * 10**9) for r in range(world)
        ]
    return out


def snaps_of(dumps: list[RankDump]) -> list[Snapshot]:
    """The snapshots the agent ships of these dumps."""
    return [snapshot_from_dump(d, job="win") for d in dumps]


def assert_aligned(bounded: GroupTrack, full: GroupTrack, kept: int) -> None:
    """`bounded` holds `full`'s collectives and the times of the newest `kept` of them (up to
    `TIMES_SLACK` more, between two cuts)."""
    assert list(bounded.seqs) == list(full.seqs)
    assert list(bounded.fps) == list(full.fps)
    n = len(bounded.created_ns)
    assert min(kept, len(full.seqs)) <= n <= min(kept + TIMES_SLACK, len(full.seqs))
    assert list(bounded.created_ns) == list(full.created_ns)[len(full.created_ns) - n :]
    off = len(full.seqs) - n
    for i in (0, off - 1, off, len(full.seqs) - 1):
        if 0 <= i < off:
            assert bounded.created_at(i) is None
        elif i >= off:
            assert bounded.created_at(i) == full.created_ns[i]
    assert bounded.timed_from == (full.seqs[off] if n else None)


def test_times_are_kept_for_the_newest_collectives_only() -> None:
    summaries = fold_all(snaps_of(rounds(2, 2000, 400)))
    for r, s in summaries.items():
        t = s.tracks["0"]
        assert len(t.seqs) == 2000 and len(t.created_ns) == KEPT
        off = 2000 - KEPT
        assert t.timed_from == off + 1
        assert t.created_at(off - 1) is None
        assert [t.created_at(i) for i in range(off, 2000)] == [
            created(r, q, None) for q in range(off + 1, 2001)
        ]
        assert t.created_between(off - 1, 2000) is None
        assert list(t.created_between(off, off + 3) or ()) == [
            created(r, q, None) for q in (off + 1, off + 2, off + 3)
        ]


def test_times_stay_aligned_through_cuts_resends_and_late_older_snapshots() -> None:
    # Rank 0's ring as snapshots would bring it: rounds with a gap (seqs 100, 700, 1750 and 2100), the
    # in-flight collectives re-sent with a new state (and, once, a new enqueue time: another dump
    # file), then a late snapshot with the missing ones, one inside the times kept, one older, one older than the track holds.
    world, cap, kept = 1, 1800, 300
    seqs = [q for q in range(1, 2201) if q not in (100, 700, 1750, 2100)]
    snaps = []
    for k, first in enumerate(range(0, len(seqs), 250)):
        mine = seqs[first : first + 250]
        es = entries(0, range(mine[0], mine[-1] + 1))
        es = [e for e in es if e.collective_seq_id in mine]
        es[-1] = replace(es[-1], state="started", retired=False, time_completed_ns=None)
        snaps.append(snap(0, world, es, T0 + (k + 1) * 10**9))
        # The in-flight one re-sent completed; a held one re-sent with a moved time, one whose
        # time is kept and one whose time is not.
        old = [
            e for e in entries(0, range(max(1, mine[0] - 400), mine[0] - 399)) if e.collective_seq_id in seqs
        ]
        again = [replace(e, time_created_ns=e.time_created_ns + 5) for e in old + es[-10:-9]] + [
            replace(es[-1], state="completed", retired=True, time_completed_ns=es[-1].time_created_ns + 1)
        ]
        snaps.append(snap(0, world, again, T0 + (k + 1) * 10**9 + 1))
    late = [e for e in entries(0, range(1, 2201)) if e.collective_seq_id in (100, 700, 1750, 2100)]
    snaps.append(snap(0, world, late, T0 + 2))  # an older snapshot, arriving last
    bounded = fold_all(snaps, max_seqs=cap, max_times=kept)[0].tracks["0"]
    full = fold_all(snaps, max_seqs=cap, max_times=cap)[0].tracks["0"]
    assert len(full.seqs) == cap and 2100 in list(full.seqs) and 2100 in list(full.seqs)[-kept:]
    assert_aligned(bounded, full, kept)
    # Every step of the way, not only at the end.
    for n in range(1, len(snaps) + 1):
        b = fold_all(snaps[:n], max_seqs=cap, max_times=kept)[0].tracks["0"]
        f = fold_all(snaps[:n], max_seqs=cap, max_times=cap)[0].tracks["0"]
        assert_aligned(b, f, kept)


def _report(summaries: dict[int, RankSummary]) -> dict[str, Any]:
    now_ns = max(s.snapshot_time_ns or 0 for s in summaries.values())
    doc = diagnose(list(summaries.values()), now_ns=now_ns, job="win").to_json()
    assert isinstance(doc, dict)
    return doc


def test_a_straggler_is_found_alike_with_and_without_the_bound() -> None:
    # 8 ranks x 2,000 collectives, rank 5 enqueuing 20 ms after the others; each rank's newest
    # snapshot 100 collectives behind the one before it (snapshots of one round, spread).
    world = 8
    dumps = rounds(world, 1600, 400, late_rank=5)
    dumps += [
        dump(r, world, entries(r, range(1601, 2001 - 30 * r), late_rank=5), T0 + 9 * 10**9)
        for r in range(world)
    ]
    snaps = snaps_of(dumps)
    bounded, full = fold_all(snaps), fold_all(snaps, max_times=8192)
    assert len(bounded[0].tracks["0"].created_ns) == KEPT < len(full[0].tracks["0"].created_ns)
    want = _report(full)
    assert [f["kind"] for f in want["findings"]] == ["straggler"], want["findings"]
    assert want["findings"][0]["culprit_ranks"] == [5]
    assert _report(bounded) == want
    # And as `flightdeck analyze` finds it, keeping every time (no bound offline).
    offline = {r: summarize(merge([d for d in dumps if d.rank == r])) for r in range(world)}
    assert len(offline[0].tracks["0"].created_ns) == 2000
    assert _report(offline)["findings"] == want["findings"]
    # The frontier gauge reads the collective after the slowest rank's newest: kept.
    assert group_frontiers(bounded.values()) == group_frontiers(full.values())


def test_ranks_far_apart_are_compared_over_the_times_all_of_them_kept() -> None:
    # Rank 1 1,000 collectives ahead of rank 0: the straggler check still compares the newest
    # collectives both hold times for, rather than none.
    world = 2
    snaps = [snap(0, world, entries(0, range(1, 1001), late_rank=0), T0 + 10**9)]
    snaps.append(snap(1, world, entries(1, range(1, 2001), late_rank=0), T0 + 10**9))
    doc = _report(fold_all(snaps, max_times=1100))
    assert [f["culprit_ranks"] for f in doc["findings"] if f["kind"] == "straggler"] == [[0]]
    # The frontier gauge wants rank 1's time of collective 1001, not kept with 512: it gives the
    # oldest time kept (collective 1489's), which collective 1001 is at least as old as.
    bounded = fold_all(snaps)
    assert bounded[1].tracks["0"].timed_from == 1489
    assert group_frontiers(fold_all(snaps, max_times=8192).values()) == {"0": (created(1, 1001, 0), 1000)}
    assert group_frontiers(bounded.values()) == {"0": (created(1, 1489, 0), 1000)}


def test_a_restart_rebuilds_the_state_the_fold_held(tmp_path: object) -> None:
    # Through a real server on SQLite: the tracks folded as snapshots came, cut to
    # max_summary_seqs and their times to enqueue_times_kept; a restarted server's rebuild from
    # the store holds the same values.
    url = f"sqlite:///{tmp_path}/flightdeck.db"
    clock = FakeClock(T0 + 10 * 10**9)
    limits = {"max_summary_seqs": 1200, "enqueue_times_kept": 300}
    snaps = snaps_of(rounds(4, 1600, 400))
    first = make_server(url, clock, **limits)
    try:
        for k in range(0, len(snaps), 4):
            first.push(snaps[k : k + 4])
            first.diagnose()
        folded = _tracks(first)
    finally:
        first.svc.close()
    second = make_server(url, clock, **limits)
    try:
        second.diagnose()
        rebuilt = _tracks(second)
    finally:
        second.svc.close()
    assert sorted(folded) == [0, 1, 2, 3]
    for r, (seqs, _, times, _, _) in folded.items():
        assert len(seqs) == 1200 and len(times) == 300, r
        assert times == [created(r, q, None) for q in range(1301, 1601)]
    assert rebuilt == folded


def _tracks(server: object) -> dict[int, tuple[list[int], list[int], list[int], list[int], list[int]]]:
    """Each rank's default-group track of the job `win`: seqs, fps, times, op ids, tail seqs."""
    jobs = server.svc.live.jobs.values()  # type: ignore[attr-defined]
    js = next(j for j in jobs if j.name == "win")
    assert js.summaries
    out = {}
    for r, s in js.summaries.items():
        t = s.tracks["0"]
        out[r] = (
            list(t.seqs),
            list(t.fps),
            list(t.created_ns),
            list(t.op_ids),
            [e.collective_seq_id for e in t.tail],
        )
    return out
