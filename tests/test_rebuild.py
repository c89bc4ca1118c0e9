"""A job's summaries rebuilt from the store (a restart, a takeover in a cluster) are what the live
fold had built: each rank with its own process groups, not every group of the job.

The data is the committed real gloo job `tp_pp_dp_healthy` (16 ranks; the world, tensor-,
pipeline- and data-parallel groups), through the real app and store.
"""

from __future__ import annotations

from flightdeck.analysis import RankSummary
from flightdeck.server.live import JobState
from flightdeck.wire import MEMBER_LISTS
from tests.support.clock import FakeClock
from tests.support.server_app import make_server
from tests.support.server_batches import scenario_snapshots

JOB = "tp_pp_dp_healthy"


def _groups(summaries: dict[int, RankSummary]) -> dict[int, dict[str, tuple[int, ...] | None]]:
    return {r: {n: g.ranks for n, g in s.groups.items()} for r, s in summaries.items()}


def test_a_rebuilt_rank_holds_its_own_groups_and_the_verdict_stays(
    database_url: str, clock: FakeClock
) -> None:
    server = make_server(database_url, clock)
    try:
        snaps = scenario_snapshots(JOB, JOB, live=True)
        clock.now_ns = max(s.snapshot_time_ns for s in snaps) + 1_000_000_000
        assert server.push(snaps).status_code == 200
        server.diagnose()
        (live,) = server.svc.live.jobs.values()
        assert live.summaries is not None and len(live.summaries) == 16
        live_groups = _groups(live.summaries)
        live_findings = server.job(JOB)["findings"]
    finally:
        server.svc.close()
    # Rank 0 is in the world, its TP pair, its PP pair and its DP group; rank 1 in the world,
    # the same TP pair and groups of its own: none holds the groups it is not in.
    assert set(live_groups[0]) == {"0", "1", "9", "17"}
    assert "1" in live_groups[1] and not {"9", "17"} & set(live_groups[1])
    assert sum(len(g) for g in live_groups.values()) < 16 * len({n for g in live_groups.values() for n in g})

    again = make_server(database_url, clock)
    try:
        js = again.svc.live.jobs[live.job_id] = JobState(job_id=live.job_id, name=JOB, attempt=0, dirty=True)
        again.diagnose()
        assert js.summaries is not None
        assert _groups(js.summaries) == live_groups
        # Member lists stay one object per group, shared by its members, and the one the job's
        # later batches bring (sent as runs: found by identity, not hashed at every batch).
        world = {id(s.groups["0"].ranks) for s in js.summaries.values()}
        assert world == {id(MEMBER_LISTS.expand(((0, 16, 1),)))}
        assert js.intern_members(MEMBER_LISTS.expand(((0, 16, 1),))) is js.summaries[0].groups["0"].ranks
        assert again.job(JOB)["findings"] == live_findings
    finally:
        again.svc.close()
