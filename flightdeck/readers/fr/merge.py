"""`merge`: several snapshots of one rank (periodic, stall, final) as one `RankDump`."""

from __future__ import annotations

from dataclasses import replace

from flightdeck.records import Entry, GroupInfo, RankDump


def merge(dumps: list[RankDump]) -> RankDump:
    """Merge snapshots of one rank: union of entries by record id, each as far along as a snapshot
    saw it, the newest snapshot's metadata but for what it left empty, frames and thread stacks
    kept from whichever snapshot had them (the rules the live server's fold shares:
    `flightdeck.analysis.merge`)."""
    # Imported here: the collector daemon reads dumps but never merges them, and importing
    # `flightdeck.analysis` loads the whole diagnosis.
    from flightdeck.analysis.merge import (
        later_progress,
        merged_entry,
        merged_group,
        merged_meta,
        newest_of,
        snapshot_order,
    )
    from flightdeck.records import meta_kwargs, meta_of

    if len(dumps) == 1:
        return dumps[0]
    ordered = sorted(dumps, key=lambda d: snapshot_order(d.snapshot_time_ns, d.kind))
    latest = ordered[-1]
    by_id: dict[int, Entry] = {}
    for d in ordered:
        for e in d.entries:
            held = by_id.get(e.record_id)
            by_id[e.record_id] = e if held is None else merged_entry(held, e)
    entries = [by_id[k] for k in sorted(by_id)]
    groups: dict[str, GroupInfo] = {}
    meta = meta_of(ordered[0])
    progress = None
    for d in ordered:
        meta = merged_meta(meta, d)
        progress = later_progress(progress, d.progress)
        for name, g in d.groups.items():
            groups[name] = merged_group(name, groups.get(name), g)
    stacks = newest_of((d.thread_stacks for d in ordered), ())
    config = newest_of((d.config for d in ordered), None)
    warnings = tuple(dict.fromkeys(w for d in ordered for w in d.warnings))
    return replace(
        latest,
        **meta_kwargs(meta),
        entries=entries,
        groups=groups,
        thread_stacks=stacks,
        config=config,
        comm_lib_version=newest_of((d.comm_lib_version for d in ordered), None),
        pg_status=newest_of((d.pg_status for d in ordered), {}),
        progress=progress,
        wrapped=bool(entries) and entries[0].record_id > 0,
        warnings=warnings,
        ring_first=None,  # the union is the whole ring again (and older entries it had)
    )
