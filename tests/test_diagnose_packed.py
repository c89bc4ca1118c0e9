"""The diagnosis of a live server's summaries (packed columns, interned member lists, cut to the
newest collectives) is the diagnosis of the same values held as plain arrays: the accessors the
hot paths use (`Column.first`/`last`/`find`, `GroupTrack.first_seq`/`last_seq`/`index_of`), the
members and tracks `_groups` works out once per group, and the evidence that reads the newest
recorded time only when some rank lacks its own snapshot time."""

from __future__ import annotations

import copy
import random
import statistics
from array import array
from collections import Counter, defaultdict
from dataclasses import replace

import orjson
import pytest

from bench.loadgen.job import NS, RankSim, Sim, Topology, parse_fault, plan_faults
from flightdeck.analysis import diagnose, evidence
from flightdeck.analysis.findings import Options
from flightdeck.analysis.frontier import group_frontiers
from flightdeck.analysis.packed import Column, Steps
from flightdeck.analysis.rules import stragglers as strag
from flightdeck.analysis.rules.common import _groups, _present
from flightdeck.analysis.summary import GroupTrack, RankSummary
from flightdeck.server.live.fold import fold_snapshot
from flightdeck.server.live.state import JobState
from flightdeck.wire import decode_batch

T0 = 1_780_000_000 * NS


def _live(
    faults: list[str],
    *,
    slow: int | None = None,
    kinds: int = 3,
    rounds: int = 10,
    max_seqs: int = 40,
    max_times: int = 512,
) -> list[dict[int, RankSummary]]:
    """The summaries a live server holds of a loadgen job (64 ranks on 8 hosts, `kinds` kinds of
    groups, tracks cut to `max_seqs` collectives, enqueue times to `max_times`), after each 2 s
    round of snapshots from the fourth; `slow`: a rank that enters every collective 40 ms late."""
    topo = Topology(64, 8, kinds)
    topo.build()
    rng = random.Random(5)
    planned = plan_faults([parse_fault(f) for f in faults], T0, 10.0, kinds, 64)
    sim = Sim("packed", topo, 10.0, 2.0, T0, 60.0, faults=planned)
    sim.ranks = [RankSim(r, rng.randrange(2_000_000) + (40_000_000 if r == slow else 0)) for r in range(64)]
    js = JobState(job_id=1, name="packed", attempt=0, world_size=64, summaries={})
    out = []
    for k in range(1, rounds + 1):
        for h in range(topo.hosts):
            for snap in decode_batch(orjson.loads(orjson.dumps(sim.host_doc(h, T0 + k * 2 * NS)))).snapshots:
                fold_snapshot(js, snap, max_seqs=max_seqs, max_times=max_times)
        if k >= 4:
            assert js.summaries is not None
            out.append(copy.deepcopy(js.summaries))
    return out


def _plain(by_rank: dict[int, RankSummary]) -> dict[int, RankSummary]:
    """The same summaries with every column a plain `array('q')` (and member lists not shared)."""
    out = {}
    for r, s in by_rank.items():
        tracks = {
            name: replace(
                t,
                seqs=array("q", t.seqs),
                fps=array("q", t.fps),
                created_ns=array("q", t.created_ns),
                op_ids=array("q", t.op_ids),
            )
            for name, t in s.tracks.items()
        }
        groups = {
            name: replace(g, ranks=None if g.ranks is None else tuple(list(g.ranks)))
            for name, g in s.groups.items()
        }
        out[r] = replace(s, tracks=tracks, groups=groups)
    return out


