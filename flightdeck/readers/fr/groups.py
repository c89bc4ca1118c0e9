"""Process groups as a dump describes them: `pg_config` and `pg_status`.

The groups of `pg_config` (name, description, member ranks), whether a rank can be the dump's by
its member lists (`_outside_pg_config`), and `pg_status` by group name.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from functools import lru_cache
from typing import Any

from flightdeck.readers.fr.normalize import _int, _s
from flightdeck.records import GroupInfo


def _pg_config_groups(raw: dict[str, Any]) -> dict[str, GroupInfo]:
    """Groups from pg_config, skipping gloo's placeholder entries (empty name, '[]' ranks)."""
    out: dict[str, GroupInfo] = {}
    cfg = raw.get("pg_config")
    if not isinstance(cfg, dict):
        return out
    for key, val in cfg.items():
        if not isinstance(val, dict):
            continue
        name = _s(val.get("name") or key or "")
        if not name:
            continue  # gloo registers the group before Python names it: nothing usable here
        out[name] = GroupInfo(name, _s(val.get("desc") or ""), _pg_ranks(val.get("ranks")))
    return out


def _pg_ranks(rr: object) -> tuple[int, ...] | None:
    """A pg_config entry's member ranks ("[0, 1]" in a dump, a list in JSON), or None if unusable."""
    if type(rr) is str:
        return _pg_ranks_text(rr)
    return _pg_ranks_of(rr)


@lru_cache(maxsize=64)
def _pg_ranks_text(rr: str) -> tuple[int, ...] | None:
    """`_pg_ranks` of the text form, remembered: every rank's dump repeats the same member lists
    (the world group's names every rank: at 4,096 ranks a 24 KB string, parsed twice per file
    without this)."""
    try:
        parsed = json.loads(rr)
    except json.JSONDecodeError:
        return None
    return _pg_ranks_of(parsed)


def _pg_ranks_of(parsed: object) -> tuple[int, ...] | None:
    if isinstance(parsed, list) and parsed and all(isinstance(x, int) for x in parsed):
        return tuple(sorted(parsed))
    return None


def _outside_pg_config(raw: dict[str, Any], rank: int) -> str | None:
    """Why `rank` cannot be this dump's, by its pg_config (a member of none of the groups listed,
    the unnamed ones gloo registers included: every rank is a member of the default group), or
    None when it can be or pg_config lists no members."""
    cfg = raw.get("pg_config")
    if not isinstance(cfg, dict):
        return None
    members = [m for v in cfg.values() if isinstance(v, dict) and (m := _pg_ranks(v.get("ranks")))]
    if not members or any(_member(m, rank) for m in members):
        return None
    return (
        f"rank {rank} (from the file name) is a member of none of its pg_config's process groups "
        f"(ranks {min(map(min, members))}..{max(map(max, members))}): a dump copied under another rank's name?"
    )


def _member(ranks: tuple[int, ...], rank: int) -> bool:
    """Whether `rank` is in the sorted member list (a binary search: the world group of a
    4,096-rank job lists 4,096 ranks, looked at once per file)."""
    i = bisect_left(ranks, rank)
    return i < len(ranks) and ranks[i] == rank


_STATUS_FIELDS = ("last_enqueued_collective", "last_started_collective", "last_completed_collective")


def _pg_status(raw: dict[str, Any], raw_entries: list[Any]) -> dict[str, tuple[int, int, int]]:
    """`pg_status` by group name. It is keyed by the per-process `pg_id` (ints in pickles, strings in
    JSON, as are its values); the entries say which group each pg_id is. A pg_id no entry names
    keeps its key (prefixed `pg_id:`), and an unreadable value reads as -1."""
    status = raw.get("pg_status")
    if not isinstance(status, dict) or not status:
        return {}
    wanted = {str(k) for k in status}
    names: dict[str, str] = {}
    for e in raw_entries:
        if len(names) == len(wanted):
            break
        pg, pid = e.get("process_group"), e.get("pg_id")
        if pid is not None and isinstance(pg, list | tuple) and pg and str(pid) not in names:
            names[str(pid)] = str(pg[0])
    out: dict[str, tuple[int, int, int]] = {}
    for key, val in status.items():
        if not isinstance(val, dict):
            continue
        a, b, c = (_int(val.get(f), -1) for f in _STATUS_FIELDS)
        out[names.get(str(key), f"pg_id:{key}")] = (a, b, c)
    return out
