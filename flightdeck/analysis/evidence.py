"""What the dumps prove by themselves: where every member must have been, and what time it was.

Dumps of one job are rarely taken at one moment. An agent snapshots each rank on its own timer; a
user's script dumps rank after rank (4,096 ranks take about a minute); PyTorch dumps at exit right
after the last collective returns, while gloo still sets completion flags asynchronously. And the
file times a user's copy carries (scp, `kubectl cp`, object storage, git) say when it was copied,
not when it was written. Two facts hold whatever the clock says:

- A member that finished collective K of a group and then recorded anything else completed K, and
  a collective completes only once every member entered it. So every member entered K and every
  collective of the group before it: no hang at or before K can be claimed, and a member whose dump
  stops before K was simply dumped earlier (`Evidence.floor`).
- The newest timestamp recorded in any dump is a moment every dump of the job had reached or
  passed: a lower bound of "now" that no copy can move (`Evidence.now_ns` under a file clock).

Where "now" came from is the `ClockSource`: a snapshot time the agent wrote into its sidecar,
a `--now` the user gave, or only a file time, under which elapsed times are unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from flightdeck.analysis.summary import GroupTrack, RankSummary
from flightdeck.records import Entry

NS = 1_000_000_000

#: "snapshot": the ranks' snapshot times (agent sidecars, a live server's data); "given": the
#: caller said when to judge (`flightdeck analyze --now`); "file": only file modification times.
ClockSource = Literal["snapshot", "given", "file"]

CLOCK_WORDS: dict[str, str] = {
    "snapshot": "snapshot times (written by the agent beside each dump)",
    "given": "the time given with --now",
    "file": "file times only (set by whatever copied the files): elapsed times are unknown",
}


def infer_clock(summaries: Iterable[RankSummary]) -> ClockSource:
    """ "file" when no rank's time comes from anything but its file's modification time."""
    timed = [s for s in summaries if s.snapshot_time_ns is not None]
    return "file" if timed and all(s.snapshot_time_from_file for s in timed) else "snapshot"


def trusted_time(s: RankSummary) -> int | None:
    """The rank's snapshot time when it is one (from a sidecar or a live feed), not a file time."""
    return None if s.snapshot_time_from_file else s.snapshot_time_ns


def newest_record(s: RankSummary) -> int:
    """The highest record id the rank holds (-1 when none): its most recent op of any group."""
    best = -1
    for t in s.tracks.values():
        if t.tail:
            best = max(best, t.tail[-1].record_id)
        if t.p2p:
            best = max(best, t.p2p[-1].record_id)
    return best


def went_on_after(s: RankSummary, e: Entry) -> bool:
    """Whether the rank recorded anything after `e` (in any group)."""
    return newest_record(s) > e.record_id


def recorded_ns(s: RankSummary) -> int:
    """The newest time the rank's own entries record (created, started or completed)."""
    newest = 0
    for t in s.tracks.values():
        if t.created_ns:  # the newest collective's (the times kept are the newest ones')
            newest = max(newest, t.created_ns[-1])
        for e in (*t.tail, *t.p2p):
            newest = max(newest, e.time_created_ns, e.time_started_ns or 0, e.time_completed_ns or 0)
    return newest


def _track_floor(track: GroupTrack, top: int) -> int:
    """The highest seq of the track's group its rank finished and then went on from (0 when
    none); `top` is the rank's `newest_record`."""
    n = len(track.seqs)
    if not n:
        return 0
    for e in reversed(track.tail):
        if (e.state == "completed" or e.retired) and e.record_id < top:  # `Entry.finished`, inlined
            return e.collective_seq_id
    # Older than the kept tail: each was followed by the tail's entries.
    older = n - len(track.tail)
    return track.seqs[older - 1] if older > 0 else 0


@dataclass(frozen=True, slots=True)
class Evidence:
    """Per diagnosis: the clock, and what the dumps prove whatever it says."""

    clock: ClockSource
    #: The moment elapsed times are measured to: the caller's `now` unless the clock is only file
    #: times, then the newest timestamp recorded in any dump.
    now_ns: int
    #: group -> the highest seq every member is proven to have entered.
    floors: Mapping[str, int] = field(default_factory=dict)
    #: Ranks whose dump stops before a floor of one of their groups: dumped earlier than that
    #: collective's completion, so what they did since is unknown in every group.
    early: frozenset[int] = frozenset()
    #: Whether no rank's time is a snapshot time (all are file times, whatever `clock` says):
    #: who entered what is then told by positions alone (a `--now` dates the job, not each rank).
    positions_only: bool = False
    #: The newest timestamp recorded in any dump (0 when none): a moment every dump reached.
    #: `gather` leaves it 0 where nothing reads it: every rank has its own snapshot time and
    #: the clock is not file times.
    recorded_ns: int = 0

    @property
    def elapsed_known(self) -> bool:
        """Whether `now_ns - t` is a real elapsed time (not one measured to a copy's file time)."""
        return self.clock != "file"

    def floor(self, group: str) -> int:
        """The highest seq of `group` every member entered (0: nothing proven)."""
        return self.floors.get(group, 0)

    def age_s(self, s: RankSummary, e: Entry) -> float:
        """How long `e` had been in flight when the rank's data was taken, at least: to its own
        snapshot time when that is one, else to the newest time recorded in the dumps (a dump's
        moment is unknown; a `--now` says when the job is judged, not when it was dumped). A
        collective seen pending in a dump taken right after it began proves nothing, however
        late the diagnosis runs."""
        at = trusted_time(s)
        if at is None:
            at = self.recorded_ns or self.now_ns
        return max(0.0, (at - e.time_created_ns) / NS)


def gather(
    by_rank: Mapping[int, RankSummary],
    groups: Iterable[tuple[str, Iterable[int]]],
    *,
    now_ns: int,
    clock: ClockSource | None,
) -> Evidence:
    """The evidence of one diagnosis: `groups` as (name, members); `clock` None infers it."""
    inferred = infer_clock(by_rank.values())
    source = clock or inferred
    floors: dict[str, int] = {}
    early: set[int] = set()
    tops = {r: newest_record(s) for r, s in by_rank.items()}
    get = by_rank.get
    for name, members in groups:
        # One pass over the members: (rank, summary, track) of those with a summary, and the floor.
        held: list[tuple[int, RankSummary, GroupTrack | None]] = []
        best = 0
        for r in members:
            s = get(r)
            if s is None:
                continue
            track = s.tracks.get(name)
            held.append((r, s, track))
            if track is not None:
                best = max(best, _track_floor(track, tops[r]))
        floors[name] = best
        if not best:
            continue  # nothing proven: no member is behind it (seqs are >= 0)
        for r, s, track in held:
            if track is not None and track.seqs:
                if track.last_seq < best:
                    early.add(r)
            elif not s.wrapped:
                early.add(r)  # holds none of the group's collectives, though all members entered some
    # The newest time recorded in any dump is needed only where a rank's age is measured without
    # its own snapshot time, or "now" is one under file times: worked out only then (it reads
    # every entry held).
    needed = source == "file" or any(trusted_time(s) is None for s in by_rank.values())
    recorded = max((recorded_ns(s) for s in by_rank.values()), default=0) if needed else 0
    judged = (recorded or now_ns) if source == "file" else now_ns
    return Evidence(source, judged, floors, frozenset(early), inferred == "file", recorded)
