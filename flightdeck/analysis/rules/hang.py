"""Hangs: the oldest collective of a group that is not finished on every member rank, who holds
it up, and whether the dumps show it (snapshot times, or under file times the positions alone)."""

from __future__ import annotations

from flightdeck.analysis import evidence
from flightdeck.analysis.evidence import Evidence
from flightdeck.analysis.findings import Finding, FindingKind, Options, entry_json
from flightdeck.analysis.progress import refine_hang as judge_progress
from flightdeck.analysis.rules.common import NS, _Group, _last_entry, _main_stack, _refs, _silent
from flightdeck.analysis.rules.hang_words import (
    HangCase,
    culprit_words,
    gone_quiet_words,
    hang_detail,
    waited_words,
)
from flightdeck.analysis.summary import RankSummary
from flightdeck.records import Entry


def _hang(
    g: _Group,
    by_rank: dict[int, RankSummary],
    without: list[int],
    missing: int,
    now_ns: int,
    opts: Options,
    ev: Evidence | None = None,
) -> Finding | None:
    """The oldest collective of the group that is not finished on every member rank.

    `without`: the ranks without a dump (bounded: see `missing_ranks`), `missing` how many in all.
    Never at or before the group's proven floor (`Evidence.floor`): every member entered those.
    Under a file clock the hang must show in the positions alone (`_positional`)."""
    ev = ev or Evidence("snapshot", now_ns)
    floor = ev.floor(g.name)
    last: dict[int, int] = {}
    held = g.held
    for r in g.present:
        track = held.get(r)
        if track is None:  # holds none of the group's collectives
            s = by_rank[r]
            if s.wrapped:
                continue  # its ring no longer holds this group: position unknown
            if floor and s.config is not None and s.config.fr_buffer_size == 0:
                # Every member entered the floor's collectives, yet this rank records none:
                # its flight recorder is off (TORCH_FR_BUFFER_SIZE=0), its position unknown.
                continue
            last[r] = 0
        else:
            last[r] = track.last_seq
    if not last or max(last.values()) == 0:
        return None
    low = min(last.values())
    high = max(last.values())
    if isinstance(g.members, range):
        missing_members = [r for r in without if r in g.members]
        # A world group (`range(expected)`) holds the ranks left off the bounded list too.
        missing_total = len(missing_members) + missing - len(without)
    else:
        absent = set(without)
        missing_members = [r for r in g.members if r in absent]
        missing_total = len(missing_members)
    if low < high:
        # Members behind the floor were dumped earlier: they entered everything up to it.
        seq = max(low, floor) + 1
        if seq > high:
            return None
        culprits = sorted(r for r, v in last.items() if v < seq)
    else:
        seq = high
        if seq <= floor:
            return None
        culprits = list(missing_members)
    if ev.positions_only:
        placed = _positional(g.name, seq, last, culprits, ev, by_rank, bool(missing_members))
        if placed is None:
            return None
        entered, stuck = placed
    else:
        # A culprit behind the floor (or dumped early in another group) was seen only before
        # what every member did since: its snapshot's time says nothing about this collective.
        behind = any((r in last and last[r] < floor) or r in ev.early for r in culprits)
        entered, stuck = _stuck_at(g.name, seq, last, culprits, by_rank, seen=not behind)
    # Members behind the floor took part in what lies between, and members dumped early in
    # another group (or snapshotted before this collective began) were not seen since: what is
    # stale is their data, not their position.
    began = min((e.time_created_ns for e in stuck.values()), default=None)
    stale = not ev.positions_only and any(
        (r in last and last[r] < floor)
        or r in ev.early
        or (began is not None and r in by_rank and not _newer_than(by_rank[r], began))
        for r in culprits
    )
    if not stuck and low < high and not ev.positions_only:
        # Every rank holding `seq` finished it, so the members behind did take part in it: what is
        # stale is their data (snapshots stopped: a cut link, a stopped or killed process), not their
        # position. The others wait in their oldest collective still in flight, or the one they
        # failed in; the stale members are the ones not seen entering it.
        later = _pending_seq(g.name, seq - 1, entered, by_rank)
        if later is not None:
            seq, stale = later, True
            culprits = sorted(r for r, v in last.items() if v < seq)
            entered, stuck = _stuck_at(g.name, seq, last, culprits, by_rank, seen=not behind)
    if not stuck or (stale and not _stale_shown(culprits, stuck, by_rank, ev, opts)):
        return None
    first = min(stuck.values(), key=lambda e: e.time_created_ns)
    elapsed = (now_ns - first.time_created_ns) / NS
    finished_here = [r for r in entered if r not in stuck]
    # Finished on some, pending on others: gloo sets completion flags asynchronously, so a rank
    # snapshotted right after the collective returned may still show it pending. Only a rank
    # whose own data shows it pending for stall_after is evidence of a stall.
    if (
        not culprits
        and finished_here
        and max(ev.age_s(by_rank[r], e) for r, e in stuck.items()) < opts.stall_after_s
    ):
        return None
    positional = bool(culprits) and not ev.elapsed_known
    # No need to wait out stall_after when a member already failed in it (exited with the error):
    # the collective cannot complete any more. But not before every culprit has been silent as
    # long as a lost rank: one merely between two snapshots would otherwise be named with the dead.
    failed = any(_failed_in(by_rank[r], e) for r, e in stuck.items()) and all(
        _silent(by_rank[c], now_ns, opts) for c in culprits if c in by_rank
    )
    if elapsed < opts.stall_after_s and not (culprits and failed) and not positional:
        return None
    waiting = sorted(stuck)
    gone = _gone_quiet(culprits, waiting, by_rank, now_ns, opts)
    if gone:
        culprits = sorted([*culprits, *gone])
        waiting = [r for r in waiting if r not in gone]
    kind: FindingKind = "hang"
    case: HangCase
    gap = 0.0
    if culprits and stale:
        case = "not_seen"
    elif culprits and low < high:
        case = "never_entered"
    elif culprits:
        case = "no_dump"
    elif finished_here:
        kind = "state_mismatch"
        case = "state_mismatch"
        culprits = waiting
    else:
        not_started = [r for r, e in stuck.items() if e.state == "scheduled"]
        started = [r for r, e in stuck.items() if e.state == "started"]
        if started and not_started:
            culprits = sorted(not_started)
            case = "not_started"
        elif left := _left_before_the_last(stuck, opts):
            # A collective completes soon after its last member arrives. One still unfinished
            # though its last member came stall_after later than some others: those others are no
            # longer in it (a rank killed or stopped inside it, as a dump shows it).
            late = [r for r in waiting if r not in left]
            gap = (max(e.time_created_ns for e in stuck.values()) - stuck[left[0]].time_created_ns) / NS
            culprits, waiting = left, late
            case = "left"
        else:
            case = "all_in"
    waited = waited_words(elapsed, elapsed_known=ev.elapsed_known, positional=positional)
    detail = hang_detail(
        case,
        g,
        seq,
        first,
        waited,
        culprits,
        waiting,
        by_rank,
        missing_total=missing_total,
        finished_here=finished_here,
        gap=gap,
    )
    if gone:
        detail += gone_quiet_words(gone, by_rank, now_ns)
    finding = Finding(
        kind=kind,
        detail=detail,
        process_group=g.name,
        process_group_desc=g.desc,
        collective_seq_id=seq,
        op=first.op,
        culprit_ranks=culprits,
        waiting_ranks=waiting,
        elapsed_s=elapsed,  # reported only when known: see `diagnose`
        culprits=_refs(culprits, by_rank),
        expected={
            "op": first.op,
            "input_sizes": [list(s) for s in first.input_sizes],
            "output_sizes": [list(s) for s in first.output_sizes],
            "input_dtypes": list(first.input_dtypes),
            "output_dtypes": list(first.output_dtypes),
        },
        waiting_frames=first.frames or _main_stack(by_rank[waiting[0]]),
    )
    if len(culprits) >= 1 and culprits[0] in by_rank:
        cs = by_rank[culprits[0]]
        last_e = _last_entry(cs)
        finding.culprit_frames = _main_stack(cs) or (last_e.frames if last_e else ())
        if last_e is not None:
            finding.culprit_last_entry = entry_json(last_e)
        finding.detail += culprit_words(g.name, seq, culprits[0], cs, last_e)
    # Busy or stuck, from the culprits' own evidence (flightdeck.analysis.progress).
    return judge_progress(finding, by_rank, now_ns, opts, failed=failed)


