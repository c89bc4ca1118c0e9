"""Progress digests (flightdeck/digest.py) and the board they fold into (flightdeck/analysis/board.py),
on the committed real dumps: what a digest says of a rank, its wire form and its checks, and the
stall rule read from the board."""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest

from flightdeck.analysis.board import Board, progress_of
from flightdeck.digest import (
    MAX_CELLS,
    DigestError,
    GroupProgress,
    RankDigest,
    decode_digests,
    encode_digests,
)
from flightdeck.records import RankDump
from tests.support.server_batches import scenario_dumps

NS = 1_000_000_000


def digest(d: RankDump, job: str = "job") -> RankDigest:
    """A rank's digest from one real dump."""
    assert d.snapshot_time_ns is not None
    return RankDigest(job, 0, d.rank, d.world_size, d.snapshot_time_ns, progress_of(d.entries))


def periodic(name: str) -> list[RankDump]:
    """Each rank's newest periodic dump of a scenario (the job as it ran, before its end)."""
    return [[d for d in ds if d.kind == "periodic"][-1] for ds in scenario_dumps(name).values()]


def board_of(dumps: list[RankDump]) -> Board:
    """A board holding the digests of `dumps`, each sent as it was taken."""
    b = Board()
    for d in sorted(dumps, key=lambda d: d.snapshot_time_ns or 0):
        doc = json.loads(json.dumps(encode_digests("h", d.snapshot_time_ns or 0, [digest(d)])))
        for block in decode_digests(doc).blocks:
            b.fold(block)
    return b


@pytest.mark.parametrize("name", ["healthy_4", "subgroup_hang", "tp_pp_dp_hang", "wrapped", "straggler"])
def test_progress_agrees_with_torch_pg_status(name: str) -> None:
    """torch's own pg_status (last enqueued, started, completed per group) says where a rank
    finished what a digest says, for every group whose ring counts its ops as pg_status does
    (pg_status also counts point-to-point ops, and tp_pp_dp's pipeline groups count ops the ring
    does not hold)."""
    checked = 0
    for dumps in scenario_dumps(name).values():
        for d in dumps:
            p2p = {e.group for e in d.entries if e.is_p2p}
            for p in progress_of(d.entries):
                status = d.pg_status.get(p.group)
                if status is None or p.group in p2p or status[0] != p.entered:
                    continue
                assert p.finished == status[2], (d.rank, d.kind, p)
                checked += 1
    assert checked >= len(scenario_dumps(name))


def test_a_waiting_rank_says_what_it_waits_in_and_since_when() -> None:
    dumps = {d.rank: d for d in periodic("subgroup_hang")}
    by_group = {p.group: p for p in progress_of(dumps[2].entries)}
    # Rank 2 entered pair23's all_reduce 5 and never finished it; rank 3 never entered it.
    assert (by_group["2"].entered, by_group["2"].finished) == (5, 4)
    stuck = next(e for e in dumps[2].entries if e.group == "2" and e.collective_seq_id == 5)
    assert by_group["2"].open_since_ns == stuck.time_created_ns
    rank3 = {p.group: (p.entered, p.finished, p.open_since_ns) for p in progress_of(dumps[3].entries)}
    assert rank3["2"] == (4, 4, 0)


def test_wire_round_trip_on_real_dumps() -> None:
    dumps = periodic("tp_pp_dp_hang") + periodic("subgroup_hang")
    digests = [digest(d, job=f"job-{len(d.pg_status)}") for d in dumps]
    sent = max(x.time_ns for x in digests) + 3 * NS
    doc = json.loads(json.dumps(encode_digests("gpu-7", sent, digests)))
    req = decode_digests(doc)
    assert req.host == "gpu-7" and req.sent_ns == sent and req.ranks == len(dumps)
    back: dict[tuple[str, int], dict[str, tuple[int, int, int]]] = {}
    for b in req.blocks:
        k = 0
        for rank, t, n in zip(b.rank, b.time_ns, b.n, strict=True):
            cells = {}
            for c in range(k, k + n):
                cells[b.groups[b.g[c]]] = (b.entered[c], b.finished[c], b.open_since_ns[c])
            k += n
            back[(b.job, rank)] = cells
            # Snapshot times travel as ms before sent_ns.
            orig = next(x for x in digests if (x.job, x.rank) == (b.job, rank))
            assert 0 <= t - orig.time_ns < 1_000_000
    for x in digests:
        got = back[(x.job, x.rank)]
        for p in x.groups:
            e, f, since = got[p.group]
            assert (e, f) == (p.entered, p.finished)
            if p.open_since_ns:
                assert abs(since - p.open_since_ns) < 2_000_000  # ms on the wire
            else:
                assert since == 0


