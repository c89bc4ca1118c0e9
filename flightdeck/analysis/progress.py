"""Busy or stuck: whether a rank the others wait for is still working, from its agent's evidence.

The hang rule (`diagnose`) finds the collective some ranks wait in and the culprits that never
entered it. Waiting alone does not tell a checkpoint save from a dead data loader; the culprit's
main thread does. Every agent snapshot carries `flightdeck.records.Progress`: when the thread
last made progress (CPU time growing, its stack changing, or disk I/O), sampled twice a second.

- **Busy** (progress seen within the last half of `stall_after_s` as of its latest sample, and
  less than `stall_after_s` before now): a `slow_rank` finding, a warning that pages nobody,
  naming where it is busy.
- **Stuck** (no progress for `stall_after_s`: asleep, blocked on a queue, a lock or a dead peer):
  the hang stands, and says where the thread is.
- **Slow too long**: still busy after the ceiling (`Options.slow_ceiling_s`, by default half the
  group's timeout): a hang, before torch's own timeout kills the job.
- In between (progress seen a little while ago, not yet `stall_after_s`): no verdict yet, for up to
  twice `stall_after_s` of waiting; after that slow (progress comes now and then), and a hang past
  the ceiling.

Culprits without evidence (torch's own dumps, older agents, evidence older than `stall_after_s`:
the process stopped) keep the plain rule: waiting `stall_after_s` is a hang. Pure: `now` is
passed in; nothing here reads a clock, a file or the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from flightdeck.analysis.findings import Finding, Options
from flightdeck.analysis.frames import innermost_user_frame, short_location
from flightdeck.analysis.summary import RankSummary
from flightdeck.records import Frame, Stack

NS = 1_000_000_000
#: A culprit whose latest sample saw progress within this share of `stall_after_s` is busy.
BUSY_WITHIN_SHARE = 0.5
#: A culprit neither busy nor stuck (progress seen, but a while ago) gets no verdict until the
#: others have waited this many `stall_after_s`; then it is slow (it keeps making progress now and
#: then: a loop that polls every few seconds), and a hang after the ceiling like any slow rank.
UNSURE_FOR = 2.0


@dataclass(frozen=True, slots=True)
class Activity:
    """What a rank's evidence says about its main thread, as of `now`."""

    rank: int
    #: "busy" (progressing), "stuck" (no progress for stall_after_s) or "unsure" (in between).
    verdict: str
    #: Seconds without progress, as of its latest sample.
    idle_s: float
    #: The innermost user frame of its main thread (None when none was sampled).
    where: Frame | None
    frames: Stack
    cpu_share: float | None


def activity(s: RankSummary, now_ns: int, stall_after_s: float) -> Activity | None:
    """The rank's activity from its evidence; None when it has none that speaks for `now`.

    Evidence older than `stall_after_s` says nothing about now (the process may be stopped, or its
    snapshots lost): the caller keeps its plain rule. A rank that exited has no main thread to
    judge.
    """
    p = s.progress
    if p is None or s.kind == "final":
        return None
    if (now_ns - p.sampled_ns) / NS > stall_after_s:
        return None
    last = p.active_ns if p.active_ns is not None else p.since_ns
    idle_s = max(0.0, (p.sampled_ns - last) / NS) if last is not None else 0.0
    if idle_s >= stall_after_s:
        verdict = "stuck"
    elif (
        idle_s < stall_after_s * BUSY_WITHIN_SHARE
        and last is not None
        and (now_ns - last) / NS < stall_after_s
    ):
        # Busy by its latest sample, and that progress recent enough as of now: a sample that was
        # delivered late says nothing about the seconds since (it may have blocked right after).
        verdict = "busy"
    else:
        verdict = "unsure"
    return Activity(s.rank, verdict, idle_s, innermost_user_frame(p.frames), p.frames, p.cpu_share)


def slow_ceiling_s(opts: Options, timeout_ms: int | None) -> tuple[float, str]:
    """(the ceiling in seconds, how it was chosen) for a group whose timeout is `timeout_ms`."""
    if opts.slow_ceiling_s is not None:
        return opts.slow_ceiling_s, "the configured ceiling"
    if timeout_ms:
        return timeout_ms / 2000, f"half the group's timeout of {timeout_ms / 1000:.0f} s"
    return opts.slow_ceiling_default_s, "the default ceiling (the group's timeout is unknown)"


def group_timeout_ms(group: str, members: list[int], by_rank: dict[int, RankSummary]) -> int | None:
    """The group's collective timeout as its ranks report it (entries first, then config reports)."""
    for r in members:
        s = by_rank.get(r)
        if s is None:
            continue
        track = s.tracks.get(group)
        for e in reversed(track.tail if track else []):
            if e.timeout_ms:
                return e.timeout_ms
        for g in s.config.groups if s.config else ():
            if g.name == group and g.timeout_ms:
                return g.timeout_ms
    return None


