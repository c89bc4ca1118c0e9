"""Which findings of a live diagnosis are stored (and so page): a state_mismatch must hold first."""

from __future__ import annotations

from flightdeck.analysis import Finding, Report
from flightdeck.analysis.live_findings import STATE_MISMATCH_HOLD_S, live_findings, settle_state_mismatches

NS = 1_000_000_000
T0 = 1_800_000_000 * NS


def _report(*findings: Finding) -> Report:
    return Report(
        expected_ranks=4,
        with_dump=[0, 1, 2, 3],
        without_dump=[],
        findings=list(findings),
        job="j",
        now_s=T0 / NS,
    )


def _mismatch(seq: int = 57) -> Finding:
    return Finding(
        kind="state_mismatch",
        detail="finished on rank 0 but still pending on ranks 1-3",
        process_group="0",
        collective_seq_id=seq,
        culprit_ranks=[1, 2, 3],
    )


def test_a_state_mismatch_is_stored_only_once_it_has_held() -> None:
    """The end of a long busy wait: rank 0 is seen finished before its peers' next snapshots. A
    state_mismatch gone at the next diagnosis is never stored; one that holds is, from then on."""
    since: dict[tuple[str | None, int | None], int] = {}
    report = _report(_mismatch())
    since, young = settle_state_mismatches(report, since, T0)
    assert live_findings(report, job_age_s=600, grace_s=5, unsettled=young) == []
    # A second later the peers' snapshots show it finished: nothing was ever opened.
    since, young = settle_state_mismatches(_report(), since, T0 + NS)
    assert since == {} and young == set()
    # A real one holds: stored once it has lasted STATE_MISMATCH_HOLD_S.
    for t in (2, 3, 3 + STATE_MISMATCH_HOLD_S):
        report = _report(_mismatch())
        since, young = settle_state_mismatches(report, since, T0 + int(t * NS))
        kept = live_findings(report, job_age_s=600, grace_s=5, unsettled=young)
        assert [f.kind for f in kept] == (["state_mismatch"] if t - 2 >= STATE_MISMATCH_HOLD_S else [])


def test_other_findings_are_not_held_back() -> None:
    hang = Finding(kind="hang", detail="rank 2 never entered it", process_group="0", collective_seq_id=12)
    report = _report(hang, _mismatch(seq=3))
    _since, young = settle_state_mismatches(report, {}, T0)
    kept = live_findings(report, job_age_s=600, grace_s=5, unsettled=young)
    assert [f.kind for f in kept] == ["hang"]