def _stale_shown(
    culprits: list[int], stuck: dict[int, Entry], by_rank: dict[int, RankSummary], ev: Evidence, opts: Options
) -> bool:
    """Whether culprits known only from older snapshots are shown to be missing, not merely
    snapshotted earlier than the ranks that wait: a waiting rank failed in the collective, or
    their snapshots stopped while the waiting ranks went on reporting (as long as makes a rank
    lost), or the waiting ranks' own snapshots show them waiting for stall_after. Snapshots of a
    healthy job taken at different moments show none of these, however late it is judged."""
    if any(_failed_in(by_rank[r], e) for r, e in stuck.items()):
        return True
    if max(ev.age_s(by_rank[r], e) for r, e in stuck.items()) >= opts.stall_after_s:
        return True
    newest = max((evidence.trusted_time(by_rank[r]) or 0) for r in stuck)

    def quiet(c: int) -> bool:
        s = by_rank.get(c)
        t = evidence.trusted_time(s) if s is not None else None
        if s is None or s.kind == "final" or t is None:
            return True
        threshold = opts.lost_after_intervals * s.interval_s if s.interval_s else opts.lost_after_s
        return (newest - t) / NS > threshold

    return all(quiet(c) for c in culprits)


def _positional(
    group: str,
    seq: int,
    last: dict[int, int],
    culprits: list[int],
    ev: Evidence,
    by_rank: dict[int, RankSummary],
    missing: bool,
) -> tuple[list[int], dict[int, Entry]] | None:
    """Under a file clock: the members that entered (group, seq) and those blocked in it, when
    the positions alone show a hang there; else None.

    Positions show one only when they are not explained by dumps taken at different moments: no
    rank's dump stops before the floor of one of its groups (it was dumped earlier, so the dumps
    were not taken together), the members that entered recorded nothing after it (they are blocked in it, or
    failed in it: gloo retires a failed collective too) and they are no fewer than the members
    not in it. Without culprits (every member entered) only the age the dumps themselves record
    can tell a stall, which the caller judges.
    """
    if culprits and ev.early:
        return None
    entered = sorted(r for r, v in last.items() if v >= seq)
    stuck: dict[int, Entry] = {}
    for r in entered:
        e = by_rank[r].entry_at(group, seq)
        if e is None:
            continue
        if not e.finished or (culprits and last[r] == seq and not evidence.went_on_after(by_rank[r], e)):
            stuck[r] = e
    if culprits and (len(stuck) < len(entered) or (len(stuck) < len(culprits) and not missing)):
        return None
    return entered, stuck