#: name -> (faults, slow rank, group kinds, the finding kinds the diagnoses make)
SCENARIOS: dict[str, tuple[list[str], int | None, int, set[str]]] = {
    "healthy": ([], None, 3, set()),
    "hang": (["hang@8:rank=5"], None, 3, {"hang"}),
    "mismatch": (["mismatch@8:rank=7:for=4"], None, 3, {"size_mismatch", "hang"}),
    # Only the world group: a rank late in every one of its collectives is a straggler.
    "straggler": ([], 3, 1, {"straggler"}),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_packed_and_plain_summaries_give_the_same_diagnosis(name: str) -> None:
    faults, slow, kinds_of_groups, expected = SCENARIOS[name]
    agreed_packed = agreed_plain = None
    kinds: set[str] = set()
    for by_rank in _live(faults, slow=slow, kinds=kinds_of_groups):
        assert any(isinstance(t.seqs, Column) for s in by_rank.values() for t in s.tracks.values())
        plain = _plain(by_rank)
        now = max(s.snapshot_time_ns or 0 for s in by_rank.values()) + 20 * NS
        for stragglers in (True, False):
            # Incremental, as a live server diagnoses (only what arrived since is compared).
            a = diagnose(
                list(by_rank.values()), now_ns=now, world_size=64, stragglers=stragglers, agreed=agreed_packed
            )
            b = diagnose(
                list(plain.values()), now_ns=now, world_size=64, stragglers=stragglers, agreed=agreed_plain
            )
            assert a.to_json() == b.to_json() and a.agreed == b.agreed
            kinds |= {f.kind for f in a.findings}
        agreed_packed, agreed_plain = a.agreed, b.agreed
        assert group_frontiers(by_rank.values()) == group_frontiers(plain.values())
    assert kinds == expected


def _reference_stragglers(
    by_rank: dict[int, RankSummary],
) -> tuple[dict[str, list[float]], int, list[tuple[int, float, float]]]:
    """The arrival-skew analysis written plainly, a value at a time through `index_of` and
    `created_at`: (skews by group, collectives compared, (rank, share, median lag) of the three
    ranks most often last)."""
    skews: dict[str, list[float]] = {}
    last: Counter[int] = Counter()
    lags: defaultdict[int, list[float]] = defaultdict(list)
    samples = 0
    for g in _groups(by_rank, 64):
        tracks = g.held
        if len(tracks) < 2 or len(tracks) < len(g.members):
            continue
        timed = [t.timed_from for t in tracks.values()]
        lo = max(t.first_seq for t in tracks.values())
        hi = min(t.last_seq for t in tracks.values())
        if None in timed or hi < lo:
            continue
        lo = max([lo, hi - strag.SKEW_WINDOW + 1, *(f for f in timed if f is not None)])
        if hi < lo:
            continue
        rows: dict[int, list[int]] = {}
        for r, t in tracks.items():
            positions = [t.index_of(seq) for seq in range(lo, hi + 1)]
            times = [None if i is None else t.created_at(i) for i in positions]
            if None in times:
                break
            rows[r] = [x for x in times if x is not None]
        else:
            skews[g.name] = []
            for k in range(hi - lo + 1):
                column = {r: row[k] for r, row in rows.items()}
                first, latest = min(column.values()), max(column.values())
                last[next(r for r, x in column.items() if x == latest)] += 1
                skews[g.name].append((latest - first) / NS)
                for r, x in column.items():
                    lags[r].append((x - first) / NS)
            samples += hi - lo + 1
    top = [(r, n / samples, statistics.median(lags[r])) for r, n in last.most_common(3)]
    return skews, samples, top


@pytest.mark.parametrize(
    ("kinds", "max_seqs", "max_times"), [(1, 40, 512), (1, 400, 512), (1, 400, 100), (3, 400, 512)]
)
@pytest.mark.parametrize("chunk", [1, 200, strag._CHUNK])
def test_arrival_skew_and_stragglers_are_those_of_a_plain_computation(
    kinds: int, max_seqs: int, max_times: int, chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a live server's packed tracks (their enqueue times decoded in bulk, compared a few
    columns at a time: `chunk` values), the skews and the straggler are those worked out one
    value at a time, float for float."""
    monkeypatch.setattr(strag, "_CHUNK", chunk)
    opts = Options()
    found = 0
    for by_rank in _live([], slow=3, kinds=kinds, rounds=16, max_seqs=max_seqs, max_times=max_times)[-3:]:
        skews, slow = strag._stragglers(_groups(by_rank, 64), by_rank, opts)
        want_skews, samples, top = _reference_stragglers(by_rank)
        assert skews == want_skews and samples > 0
        want = [
            (r, lag)
            for r, share, lag in top
            if share >= opts.straggler_min_share and lag >= opts.straggler_min_lag_s
        ]
        if samples < opts.straggler_min_samples:
            want = []
        assert [(f.culprit_ranks[0], f.elapsed_s) for f in slow] == want
        assert all(f" of {samples} recent collectives" in f.detail for f in slow)
        found += len(slow)
        assert top[0][0] == 3
    # Rank 3, 40 ms late in every collective: last at each of the world group's (with more kinds
    # of groups, at each of its own host's and so on: under the share a finding needs).
    assert found if kinds == 1 else not found


def test_track_accessors_read_what_the_plain_arrays_hold() -> None:
    by_rank = _live(["hang@8:rank=5"])[-1]
    plain = _plain(by_rank)
    checked = 0
    for r, s in by_rank.items():
        for name, t in s.tracks.items():
            p = plain[r].tracks[name]
            assert (t.first_seq, t.last_seq) == (p.first_seq, p.last_seq)
            if not p.seqs:
                continue
            for seq in range(p.seqs[0] - 3, p.seqs[-1] + 4):
                assert t.index_of(seq) == p.index_of(seq)
                checked += 1
    assert checked > 1000
    empty = GroupTrack(seqs=Steps([]))
    assert (empty.first_seq, empty.last_seq, empty.index_of(3)) == (0, 0, None)


def test_find_first_and_last_follow_the_summary_writes_of_a_seqs_column() -> None:
    # What a track's seqs undergo: appends, packing after each snapshot, a late older collective
    # inserted where it belongs, the server's cut of the oldest.
    rng = random.Random(11)
    for _ in range(30):
        ref: list[int] = []
        col = Steps([])
        v = rng.randrange(0, 50)
        for step in range(400):
            op = rng.random()
            if op < 0.8:
                v += 1 if rng.random() < 0.9 else rng.randrange(2, 9)
                ref.append(v)
                col.append(v)
                if rng.random() < 0.2:
                    col.flush(rng.choice([0, 16]))
            elif op < 0.9 and len(ref) > 1:
                gaps = [x for x in range(ref[0] + 1, ref[-1]) if x not in ref]
                if gaps:
                    x = rng.choice(gaps)
                    i = sum(1 for y in ref if y < x)
                    ref.insert(i, x)
                    col.insert(i, x)
            else:
                cut = rng.randrange(0, len(ref) + 1)
                del ref[:cut]
                del col[:cut]
            if step % 20 == 0 or step == 399:
                assert col.first(-1) == (ref[0] if ref else -1)
                assert col.last(-1) == (ref[-1] if ref else -1)
                lo, hi = (ref[0], ref[-1]) if ref else (0, 3)
                for x in range(lo - 2, hi + 3):
                    assert col.find(x) == (ref.index(x) if x in ref else None)


def test_groups_work_out_the_present_members_and_held_tracks_of_each_group() -> None:
    by_rank = _live([])[-1]
    del by_rank[9]  # a member without a summary
    for g in _groups(by_rank, 64):
        assert list(g.present) == _present(g.members, by_rank)
        assert dict(g.held) == {
            r: t for r in g.present if (t := by_rank[r].tracks.get(g.name)) is not None and t.seqs
        }
    plain = _plain(by_rank)
    assert [(g.name, g.desc, list(g.members)) for g in _groups(by_rank, 64)] == [
        (g.name, g.desc, list(g.members)) for g in _groups(plain, 64)
    ]


def test_the_newest_recorded_time_is_worked_out_where_a_rank_lacks_its_own_snapshot_time() -> None:
    by_rank = _live(["hang@8:rank=5"])[-1]
    groups = [(g.name, g.members) for g in _groups(by_rank, 64)]
    now = max(s.snapshot_time_ns or 0 for s in by_rank.values()) + 20 * NS
    newest = max(evidence.recorded_ns(s) for s in by_rank.values())
    timed = evidence.gather(by_rank, groups, now_ns=now, clock=None)
    assert timed.clock == "snapshot" and timed.recorded_ns == 0  # nothing reads it
    by_rank[5] = replace(by_rank[5], snapshot_time_ns=None)
    untimed = evidence.gather(by_rank, groups, now_ns=now, clock="given")
    assert untimed.recorded_ns == newest > 0
    files = {r: replace(s, snapshot_time_from_file=True) for r, s in by_rank.items()}
    on_files = evidence.gather(files, groups, now_ns=now, clock=None)
    assert on_files.clock == "file" and on_files.recorded_ns == on_files.now_ns == newest
    assert (timed.floors, timed.early) == (untimed.floors, untimed.early) == (on_files.floors, on_files.early)
