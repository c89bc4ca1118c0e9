"""Which findings of a live diagnosis to store: a live job's picture is never finished.

The offline analyzer sees every rank's last snapshot and keeps every finding; the live server
(`flightdeck.server.live`) diagnoses a job while its ranks start, while their snapshots are on
their way and while the job goes down, so some findings are the normal state of that moment, or
may be refuted by the data still coming. Pure: a report in, the findings worth storing out.
"""

from __future__ import annotations

from flightdeck.analysis.findings import Finding, FindingKey, Report, finding_key

NS = 1_000_000_000

#: Findings that data still arriving could refute: not opened while a job's picture fills in
#: (`filling_in`). A mismatch between ranks already seen, or their configuration, stays true.
REFUTABLE_KINDS = frozenset({"hang", "slow_rank", "state_mismatch", "rank_lost", "missing_dump", "undecided"})


#: Seconds a state_mismatch must hold before it is stored (and pages). When a long wait ends (a
#: busy rank joins at last), the rank that left the collective may be snapshotted finished before
#: its peers' next snapshots, up to an interval and a push later, show it finished too: measured
#: once in four 3-minute busy runs, open for about a second. Two 1 s intervals cover that.
STATE_MISMATCH_HOLD_S = 3.0

MismatchKey = tuple[str | None, int | None]


def settle_state_mismatches(
    report: Report, since: dict[MismatchKey, int], now_ns: int, hold_s: float = STATE_MISMATCH_HOLD_S
) -> tuple[dict[MismatchKey, int], set[MismatchKey]]:
    """When each state_mismatch of `report` was first diagnosed (carried over from `since`), and
    which of them have not held for `hold_s` yet."""
    held: dict[MismatchKey, int] = {}
    for f in report.findings:
        if f.kind == "state_mismatch":
            key = (f.process_group, f.collective_seq_id)
            held[key] = since.get(key, now_ns)
    young = {k for k, t in held.items() if now_ns - t < hold_s * NS}
    return held, young


def live_findings(
    report: Report,
    *,
    job_age_s: float,
    grace_s: float,
    unsettled: set[MismatchKey] | None = None,
    filling_in: bool = False,
    open_keys: set[FindingKey] | None = None,
) -> list[Finding]:
    """The findings worth storing from a live diagnosis.

    A job whose ranks are still coming up has no dump from some of them, and no collective yet:
    `missing_dump` within the first `grace_s` and `undecided` are the normal state of a starting
    job, not findings (the offline analyzer, which sees a finished picture, keeps them). Neither is
    a state_mismatch in `unsettled` (`settle_state_mismatches`): it may be the peers' snapshots
    lagging the end of a collective. While the job's picture is `filling_in` (ranks still
    arriving, a collector catching up), a finding of `REFUTABLE_KINDS` is kept only if it is open
    already (`open_keys`): the data on its way could refute it. `consequence_of` indexes are
    renumbered to the kept list.
    """
    young = unsettled or set()
    held = open_keys or set()
    keep = [
        i
        for i, f in enumerate(report.findings)
        if f.kind != "undecided"
        and not (f.kind == "missing_dump" and job_age_s < grace_s)
        and not (f.kind == "state_mismatch" and (f.process_group, f.collective_seq_id) in young)
        and not (filling_in and f.kind in REFUTABLE_KINDS and finding_key(f) not in held)
    ]
    if len(keep) == len(report.findings):
        return report.findings
    new_index = {old: new for new, old in enumerate(keep)}
    out = []
    for i in keep:
        f = report.findings[i]
        if f.consequence_of is not None:
            f.consequence_of = new_index.get(f.consequence_of)
        out.append(f)
    return out
