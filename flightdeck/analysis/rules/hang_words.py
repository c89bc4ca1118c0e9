"""The words of a hang finding: what `hang._hang` decided (which case, at which collective, who
holds it up and who waits), told the way an on-call engineer reads it."""

from __future__ import annotations

from typing import Literal

from flightdeck.analysis.frames import innermost_user_frame
from flightdeck.analysis.rules.common import NS, _fmt_ranks, _Group, _group_label, _main_stack, _sizes
from flightdeck.analysis.summary import RankSummary
from flightdeck.records import Entry

#: Which hang `_hang` found: the culprits were not seen entering it (their data is stale), never
#: entered it, left no dump; it finished on some members only; some members never started it on
#: the device; some members left it before the last one arrived; or every member is in it.
HangCase = Literal["not_seen", "never_entered", "no_dump", "state_mismatch", "not_started", "left", "all_in"]

_UNKNOWN_WAIT = "an unknown time (only file times date the dumps)"


def waited_words(elapsed: float, *, elapsed_known: bool, positional: bool) -> str:
    """How long the ranks have waited: measured, unknown (the positions alone show the hang), or
    at least as long as the newest time the dumps recorded."""
    if elapsed_known:
        return f"{elapsed:.1f} s"
    if positional:
        return _UNKNOWN_WAIT
    return f"at least {elapsed:.1f} s (by the newest time recorded in the dumps)"


def hang_detail(
    case: HangCase,
    g: _Group,
    seq: int,
    first: Entry,
    waited: str,
    culprits: list[int],
    waiting: list[int],
    by_rank: dict[int, RankSummary],
    *,
    missing_total: int,
    finished_here: list[int],
    gap: float,
) -> str:
    """The finding's text for `case` at (`g`, `seq`), where `first` is the stuck entry that began
    first; `missing_total` (no_dump): how many ranks left no dump; `finished_here`
    (state_mismatch): the members it finished on; `gap` (left): how long after the culprits the
    last member arrived, in seconds."""
    label = _group_label(g)
    what = f"{first.op} {_sizes(first.input_sizes)} {','.join(first.input_dtypes)}".rstrip()
    if case == "not_seen":
        one = len(culprits) == 1
        return (
            f"Hang in {label} at collective_seq_id {seq} ({what}): {_fmt_ranks(waiting)} "
            f"{'has' if len(waiting) == 1 else 'have'} waited {waited}; {_fmt_ranks(culprits, by_rank)} "
            f"{'was' if one else 'were'} not seen entering it: {'its' if one else 'their'} last snapshots "
            "predate it (the process stopped or died, or its host or link is down)."
        )
    if case == "never_entered":
        return (
            f"Hang in {label} at collective_seq_id {seq} ({what}): {_fmt_ranks(culprits, by_rank)} never "
            f"entered it; {_fmt_ranks(waiting)} {'has' if len(waiting) == 1 else 'have'} waited {waited}."
        )
    if case == "no_dump":
        return (
            f"Hang in {label} at collective_seq_id {seq} ({what}): every rank with a dump entered it and "
            f"has waited {waited}; {_fmt_ranks(culprits, total=missing_total)} left no dump and must be "
            "the one missing."
        )
    if case == "state_mismatch":
        return (
            f"State mismatch in {label} at collective_seq_id {seq} ({what}): finished on "
            f"{_fmt_ranks(finished_here)} but still pending on {_fmt_ranks(waiting)} after {waited}."
        )
    if case == "not_started":
        return (
            f"Hang in {label} at collective_seq_id {seq} ({what}): all member ranks entered it, but "
            f"{_fmt_ranks(culprits, by_rank)} never started it on the device while the others did; "
            f"waited {waited}."
        )
    if case == "left":
        left, late = culprits, waiting
        one = len(left) == 1
        return (
            f"Hang in {label} at collective_seq_id {seq} ({what}): every member entered it, but "
            f"{_fmt_ranks(late)} arrived {gap:.1f} s after {_fmt_ranks(left, by_rank)} and it still did "
            f"not finish: {'it is' if one else 'they are'} no longer in it (stopped, died or killed "
            f"inside it, or {'its' if one else 'their'} link is down)."
        )
    return (
        f"Hang in {label} at collective_seq_id {seq} ({what}): all {len(waiting)} member ranks "
        f"entered it and none finished in {waited}. No rank is behind in this group: either "
        "the ranks disagree on what this collective is, or the transport between them is stuck."
    )


def gone_quiet_words(gone: list[int], by_rank: dict[int, RankSummary], now_ns: int) -> str:
    """Why waiting ranks that went silent with the culprits are named with them (`_gone_quiet`)."""
    quiet_s = min((now_ns - (by_rank[r].snapshot_time_ns or now_ns)) / NS for r in gone)
    return (
        f" {_fmt_ranks(gone, by_rank).capitalize()} entered it too but {'has' if len(gone) == 1 else 'have'} "
        f"sent nothing for {quiet_s:.1f} s while the others kept reporting (the process stopped, or its "
        "host or link is down), so it is named with the culprits."
    )


def culprit_words(group: str, seq: int, culprit: int, cs: RankSummary, last_e: Entry | None) -> str:
    """What the first culprit's own data adds: NCCL's counters, where it is instead of (`group`,
    `seq`), the line of user code its main thread is in, how it exited. `last_e`: its last entry."""
    words = ""
    # NCCL's counters confirm where the culprit stopped (gloo's say the same as its entries).
    st = cs.pg_status.get(group) if cs.backend and "nccl" in cs.backend else None
    if st is not None:
        words += f" Its dump's pg_status for this group: last enqueued {st[0]}, last completed {st[2]}."
    if last_e is not None and (last_e.group != group or last_e.collective_seq_id < seq):
        words += (
            f" {_fmt_ranks([culprit]).capitalize()} is instead at {last_e.op} (group "
            f"{last_e.group}, collective_seq_id {last_e.collective_seq_id}, "
            f"{'finished' if last_e.finished else 'unfinished'})."
        )
    main = _main_stack(cs)
    if main and cs.kind != "final":
        # Taken while the others waited: where the culprit is stuck instead (a data loader, I/O):
        # the line of the user's code, not the library call it is blocked in (`queue.get`).
        top = innermost_user_frame(main) or main[0]
        words += f" Its main thread is in {top.name} ({top.filename.rsplit('/', 1)[-1]}:{top.line})."
    if cs.kind == "final":
        words += (
            f" It then exited with {cs.exception}." if cs.exception else " It then exited without an error."
        )
    return words