def _doc(**block: Any) -> dict[str, Any]:
    b = {
        "job": "j", "attempt": 0, "world_size": 4, "groups": ["0"], "rank": [0, 1], "age_ms": [5, 5],
        "n": [1, 1], "g": [0, 0], "e": [7, 6], "d": [1, 0], "w": [3000, -1], "k": [-1, -1], "h": [0, 0],
        **block,
    }  # fmt: skip
    return {"v": 1, "host": "h", "sent_ns": 1_800_000_000 * NS, "jobs": [b]}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"rank": [0, 4]}, "jobs[0].rank[1]: 4 is not an integer in [0, 3]"),
        ({"rank": [1, 1]}, "a rank is listed twice"),
        ({"g": [0, 1]}, "jobs[0].g[1]: 1 is not an integer in [0, 0]"),
        ({"d": [8, 0]}, "d > e"),
        ({"e": [7, True]}, "jobs[0].e[1]: True is not an integer"),
        ({"w": [-2, -1]}, "jobs[0].w[0]"),
        ({"n": [1, 2]}, "sum(n) = 3"),
        ({"age_ms": [5]}, "differ in length"),
        ({"groups": ["bad\x1bname"]}, "control character"),
        ({"job": ""}, "jobs[0].job: must not be empty"),
        ({"world_size": 0}, "world_size"),
        ({"attempt": -1}, "attempt"),
    ],
)
def test_bad_values_are_refused_with_the_value_named(change: dict[str, Any], says: str) -> None:
    with pytest.raises(DigestError) as err:
        decode_digests(_doc(**change))
    assert says in str(err.value)


def test_bad_documents_and_oversized_claims_are_refused() -> None:
    good = _doc()
    assert decode_digests(good).ranks == 2
    for doc, says in [
        ([], "JSON object"),
        ({**good, "v": 2}, "not supported"),
        ({**good, "host": 5}, "host"),
        ({**good, "sent_ns": -1}, "sent_ns"),
        ({**good, "jobs": [good["jobs"][0]] * 65}, "at most 64"),
    ]:
        with pytest.raises(DigestError, match=says):
            decode_digests(doc)
    # Cells are counted before they are built: a claim of more than MAX_CELLS is refused whole.
    ranks, n = MAX_CELLS // 4096 + 1, 4096
    cells = ranks * n
    big = _doc(
        world_size=None, rank=list(range(ranks)), age_ms=[0] * ranks, n=[n] * ranks, g=[0] * cells,
        e=[1] * cells, d=[0] * cells, w=[-1] * cells, k=[-1] * cells, h=[0] * cells,
    )  # fmt: skip
    with pytest.raises(DigestError, match="cells"):
        decode_digests(big)


def test_board_finds_the_real_hang_and_its_culprit() -> None:
    """subgroup_hang: rank 3 skipped pair23's all_reduce 5 (the committed scenario's expected
    verdict); rank 2 waits in it, ranks 0 and 1 then wait in the default group's next collective."""
    stalls = {s.group: s for s in board_of(periodic("subgroup_hang")).stalls(min_wait_s=2.0)}
    pair = stalls["2"]
    assert (pair.seq, pair.culprits, pair.waiting) == (5, (3,), (2,))
    assert pair.waited_s > 5.0
    world = stalls["0"]
    assert (world.seq, world.culprits, world.waiting) == (13, (2, 3), (0, 1))
    # Under the threshold the same board says nothing.
    assert board_of(periodic("subgroup_hang")).stalls(min_wait_s=60.0) == []


@pytest.mark.parametrize("name", ["healthy_4", "tp_pp_dp_healthy", "coalesced_healthy"])
def test_board_of_a_healthy_job_has_no_stall(name: str) -> None:
    dumps = [d for ds in scenario_dumps(name).values() for d in ds]
    assert board_of(dumps).stalls(min_wait_s=1.0) == []