def refine_hang(
    finding: Finding,
    by_rank: dict[int, RankSummary],
    now_ns: int,
    opts: Options,
    *,
    failed: bool = False,
) -> Finding | None:
    """The hang finding as the culprits' evidence has it: unchanged (stuck, or no evidence) with
    where they are; a `slow_rank` finding (busy); None (no verdict yet).

    `failed`: a member already failed in the collective, which cannot complete any more.
    """
    if finding.kind != "hang" or not finding.culprit_ranks:
        return finding
    acts = [
        activity(s, now_ns, opts.stall_after_s) if (s := by_rank.get(r)) is not None else None
        for r in finding.culprit_ranks
    ]
    known = [a for a in acts if a is not None]
    if failed or len(known) < len(acts):
        _say_where(finding, known)
        _say_last_seen(finding, by_rank, now_ns)
        return finding
    if any(a.verdict == "stuck" for a in known):
        _say_where(finding, [a for a in known if a.verdict == "stuck"])
        return finding
    elapsed = finding.elapsed_s or 0.0
    ceiling, why = slow_ceiling_s(
        opts, group_timeout_ms(finding.process_group or "", finding.waiting_ranks, by_rank)
    )
    busy = _busy_words(known)
    if (
        elapsed < ceiling
        and elapsed < UNSURE_FOR * opts.stall_after_s
        and any(a.verdict == "unsure" for a in known)
    ):
        return None  # it may be about to be stuck: wait for its next samples
    if elapsed >= ceiling:
        finding.detail += (
            f" {busy[0].upper()}{busy[1:]}: still working, but it has kept the others waiting "
            f"{elapsed:.1f} s, longer than {why} ({ceiling:.0f} s): treated as hung before the "
            "group's timeout ends the job."
        )
        _say_where(finding, known, sentence=False)
        return finding
    first = known[0]
    waiting = finding.waiting_ranks
    what = f"{finding.op} (group {finding.process_group}, collective_seq_id {finding.collective_seq_id})"
    detail = (
        f"Slow rank: {busy}, for {elapsed:.1f} s so far; "
        f"{_ranks(waiting)} wait{'s' if len(waiting) == 1 else ''} in {what}. "
        f"Not a hang while it makes progress: it becomes one if it stops for {opts.stall_after_s:g} s "
        f"or is still busy after {ceiling:.0f} s ({why})."
    )
    return replace(
        finding,
        kind="slow_rank",
        detail=detail,
        culprit_frames=first.frames or finding.culprit_frames,
    )


def _say_last_seen(finding: Finding, by_rank: dict[int, RankSummary], now_ns: int) -> None:
    """A culprit whose evidence stopped (stopped or killed process, cut-off host) and that left no
    stack: name where its main thread was at its last sample, so that the finding has a code line."""
    name_where(finding, by_rank, now_ns, fresh_s=0.0)


def name_where(finding: Finding, by_rank: dict[int, RankSummary], now_ns: int, *, fresh_s: float) -> None:
    """Give a finding without culprit frames (periodic snapshots carry no entry frames) the first
    culprit's main-thread frames from its evidence: "is in" when sampled within `fresh_s`, else
    "was last seen in" with the age. Findings with frames, and culprits without evidence, are
    left as they are."""
    if finding.culprit_frames:
        return
    s = next((by_rank[r] for r in finding.culprit_ranks if r in by_rank), None)
    p = s.progress if s is not None else None
    if p is None or not p.frames:
        return
    finding.culprit_frames = p.frames
    where = short_location(innermost_user_frame(p.frames) or p.frames[0])
    age = max(0.0, (now_ns - p.sampled_ns) / NS)
    if age <= fresh_s:
        finding.detail += f" Its main thread is in {where}."
    else:
        finding.detail += (
            f" Its main thread was last seen in {where}, {age:.1f} s ago; nothing came from it since."
        )


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    shown = ", ".join(map(str, ranks[:8]))
    return f"ranks {shown}" + (f" (+{len(ranks) - 8} more)" if len(ranks) > 8 else "")


def _busy_words(acts: list[Activity]) -> str:
    parts = []
    for a in acts[:4]:
        where = f" in {short_location(a.where)}" if a.where is not None else ""
        cpu = f", {a.cpu_share:.0%} of a core" if a.cpu_share is not None else ""
        parts.append(f"rank {a.rank} is busy{where}{cpu}")
    more = f" (+{len(acts) - 4} more)" if len(acts) > 4 else ""
    return "; ".join(parts) + more


def _say_where(finding: Finding, acts: list[Activity], *, sentence: bool = True) -> None:
    """Name where the (first) culprit's main thread is, from its evidence, unless the finding has
    it from a stall snapshot already (fresher than an old entry's call site, which it replaces)."""
    a = next((x for x in acts if x.frames), None)
    if a is None or "Its main thread is in" in finding.detail:
        return
    finding.culprit_frames = a.frames
    if not sentence:
        return
    where = a.where or a.frames[0]
    idle = f", without progress for {a.idle_s:.1f} s" if a.verdict == "stuck" else ""
    finding.detail += f" Its main thread is in {short_location(where)}{idle}."
