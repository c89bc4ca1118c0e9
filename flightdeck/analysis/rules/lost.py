"""Lost ranks: ranks that stopped reporting while others went on, or died without a final
snapshot; the lost ranks of a host that went silent as a whole are one finding for that host."""

from __future__ import annotations

import bisect

from flightdeck.analysis import evidence
from flightdeck.analysis.findings import Finding, Options, entry_json
from flightdeck.analysis.rules.common import NS, _fmt_ranks, _last_entry, _main_stack, _refs, _silent, _sizes
from flightdeck.analysis.summary import RankSummary


def _lost(by_rank: dict[int, RankSummary], now_ns: int, opts: Options) -> list[Finding]:
    """Ranks that stopped reporting while others went on, or died without a final snapshot."""
    # File times say when a copy was made, not when a rank last reported: not evidence here.
    times = {r: t for r, s in by_rank.items() if (t := evidence.trusted_time(s)) is not None}
    if len(times) < 2:
        return []
    finals = {r for r, s in by_rank.items() if s.kind == "final"}
    # Sorted once: "how many ranks wrote later than t + threshold" is then a bisection, not a scan
    # of every rank per rank (quadratic: seconds per diagnosis at 4,096 ranks). Judged as of
    # `now_ns`: a live server judging late data sets it back to what every collector delivered,
    # and snapshots newer than that must not make the ranks behind a slower collector look lost.
    ordered = sorted(min(t, now_ns) for t in times.values())
    newest = ordered[-1]
    # A rank still snapshotting after the others' finals is alive (blocked, perhaps), not lost.
    last_final = max((times[f] for f in finals if f in times), default=None)
    lost: list[int] = []
    finals_missing: set[int] = set()
    reasons: dict[int, str] = {}
    for r, t in times.items():
        s = by_rank[r]
        if s.kind == "dump":
            continue  # a plain PyTorch dump says nothing about liveness
        interval = s.interval_s
        threshold_ns = int((opts.lost_after_intervals * interval if interval else opts.lost_after_s) * NS)
        # Ranks whose newest snapshot is more than the threshold after this one (never r itself).
        later = len(ordered) - bisect.bisect_right(ordered, t + threshold_ns)
        exited_before = last_final is None or t <= last_final
        if (
            s.kind != "final"
            and finals
            and exited_before
            # Silent as long as a lost rank, too: it may merely not have snapshotted since the
            # others exited, or its own final snapshot may still be on its way (written after the
            # others', or queued behind them on a busy collector).
            and _silent(s, now_ns, opts)
            and len(finals) + 1 >= 2
            and len(finals) >= len(by_rank) // 2
        ):
            lost.append(r)
            finals_missing.add(r)
            reasons[r] = "it left no final snapshot while the other ranks wrote theirs on exit"
        elif s.kind != "final" and later and later >= max(1, (len(times) - 1) // 2):
            lost.append(r)
            reasons[r] = f"its snapshots stopped {(newest - t) / NS:.1f} s before the others'"
    out: list[Finding] = []
    for r in sorted(lost):
        s = by_rank[r]
        last = _last_entry(s)
        # Where the rank was lost: the collective the others had reached, else its own last one.
        at = last
        where = ""
        if last is not None:
            where = (
                f" Its last recorded collective was {last.op} (group {last.group}, collective_seq_id "
                f"{last.collective_seq_id}, {'finished' if last.finished else 'unfinished'})."
            )
            others = (
                [
                    e
                    for r2, s2 in by_rank.items()
                    # Ranks outside the lost rank's last group (a subgroup) hold no track of it.
                    if r2 != r
                    and last.group in s2.tracks
                    and (e := s2.entry_at(last.group, s2.tracks[last.group].last_seq)) is not None
                ]
                if last.group
                else []
            )
            ahead = [e for e in others if e.collective_seq_id > last.collective_seq_id]
            if ahead:
                e0 = at = max(ahead, key=lambda e: e.collective_seq_id)
                reached = (
                    f" The other ranks had reached {e0.op} {_sizes(e0.input_sizes)} "
                    f"{','.join(e0.input_dtypes)} (collective_seq_id {e0.collective_seq_id})"
                )
                if r in finals_missing:
                    # Only what the snapshots show: no final one, so the process ended without
                    # its exit hook (a kill, a crash or an abort look the same from here).
                    where += (
                        f"{reached} when it died; the collectives in between completed, so it died inside that "
                        "one, without writing its final snapshot (killed, crashed or aborted: the snapshots "
                        "do not say which; its exit status or log does)."
                    )
                else:
                    # Silence is not death: a stopped process, a host or a link down look the same.
                    where += (
                        f"{reached} when its snapshots stopped; the collectives in between completed, so it "
                        "went silent in that one or just before it: it died or was stopped, or its host or "
                        "link is down."
                    )
        t = s.snapshot_time_ns or now_ns
        out.append(
            Finding(
                kind="rank_lost",
                detail=f"{_fmt_ranks([r], by_rank).capitalize()} is lost: {reasons[r]}.{where}",
                process_group=at.group if at else None,
                process_group_desc=s.group_desc(at.group) if at else "",
                collective_seq_id=at.collective_seq_id if at else None,
                op=at.op if at else None,
                culprit_ranks=[r],
                elapsed_s=max(0.0, (now_ns - t) / NS),
                culprits=_refs([r], by_rank),
                culprit_frames=_main_stack(s) or (last.frames if last else ()),
                culprit_last_entry=entry_json(last) if last else None,
            )
        )
    return out


def _per_host(lost: list[Finding], by_rank: dict[int, RankSummary]) -> list[Finding]:
    """Fold the lost ranks of a host that went silent as a whole into one finding for that host.

    Every rank of one host lost while ranks on other hosts go on points at the host (down, link
    cut, collector or processes stopped), not at N unrelated ranks; the on-call engineer should
    read "host X" first. Without a live host to compare with, nothing is folded.
    """
    if len(lost) < 2:
        return lost
    hosts: dict[str, list[int]] = {}
    for r, s in by_rank.items():
        if s.host:
            hosts.setdefault(s.host, []).append(r)
    by_culprit = {f.culprit_ranks[0]: f for f in lost if len(f.culprit_ranks) == 1}
    silent = [h for h, ranks in hosts.items() if len(ranks) >= 2 and all(r in by_culprit for r in ranks)]
    if not silent or len(silent) == len(hosts):
        return lost
    folded: set[int] = set()
    out: list[Finding] = []
    for host in sorted(silent):
        ranks = sorted(hosts[host])
        folded.update(ranks)
        first = by_culprit[ranks[0]]
        first.culprit_ranks = ranks
        first.culprits = _refs(ranks, by_rank)
        first.elapsed_s = min(by_culprit[r].elapsed_s or 0.0 for r in ranks)
        first.detail = (
            f"Host {host} went silent: all {len(ranks)} of its ranks ({', '.join(map(str, ranks))}) stopped "
            "reporting while the other hosts go on: the host is down, its network link is cut, or its "
            f"processes are stopped. {first.detail}"
        )
        out.append(first)
    return out + [f for f in lost if not set(f.culprit_ranks) & folded]
