"""`merge`: several snapshots of one rank (periodic, stall, final) as one `RankDump`."""

from __future__ import annotations

from dataclasses import replace

from flightdeck.records import Entry, GroupInfo, Progress, RankDump


def merge(dumps: list[RankDump]) -> RankDump:
    """Merge snapshots of one rank: union of entries by record id, the newest snapshot's state wins,
    frames and thread stacks kept from whichever snapshot had them (the rules the live server's
    fold shares: `flightdeck.analysis.merge`)."""
    # Imported here: the collector daemon reads dumps but never merges them, and importing
    # `flightdeck.analysis` loads the whole diagnosis.
    from flightdeck.analysis.merge import merged_group, newest_of, snapshot_order, with_frames_kept

    if len(dumps) == 1:
        return dumps[0]
    ordered = sorted(dumps, key=lambda d: snapshot_order(d.snapshot_time_ns, d.kind))
    latest = ordered[-1]
    by_id: dict[int, Entry] = {}
    for d in ordered:
        for e in d.entries:
            by_id[e.record_id] = with_frames_kept(e, by_id.get(e.record_id))
    entries = [by_id[k] for k in sorted(by_id)]
    groups: dict[str, GroupInfo] = {}
    for d in ordered:
        for name, g in d.groups.items():
            groups[name] = merged_group(name, groups.get(name), g)
    stacks = newest_of((d.thread_stacks for d in ordered), ())
    exception = newest_of((d.exception for d in ordered), None)
    config = newest_of((d.config for d in ordered), None)
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