def _arrays(b: Board) -> dict[str, tuple[array[int], ...]]:
    return {n: (g.rank, g.entered, g.finished, g.since, g.seen) for n, g in sorted(b.groups.items())}


def test_fold_is_idempotent_and_order_free() -> None:
    """A digest folded twice, or an older one after a newer (a collector re-sending, two
    replicas), leaves the board as it was."""
    snaps = [d for ds in scenario_dumps("subgroup_hang").values() for d in ds if d.kind != "final"]
    snaps.sort(key=lambda d: d.snapshot_time_ns or 0)
    once = Board()
    for d in snaps:
        once.fold(decode_digests(encode_digests("h", d.snapshot_time_ns or 0, [digest(d)])).blocks[0])
    again = Board()
    for d in snaps + list(reversed(snaps)) + snaps:
        again.fold(decode_digests(encode_digests("h", d.snapshot_time_ns or 0, [digest(d)])).blocks[0])
    assert _arrays(once) == _arrays(again)
    assert once.newest_ns == again.newest_ns


def test_a_stall_is_aged_as_of_the_newest_digest_and_counted_by_the_waiters_own() -> None:
    """Its age is as of the job's newest digest (the server's clock ages nothing), so that two
    groups' stalls compare: pair23's all_reduce (group 2) was entered before the default group's
    collective 13, and is the older. Whether it counts is the waiters' own wait as of their own
    snapshot."""
    dumps = periodic("subgroup_hang")
    b = board_of(dumps)
    newest = max(d.snapshot_time_ns or 0 for d in dumps)
    stalls = {s.group: s for s in b.stalls(min_wait_s=0)}
    for g, seq in (("2", 5), ("0", 13)):
        opened = [
            (e.time_created_ns, d.snapshot_time_ns or 0)
            for d in dumps
            for e in d.entries
            if e.group == g and e.collective_seq_id == seq and not e.finished
        ]
        assert abs(stalls[g].age_s - (newest - min(c for c, _ in opened)) / NS) < 0.002  # ms on the wire
        assert abs(stalls[g].waited_s - max(t - c for c, t in opened) / NS) < 0.002
    assert stalls["2"].age_s > stalls["0"].age_s
    assert {s.group: s.age_s for s in b.stalls(min_wait_s=0)} == {g: s.age_s for g, s in stalls.items()}


def test_a_late_digest_is_no_stall() -> None:
    """Rank 0's digest comes a minute late (its collector behind on its queue): it was inside
    collective 8 for 10 ms when taken. Rank 1 has gone on since. No member has waited 5 s as of
    its own snapshot: no stall, though the digest is a minute older than the newest."""
    t = 1_800_000_000 * NS
    late = RankDigest("job", 0, 0, 2, t, (GroupProgress("0", 8, 7, t - 10_000_000),))
    ahead = RankDigest("job", 0, 1, 2, t + 60 * NS, (GroupProgress("0", 9, 8, t + 60 * NS - 5_000_000),))
    b = Board()
    for d in (ahead, late):
        b.fold(decode_digests(encode_digests("h", d.time_ns, [d])).blocks[0])
    assert b.stalls(min_wait_s=5.0) == []
    (st,) = b.stalls(min_wait_s=0.0)
    assert (st.seq, st.waiting, st.culprits) == (8, (0,), ()) and st.age_s > 59


def test_span_fingerprints_find_the_silent_mismatch_and_agree_when_healthy() -> None:
    """dtype_same_bytes: rank 2's collective 14 had another dtype of the same size (gloo took it):
    its span 0 fingerprint differs; the healthy scenarios' spans agree (all_to_all's uneven
    splits are left out of the signature, as the analysis leaves them out)."""
    (m,) = board_of([ds[-1] for ds in scenario_dumps("dtype_same_bytes").values()]).mismatches()
    assert (m.group, m.span, m.ranks, m.agreeing) == ("0", 0, (2,), 3)
    assert list(m.seqs) == list(range(1, 17))
    for name in ("healthy_4", "a2a_uneven", "coalesced_healthy", "straggler"):
        assert board_of([ds[-1] for ds in scenario_dumps(name).values()]).mismatches() == [], name


def test_a_span_is_decided_once() -> None:
    b = board_of([ds[-1] for ds in scenario_dumps("dtype_same_bytes").values()])
    assert len(b.mismatches()) == 1
    assert b.mismatches() == []
