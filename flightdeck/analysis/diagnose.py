"""Cross-rank diagnosis: rank summaries in, findings out. Pure: no files, clock, env or database.

The order of the questions matters, because one fault causes others. A rank that sent a tensor of
the wrong size makes gloo abort the receiving rank, which then looks lost, and everybody else hangs;
the answer is the size mismatch by the sending rank. So mismatches are found first, then lost ranks,
then hangs, and each later finding that follows from an earlier one points back at it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from flightdeck.analysis import evidence
from flightdeck.analysis.config_skew import PeerJob, RankConfigRef, config_findings
from flightdeck.analysis.evidence import ClockSource
from flightdeck.analysis.findings import Finding, Options, Report
from flightdeck.analysis.p2p_gaps import link_stranded
from flightdeck.analysis.p2p_gaps import refine_hang as blame_p2p_gap
from flightdeck.analysis.progress import name_where
from flightdeck.analysis.rules.common import MAX_LISTED_MISSING, NS, _expected_ranks, _groups, missing_ranks
from flightdeck.analysis.rules.consequences import _link_consequences, _order
from flightdeck.analysis.rules.hang import _hang
from flightdeck.analysis.rules.lost import _lost, _per_host
from flightdeck.analysis.rules.mismatch import _mismatch, _pending_for
from flightdeck.analysis.rules.missing import _missing
from flightdeck.analysis.rules.p2p import _p2p
from flightdeck.analysis.rules.stragglers import SKEW_WINDOW, _stragglers
from flightdeck.analysis.rules.whereabouts import _where_culprits_are
from flightdeck.analysis.sizes import all_to_all_balance
from flightdeck.analysis.summary import RankSummary

# What this module exports: `diagnose` and the names other modules import from here (the rules
# live in `flightdeck.analysis.rules`, one module each).
__all__ = ["MAX_LISTED_MISSING", "NS", "SKEW_WINDOW", "Options", "diagnose", "missing_ranks"]


def diagnose(
    summaries: Sequence[RankSummary],
    *,
    now_ns: int,
    options: Options | None = None,
    world_size: int | None = None,
    job: str | None = None,
    peers: Sequence[PeerJob] = (),
    stragglers: bool = True,
    agreed: Mapping[str, tuple[int, int]] | None = None,
    clock: ClockSource | None = None,
) -> Report:
    """Diagnose one job (one attempt) from the latest summary of each rank it has.

    `peers`: other jobs, for the cross-job configuration rules (see `config_skew`).
    `agreed`: the previous diagnosis's `Report.agreed` of these same summaries, grown since
    (a live server's): the collectives it found in agreement are not compared again, so a
    diagnosis costs what arrived since the last one, not the whole history held.
    `stragglers=False` skips the arrival-skew analysis (no straggler findings, no
    `arrival_skew_s`): the costliest part on large jobs, which a live server runs less often.
    `clock`: where `now_ns` came from (see `evidence.ClockSource`); None infers "snapshot" or,
    when every rank's time is only its file's mtime, "file": then elapsed times are unknown, and
    what is claimed rests on what the dumps prove (`evidence`).
    """
    opts = options or Options()
    by_rank: dict[int, RankSummary] = {}
    for s in summaries:
        old = by_rank.get(s.rank)
        if old is None or (s.snapshot_time_ns or 0) >= (old.snapshot_time_ns or 0):
            by_rank[s.rank] = s
    groups = _groups(by_rank, world_size)
    expected = _expected_ranks(by_rank, world_size, groups)
    without, missing = missing_ranks(by_rank, expected)
    report = Report(
        expected_ranks=expected,
        with_dump=sorted(by_rank),
        without_dump=without,
        without_dump_count=missing,
        findings=[],
        job=job if job is not None else next((s.job for s in by_rank.values() if s.job), None),
        now_s=now_ns / NS,
    )
    ev = evidence.gather(by_rank, ((g.name, g.members) for g in groups), now_ns=now_ns, clock=clock)
    report.clock = ev.clock
    if not ev.elapsed_known:
        # Elapsed times are measured to the newest moment the dumps themselves recorded, never
        # to a copy's file time.
        now_ns = ev.now_ns
    for s in by_rank.values():
        report.warnings.extend(f"rank {s.rank}: {w}" for w in s.warnings)
    if not by_rank:
        report.findings.append(
            Finding(kind="undecided", detail="No usable dump: there is nothing to diagnose.")
        )
        return report

    findings: list[Finding] = []
    for g in groups:
        f, report.agreed[g.name] = _mismatch(g, by_rank, (agreed or {}).get(g.name))
        if f is None:
            f = all_to_all_balance(g.name, g.desc, g.members, by_rank)
        if f is not None:
            f.elapsed_s = _pending_for(g, f.collective_seq_id, by_rank, now_ns)
            # Where the culprit took the other path, from its agent's evidence when the snapshots
            # carry no entry frames (periodic ones do not).
            name_where(f, by_rank, now_ns, fresh_s=opts.stall_after_s)
            findings.append(f)
        findings.extend(_p2p(g, by_rank, now_ns, opts, ev.elapsed_known))
    findings.extend(_per_host(_lost(by_rank, now_ns, opts), by_rank))
    for g in groups:
        f = _hang(g, by_rank, without, missing, now_ns, opts, ev)
        if f is not None:
            findings.append(blame_p2p_gap(f, g.name, g.members, by_rank))
    if ev.positions_only:
        findings.extend(_where_culprits_are(findings, groups, by_rank))
    if without:
        findings.append(_missing(without, missing))
    roots = _link_consequences(findings)
    link_stranded(findings, roots, {g.name: g.members for g in groups}, by_rank)
    if stragglers:
        report.arrival_skew_s, slow = _stragglers(groups, by_rank, opts)
        if not findings:
            # A straggler is worth a finding on an otherwise healthy job; beside a fault it is noise.
            findings.extend(slow)
    _order(findings, roots)
    if not ev.elapsed_known:
        # Under file times only, elapsed times were measured to the newest moment the dumps
        # recorded: a lower bound that orders the findings (the older wait is the root cause),
        # never reported as how long anything waited.
        for f in findings:
            f.elapsed_s = None
    report.findings = findings
    if not report.findings and _nothing_compared(by_rank):
        report.findings.append(
            Finding(
                kind="undecided",
                detail="The dumps hold no collective entries (flight recorder off, TORCH_FR_BUFFER_SIZE=0, "
                "or dumped before the first collective): nothing can be decided.",
            )
        )
    # How the ranks are set up, after what they ran: context, never a consequence of either.
    report.findings.extend(
        config_findings(
            [RankConfigRef(s.rank, s.host, s.config) for s in by_rank.values() if s.config is not None],
            peers=peers,
        )
    )
    return report


def _nothing_compared(by_rank: dict[int, RankSummary]) -> bool:
    return all(not t.seqs and not t.p2p for s in by_rank.values() for t in s.tracks.values())
