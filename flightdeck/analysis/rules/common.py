"""What the diagnosis rules share: the process groups and their members, the ranks without a
dump, a rank's last entry and main-thread stack, and how ranks, groups and shapes read in a
finding's text."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from flightdeck.analysis.findings import Options, RankRef
from flightdeck.analysis.frames import is_agent_frame
from flightdeck.analysis.summary import GroupTrack, RankSummary
from flightdeck.records import Entry, Stack

NS = 1_000_000_000

#: Ranks without a dump listed (in `Report.without_dump` and a finding's culprits) beyond the
#: ranks that have one: the count is always whole, the list is bounded by what was received.
MAX_LISTED_MISSING = 4096


@dataclass(frozen=True, slots=True)
class _Group:
    name: str
    desc: str
    #: A world group whose members are known only by its size is a `range` (the ranks seen are
    #: looked up in it: nothing is allocated per rank of a size a batch claims).
    members: Sequence[int]
    #: The members with a summary, in member order (`_present`), and the tracks of the group
    #: of those that hold some of its collectives: what most rules go through, worked out once
    #: per diagnosis (not once per rule: thousands of ranks x groups).
    present: Sequence[int]
    held: Mapping[int, GroupTrack]


def _group_sort_key(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


def _groups(by_rank: dict[int, RankSummary], world_size: int | None) -> list[_Group]:
    """Every process group with its members: from metadata/pg_config, else from who recorded it."""
    # One pass over the ranks (not one per group: thousands of groups times thousands of ranks),
    # one dict update per rank and group: what the ranks say of a group is counted by (name,
    # member list object, description). Member lists are counted by object, not by value:
    # hashing a world-sized tuple once per rank is ranks x world element hashes per diagnosis,
    # while ranks that share one list object (the live server interns them) cost one hash for all.
    names: set[str] = set()
    said: dict[tuple[str, int, str], list[Any]] = {}  # -> [the GroupInfo first seen, how many]
    for s in by_rank.values():
        names.update(s.tracks)
        for name, info in s.groups.items():
            key = (name, id(info.ranks), info.desc)
            seen = said.get(key)
            if seen is None:
                said[key] = [info, 1]
            else:
                seen[1] += 1
    # In order of first appearance (the first of equal counts wins, as before).
    declared_by: dict[str, dict[int, tuple[tuple[int, ...], int]]] = {}
    descs_by: dict[str, Counter[str]] = {}
    for (name, _, desc), (info, n) in said.items():
        names.add(name)
        if info.ranks:
            objs = declared_by.setdefault(name, {})
            had = objs.get(id(info.ranks))
            objs[id(info.ranks)] = (info.ranks, n if had is None else had[1] + n)
        if desc and desc != "undefined":
            descs_by.setdefault(name, Counter())[desc] += n
    recorded_by: dict[str, list[int]] | None = None
    out: list[_Group] = []
    for name in sorted(names, key=_group_sort_key):
        by_obj = declared_by.get(name)
        descs = descs_by.get(name) or Counter()
        members: Sequence[int]
        if by_obj and len(by_obj) == 1:
            members = next(iter(by_obj.values()))[0]  # one list object: nothing to count
        elif by_obj:
            declared: Counter[tuple[int, ...]] = Counter()
            for members_obj, n in by_obj.values():
                declared[members_obj] += n
            members = declared.most_common(1)[0][0]
        elif name == "0" or descs.get("default_pg"):
            size = world_size or max((s.world_size or 0) for s in by_rank.values()) or (max(by_rank) + 1)
            members = range(size)
        else:
            if recorded_by is None:
                # Who recorded it: needed only for groups no rank declared (rare live).
                recorded_by = {}
                for r, s in by_rank.items():
                    for track_name in s.tracks:
                        recorded_by.setdefault(track_name, []).append(r)
            members = tuple(sorted(recorded_by.get(name, ())))
        if not members:
            continue
        desc = descs.most_common(1)[0][0] if descs else ""
        present = _present(members, by_rank)
        held = {r: t for r in present if (t := by_rank[r].tracks.get(name)) is not None and t.seqs}
        out.append(_Group(name, desc, members, present, held))
    return out


def _expected_ranks(by_rank: dict[int, RankSummary], world_size: int | None, groups: list[_Group]) -> int:
    if world_size:
        return world_size
    sizes = [s.world_size for s in by_rank.values() if s.world_size]
    if sizes:
        return max(sizes)
    top = max(by_rank)
    for g in groups:
        top = max(top, g.members[-1] if isinstance(g.members, range) else max(g.members))
    return top + 1


def missing_ranks(present: Iterable[int], expected: int) -> tuple[list[int], int]:
    """The ranks below `expected` not in `present` (the first `MAX_LISTED_MISSING` more than
    there are present ones, in order) and how many there are in all: the work and the list are
    bounded by the ranks present, whatever `expected` claims."""
    have = {r for r in present if 0 <= r < expected}
    limit = MAX_LISTED_MISSING + len(have)
    listed = list(islice((r for r in range(expected) if r not in have), limit))
    return listed, expected - len(have)


def _present(members: Sequence[int], by_rank: Mapping[int, object]) -> list[int]:
    """The members that have a summary, in member order (a `range` one: from the ranks seen)."""
    if isinstance(members, range):
        return [r for r in sorted(by_rank) if r in members]
    return [r for r in members if r in by_rank]


def _ref(s: RankSummary | None, rank: int) -> RankRef:
    return RankRef(rank, s.host if s else None, s.pid if s else None)


def _refs(ranks: Sequence[int], by_rank: dict[int, RankSummary]) -> list[RankRef]:
    return [_ref(by_rank.get(r), r) for r in ranks]


def _fmt_ranks(
    ranks: Sequence[int],
    by_rank: dict[int, RankSummary] | None = None,
    limit: int = 8,
    total: int | None = None,
) -> str:
    """'rank 3 (host-a pid 42)' / 'ranks 0, 1, 2 … (+5 more)'; `total`: how many `ranks` (a
    bounded list) stands for."""
    total = len(ranks) if total is None else total
    shown = list(ranks[:limit])
    parts = []
    for r in shown:
        s = by_rank.get(r) if by_rank else None
        where = ""
        if s is not None and s.host:
            where = f" ({s.host}" + (f" pid {s.pid})" if s.pid else ")")
        parts.append(f"{r}{where}")
    more = f" (+{total - len(shown)} more)" if total > len(shown) else ""
    return ("rank " if total == 1 else "ranks ") + ", ".join(parts) + more


def _group_label(g: _Group) -> str:
    return f"group {g.name}" + (f" ({g.desc})" if g.desc else "")


def _sizes(sizes: tuple[tuple[int, ...], ...]) -> str:
    return "[" + ",".join("x".join(str(d) for d in s) for s in sizes) + "]"


def _last_entry(s: RankSummary) -> Entry | None:
    best: Entry | None = None
    for t in s.tracks.values():
        for e in (t.tail[-1:] if t.tail else []) + t.p2p[-1:]:
            if best is None or e.record_id > best.record_id:
                best = e
    return best


def _main_stack(s: RankSummary) -> Stack:
    """The main thread's Python stack from the rank's stall/final snapshot, when it has one."""
    main = next((t for t in s.thread_stacks if t.thread_name == "MainThread"), None)
    if main is None:
        return ()
    # Drop the agent's own frames (a final snapshot is taken from an exit hook on the main thread):
    # what is left is where the user's code is, or nothing when the interpreter was shutting down.
    return tuple(f for f in main.frames if not is_agent_frame(f))


def _silent(s: RankSummary, now_ns: int, opts: Options) -> bool:
    """Whether the rank has sent nothing for as long as makes a rank lost (or has exited)."""
    if s.kind == "final" or s.snapshot_time_ns is None:
        return True
    if s.snapshot_time_from_file:
        return False  # a file time says when the file was copied, not when the rank last spoke
    threshold = opts.lost_after_intervals * s.interval_s if s.interval_s else opts.lost_after_s
    return (now_ns - s.snapshot_time_ns) / NS > threshold
