"""`merge`: several snapshots of one rank (periodic, stall, final) as one `RankDump`."""

from __future__ import annotations

from dataclasses import replace

from flightdeck.records import Entry, GroupInfo, Progress, RankDump


def merge(dumps: list[RankDump]) -> RankDump:
    """Merge snapshots of one rank: union of entries by record id, the newest snapshot's state wins,
    frames and thread stacks kept from whichever snapshot had them."""
    if len(dumps) == 1:
        return dumps[0]
    ordered = sorted(dumps, key=lambda d: (d.snapshot_time_ns or 0, _KIND_RANK[d.kind]))
    latest = ordered[-1]
    by_id: dict[int, Entry] = {}
    for d in ordered:
        for e in d.entries:
            old = by_id.get(e.record_id)
            if old is not None and not e.frames and old.frames:
                e = replace(e, frames=old.frames)
            by_id[e.record_id] = e
    entries = [by_id[k] for k in sorted(by_id)]
    groups: dict[str, GroupInfo] = {}
    for d in ordered:
        for name, g in d.groups.items():
            prev = groups.get(name)
            groups[name] = GroupInfo(
                name, g.desc or (prev.desc if prev else ""), g.ranks or (prev.ranks if prev else None)
            )
    stacks = next((d.thread_stacks for d in reversed(ordered) if d.thread_stacks), ())
    exception = next((d.exception for d in reversed(ordered) if d.exception), None)
    config = next((d.config for d in reversed(ordered) if d.config is not None), None)
    progress = max((d.progress for d in ordered if d.progress is not None), key=_sampled, default=None)
    warnings = tuple(dict.fromkeys(w for d in ordered for w in d.warnings))
    return replace(
        latest,
        entries=entries,
        groups=groups,
        thread_stacks=stacks,
        exception=exception,
        config=config,
        progress=progress,
        wrapped=bool(entries) and entries[0].record_id > 0,
        warnings=warnings,
        source=latest.source,
        ring_first=None,  # the union is the whole ring again (and older entries it had)
    )


def _sampled(p: Progress) -> int:
    return p.sampled_ns


_KIND_RANK: dict[str, int] = {"dump": 0, "periodic": 1, "stall": 2, "final": 3}