def _left_before_the_last(stuck: dict[int, Entry], opts: Options) -> list[int]:
    """The members of an unfinished collective that every member entered who had entered it
    stall_after before its last member did (none when that is all of them or none)."""
    last = max(e.time_created_ns for e in stuck.values())
    left = sorted(r for r, e in stuck.items() if (last - e.time_created_ns) / NS >= opts.stall_after_s)
    return left if len(left) < len(stuck) else []


def _gone_quiet(
    culprits: list[int], waiting: list[int], by_rank: dict[int, RankSummary], now_ns: int, opts: Options
) -> list[int]:
    """The waiting ranks that went silent with the culprits while other waiting ranks still report.

    A cut link or a dead host stops its ranks' snapshots at whatever moment: one rank of the host
    may have been seen entering the collective, its neighbour not. What the silent one does since
    is unknown, and it is stranded with the culprits, not waiting with the majority. Ranks that
    exited (final snapshot) are not silent in this sense: their last state is known.
    """
    if not culprits or not all(c in by_rank and _silent(by_rank[c], now_ns, opts) for c in culprits):
        return []
    gone = [r for r in waiting if by_rank[r].kind != "final" and _silent(by_rank[r], now_ns, opts)]
    return gone if len(gone) < len(waiting) else []


def _stuck_at(
    group: str,
    seq: int,
    last: dict[int, int],
    culprits: list[int],
    by_rank: dict[int, RankSummary],
    *,
    seen: bool = True,
) -> tuple[list[int], dict[int, Entry]]:
    """The members that entered (group, seq), and the entries of those still stuck in it.

    `seen=False`: the culprits' data is older than what every member did since (behind a floor),
    so no snapshot of theirs shows them not entering it."""
    entered = sorted(r for r, v in last.items() if v >= seq)
    stuck: dict[int, Entry] = {}
    for r in entered:
        e = by_rank[r].entry_at(group, seq)
        if e is None:
            continue
        # With a member that never entered, the collective cannot have succeeded anywhere: gloo marks
        # it retired when it fails (timeout, peer gone), which is not completion. Ranks that moved
        # past it (async ops) are the exception. "Never entered" needs a culprit snapshot taken after
        # the collective began (or its final one); an older one only says it is not known to have
        # entered, so then only a rank that failed in it (exited with an error there) is stuck.
        fresh = seen and all(_newer_than(by_rank[c], e.time_created_ns) for c in culprits if c in by_rank)
        if not e.finished or (culprits and last[r] == seq and (fresh or _failed_in(by_rank[r], e))):
            stuck[r] = e
    return entered, stuck


def _newer_than(s: RankSummary, t_ns: int) -> bool:
    """Whether the rank's data shows its state after `t_ns` (its final state always does)."""
    if s.snapshot_time_from_file:
        return s.kind == "final"
    return s.kind == "final" or s.snapshot_time_ns is None or s.snapshot_time_ns >= t_ns


def _failed_in(s: RankSummary, e: Entry) -> bool:
    """Whether the rank exited with an error inside `e`, its newest collective (gloo retires that too)."""
    return s.kind == "final" and bool(s.exception) and e is _last_entry(s) and e.state != "completed"


def _pending_seq(group: str, after: int, ranks: list[int], by_rank: dict[int, RankSummary]) -> int | None:
    """The oldest collective of `group` past `after` that one of `ranks` is in: unfinished, or the
    last one of a rank that exited with an error in it (gloo retires a failed collective too)."""
    found: list[int] = []
    for r in ranks:
        s = by_rank[r]
        track = s.tracks.get(group)
        if track is None or not track.tail:
            continue
        found.extend(
            e.collective_seq_id for e in track.tail if e.collective_seq_id > after and not e.finished
        )
        tip = track.tail[-1]
        if _failed_in(s, tip) and tip.collective_seq_id > after:
            found.append(tip.collective_seq_id)
    return min(found) if found else None
