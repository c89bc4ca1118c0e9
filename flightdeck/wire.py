"""The batch a collector pushes to `POST /api/v1/ingest`: one JSON document (gzip on the wire).

    {"wire_version": 2,
     "batch_id": "<idempotency key, unique per batch>",
     "collector": {"host": "gpu-node-7", "version": "0.1.0"},
     "sent_at_ns": 1796033427488321090,
     "stacks": [[[name, filename, line], ...], ...],      # each distinct stack once
     "sigs": [{"be": "nccl", "op": "nccl:all_reduce", "isp2p": false, "isz": [[4, 16]],
               "osz": [[4, 16]], "idt": ["Float"], "odt": ["Float"]}, ...],  # each distinct one once
     "snapshots": [{...one per rank snapshot, see `Snapshot`; "config": the rank's
                    configuration report or null, see `flightdeck.records.config_to_dict`;
                    "progress" (left out when unknown): its main thread's evidence (`progress_to_dict`, the
                    frames as "stk", an index into "stacks"); "groups": name -> {"desc",
                    "ranks": [...] or "runs": [[start, stop, step], ...]} (`member_runs`);
                    "entries": {"n": 2, "rid": [7, 8], "g": ["0", "0"], "sig": [0, 0], ...}...}],
     "nixl": [{...flightdeck.nixl_records wire dicts...}],
     "gone": [{"job": "...", "attempt": 0, "rank": 3, "pid": 4242, "gone_at_ns": ...}]}  # optional

`gone` names the ranks whose process the collector saw exit on its host (its pid no longer runs):
how the server learns that a job ended when its ranks were killed before writing a final snapshot.
A batch with no snapshots, samples or gone ranks is a collector's heartbeat.

A snapshot carries only the entries that are new or changed since the collector's last push of
that rank (entries change state: the server upserts by (job, attempt, rank, record_id)), plus
`oldest_record_id`, the oldest entry the rank's ring still holds. Its entries go as columns
(`WIRE_COLUMNS`: one list of `n` values per field, an optional column left out when it holds
nothing), and what a ring repeats in nearly every entry (op, sizes, dtypes: its signature) once
per batch in `sigs`: parsing and checking a column is one pass in C, where one object per entry
with 22 keys was most of the server's decoding time.
Decoding validates everything and raises `WireError` with a message that names the bad field.

One module over 500 lines: the encoder and the validating decoder of one document, which change
together field by field (a field added to one and not the other is a bug the round-trip tests
catch); the column checks they share are most of it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain, repeat
from operator import attrgetter
from typing import Any, Generic, TypeVar

from flightdeck.limits import INT32_MAX, INT64_MAX, MAX_JOB, MAX_WORLD_SIZE, int_ok, name_problem
from flightdeck.records import (
    WIRE_VERSION,
    Entry,
    GroupInfo,
    Progress,
    RankConfig,
    RankDump,
    Signature,
    Stack,
    ThreadStack,
    canonical_op,
    config_from_dict,
    config_to_dict,
    entries_from_columns,
    frames_from_wire,
    frames_to_wire,
    meta_kwargs,
    progress_from_dict,
    progress_to_dict,
    signature_fields,
    signature_to_wire,
)

K = TypeVar("K")
V = TypeVar("V")

SNAPSHOT_KINDS = ("periodic", "stall", "final", "dump")


class WireError(ValueError):
    """A batch that does not match the wire format; the message names the field."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """A snapshot (or NIXL sample) left out of a batch, and why (`decode_batch(refused=...)`)."""

    #: Its index in the batch's `snapshots` (or `nixl`, when `nixl`).
    index: int
    reason: str
    nixl: bool = False
    #: Who it claims to be, where it said so (for the answer and the log).
    job: str | None = None
    attempt: int | None = None
    rank: int | None = None
    host: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The refusal as the ingest answer lists it."""
        key = "nixl" if self.nixl else "snapshot"
        who = (
            {"host": self.host}
            if self.nixl
            else {"job": self.job, "attempt": self.attempt, "rank": self.rank}
        )
        return {key: self.index, **who, "reason": self.reason}


#: Checks of decoded values beyond the format (a server's: `flightdeck.server.validation`):
#: built once per batch from its stack and signature tables, then called on each snapshot with
#: where it is (`batch.snapshots[3]`); raises WireError naming the bad value.
SnapshotChecks = Callable[[list["Stack"], list[Any] | None], Callable[["Snapshot", str], None]]


@dataclass(slots=True)
class Snapshot:
    """One rank's snapshot as shipped: identity and metadata (the fields of
    `flightdeck.records.RankMeta`), and the changed entries."""

    job: str
    attempt: int
    rank: int
    snapshot_time_ns: int
    kind: str = "periodic"
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    torch_version: str | None = None
    backend: str | None = None
    version: str = ""
    interval_s: float | None = None
    exception: str | None = None
    wrapped: bool = False
    #: Oldest record id the rank's ring still holds (entries below it were overwritten).
    oldest_record_id: int | None = None
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    thread_stacks: tuple[ThreadStack, ...] = ()
    entries: list[Entry] = field(default_factory=list)
    source: str = ""
    #: The rank's configuration report, when its agent wrote one (small: sent with every snapshot).
    config: RankConfig | None = None
    #: Whether its main thread is working (CPU time, stack), when its agent sampled it.
    progress: Progress | None = None
    #: `entries` as the checked wire columns they were decoded from, for readers that work
    #: column by column; None for a snapshot not decoded from the wire. Whoever replaces
    #: `entries` sets it to None.
    columns: EntryColumns | None = field(default=None, compare=False, repr=False)

    def entry_columns(self) -> EntryColumns:
        """`entries` as columns: the decoded ones, or built from the entries."""
        return self.columns if self.columns is not None else EntryColumns.of(self.entries)


@dataclass(slots=True, frozen=True)
class GoneRank:
    """A rank whose process the collector saw exit: `pid` no longer runs on the collector's host
    since `gone_at_ns` (the collector's clock; the first time it looked and did not find it)."""

    job: str
    attempt: int
    rank: int
    pid: int
    gone_at_ns: int

    def to_json(self) -> dict[str, Any]:
        """The wire form."""
        return {
            "job": self.job,
            "attempt": self.attempt,
            "rank": self.rank,
            "pid": self.pid,
            "gone_at_ns": self.gone_at_ns,
        }


@dataclass(slots=True)
class Batch:
    """A decoded ingest batch."""

    batch_id: str
    collector_host: str
    collector_version: str
    sent_at_ns: int
    snapshots: list[Snapshot]
    #: NIXL samples, still as wire dicts: `flightdeck.nixl_records` decodes them.
    nixl: list[dict[str, Any]] = field(default_factory=list)
    #: Ranks whose process the collector saw exit (`GoneRank`).
    gone: list[GoneRank] = field(default_factory=list)

    @property
    def entry_count(self) -> int:
        """Entries across all snapshots."""
        return sum(len(s.entries) for s in self.snapshots)


class _Table(Generic[K, V]):
    """A batch table (stacks, signatures): each value once, in order of first use, by a key."""

    def __init__(self) -> None:
        self.values: list[V] = []
        self._index: dict[K, int] = {}

    def ref(self, key: K, make: Callable[[], V]) -> int:
        """The index of `key`'s value, `make()` appended when the key is new."""
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self.values)
            self.values.append(make())
        return i


def encode_batch(batch: Batch) -> dict[str, Any]:
    """Encode a batch as plain JSON-able data, each distinct stack once."""
    stacks = _Table[Stack, Stack]()
    sigs = _Table[tuple[Any, ...], dict[str, Any]]()

    def ref(st: Stack) -> int | None:
        return stacks.ref(st, lambda: st) if st else None

    def sig_ref(e: Entry) -> int:
        return sigs.ref(signature_fields(e), lambda: signature_to_wire(e))

    snaps = []
    for s in batch.snapshots:
        snaps.append(
            {
                "job": s.job,
                "attempt": s.attempt,
                "rank": s.rank,
                "snapshot_time_ns": s.snapshot_time_ns,
                "kind": s.kind,
                "world_size": s.world_size,
                "local_rank": s.local_rank,
                "host": s.host,
                "pid": s.pid,
                "torch_version": s.torch_version,
                "backend": s.backend,
                "version": s.version,
                "interval_s": s.interval_s,
                "exception": s.exception,
                "wrapped": s.wrapped,
                "oldest_record_id": s.oldest_record_id,
                "groups": {k: encode_group(g) for k, g in s.groups.items()},
                "thread_stacks": [
                    {"thread_name": t.thread_name, "thread_id": t.thread_id, "stk": ref(t.frames)}
                    for t in s.thread_stacks
                ],
                "entries": _encode_columns(s.entries, ref, sig_ref),
                "source": s.source,
                "config": None if s.config is None else config_to_dict(s.config),
            }
        )
        if s.progress is not None:  # left out when absent (agents before it, PyTorch's own dumps)
            snaps[-1]["progress"] = progress_to_dict(s.progress, ref(s.progress.frames))
    return {
        "wire_version": WIRE_VERSION,
        "batch_id": batch.batch_id,
        "collector": {"host": batch.collector_host, "version": batch.collector_version},
        "sent_at_ns": batch.sent_at_ns,
        "stacks": [frames_to_wire(st) for st in stacks.values],
        "sigs": sigs.values,
        "snapshots": snaps,
        "nixl": batch.nixl,
        **({"gone": [g.to_json() for g in batch.gone]} if batch.gone else {}),
    }


def _req(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise WireError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ in (int, (int, float))):
        raise WireError(f"{where}.{key}: expected {getattr(typ, '__name__', typ)}, got {type(v).__name__}")
    return v


def _opt(d: dict[str, Any], key: str, typ: type | tuple[type, ...], where: str) -> Any:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is int):
        raise WireError(
            f"{where}.{key}: expected {getattr(typ, '__name__', typ)} or null, got {type(v).__name__}"
        )
    return v


#: HTTP header with which a collector says how long a batch waited in its queue before this
#: attempt to send it (milliseconds, by the collector's own clock, so free of clock skew).
BATCH_AGE_HEADER = "Flightdeck-Batch-Age-Ms"


def decode_batch(
    doc: object, *, checks: SnapshotChecks | None = None, refused: list[Refusal] | None = None
) -> Batch:
    """Validate and decode a batch document; raises WireError naming the first bad field.

    `checks`: more checks of each decoded snapshot (see `SnapshotChecks`). With a `refused`
    list, a snapshot that fails is left out of the batch and its `Refusal` appended instead
    (the batch's own fields and tables still raise: they are everyone's).
    """
    if not isinstance(doc, dict):
        raise WireError("batch: expected a JSON object")
    version = _req(doc, "wire_version", int, "batch")
    if version != WIRE_VERSION:
        raise WireError(f"batch.wire_version: {version} is not supported (this server speaks {WIRE_VERSION})")
    batch_id = _req(doc, "batch_id", str, "batch")
    if not 1 <= len(batch_id) <= 128:
        raise WireError("batch.batch_id: must be 1-128 characters")
    coll = _req(doc, "collector", dict, "batch")
    host = _req(coll, "host", str, "batch.collector")
    cver = _opt(coll, "version", str, "batch.collector") or ""
    sent = _req(doc, "sent_at_ns", int, "batch")
    raw_stacks = _req(doc, "stacks", list, "batch")
    stacks: list[Stack] = []
    for i, st in enumerate(raw_stacks):
        try:
            stacks.append(frames_from_wire(st))
        except (TypeError, ValueError) as exc:
            raise WireError(f"batch.stacks[{i}]: expected [[name, filename, line], ...] ({exc})") from None
    sigs = _decode_sigs(_req(doc, "sigs", list, "batch"))
    snaps = []
    members_seen: dict[Any, tuple[int, ...]] = {}  # each distinct member list once per batch
    check = None if checks is None else checks(stacks, sigs)
    for i, s in enumerate(_req(doc, "snapshots", list, "batch")):
        where = f"batch.snapshots[{i}]"
        try:
            snap = _decode_snapshot(s, stacks, where, members_seen, sigs)
            if check is not None:
                check(snap, where)
        except WireError as exc:
            if refused is None:
                raise
            refused.append(_refusal(i, s, str(exc)))
            continue
        snaps.append(snap)
    nixl = doc.get("nixl") or []
    if not isinstance(nixl, list) or not all(isinstance(x, dict) for x in nixl):
        raise WireError("batch.nixl: expected a list of objects")
    return Batch(batch_id, host, cver, sent, snaps, nixl, _decode_gone(doc.get("gone")))


#: Most gone ranks one batch may name (a host runs far fewer ranks; the bound keeps a batch small).
MAX_GONE = 4096


def _opt_text(d: dict[str, Any], key: str, where: str) -> str | None:
    """An optional string that every rank of a job sends alike (a version, a backend), interned:
    one object however many ranks' summaries hold it (an open 1,024-rank job held ~5 KiB a rank
    of copies of the same strings before the decoder interned them)."""
    v = _opt(d, key, str, where)
    return None if v is None else sys.intern(v)


def _decode_gone(raw: object) -> list[GoneRank]:
    """The batch's `gone` list, every value checked against what the store holds."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise WireError("batch.gone: expected a list of objects")
    if len(raw) > MAX_GONE:
        raise WireError(f"batch.gone: more than {MAX_GONE} ranks ({len(raw)})")
    out = []
    for i, g in enumerate(raw):
        where = f"batch.gone[{i}]"
        if not isinstance(g, dict):
            raise WireError(f"{where}: expected an object")
        problem = name_problem(g.get("job"), MAX_JOB)
        if problem is not None:
            raise WireError(f"{where}.job: {problem}")
        for key, high in (("attempt", INT32_MAX), ("rank", MAX_WORLD_SIZE - 1), ("pid", INT64_MAX)):
            if not int_ok(g.get(key), 0, high):
                raise WireError(f"{where}.{key}: expected an integer in [0, {high}]")
        if not int_ok(g.get("gone_at_ns"), 0, INT64_MAX):
            raise WireError(f"{where}.gone_at_ns: expected a non-negative integer (epoch ns)")
        out.append(GoneRank(g["job"], g["attempt"], g["rank"], g["pid"], g["gone_at_ns"]))
    return out


#: Most runs one member list may be sent as (`encode_group` sends a list that needs more as is).
MAX_RUNS = 64


@lru_cache(maxsize=256)
def member_runs(ranks: tuple[int, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """`ranks` as `range(start, stop, step)` runs whose concatenation is `ranks`, in order; None
    when that takes more than `MAX_RUNS` runs or a rank is negative.

    The world group of a 16,384-rank job is one run (3 ints, where its list is ~100 KB of JSON
    in every snapshot of every rank); a data-parallel group (every 8th rank) one run too. The
    collector encodes the same few lists over and over: cached by value.
    """
    runs: list[tuple[int, int, int]] = []
    n = len(ranks)
    i = 0
    while i < n:
        start = ranks[i]
        if start < 0 or len(runs) == MAX_RUNS:
            return None
        j = i
        step = ranks[i + 1] - start if i + 1 < n else 1
        if step <= 0:
            step = 1  # a rank followed by a smaller or equal one: a run of one
        else:
            while j + 1 < n and ranks[j + 1] - ranks[j] == step:
                j += 1
        runs.append((start, ranks[j] + 1, step))
        i = j + 1
    return tuple(runs)


def sent_runs(ranks: tuple[int, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """The runs `encode_group` sends `ranks` as, or None when it sends them as they are."""
    runs = member_runs(ranks) if len(ranks) > 6 else None
    return runs if runs is not None and 3 * len(runs) < len(ranks) else None


def encode_group(g: GroupInfo) -> dict[str, Any]:
    """A group on the wire: its member list as runs when that is shorter (`member_runs`)."""
    if g.ranks is None:
        return {"desc": g.desc, "ranks": None}
    runs = sent_runs(g.ranks)
    if runs is not None:
        return {"desc": g.desc, "runs": [list(r) for r in runs]}
    return {"desc": g.desc, "ranks": list(g.ranks)}


class MemberLists:
    """The member lists that batches send as runs, each expanded once per process (one owner:
    `MEMBER_LISTS`).

    Every host of a job sends the same few lists (the world group, its blocks and stripes) when
    its collector (re)sends groups: at start, after a restart and every minute. Expanding the
    runs to their members and hashing those once per batch took 3.3 ms of the 4.9 ms that
    decoding and checking a groups-carrying batch of 8 ranks in 4 groups of a 16,384-rank job
    cost (in process, 200 hosts' batches, 2026-12-02): 10 s of CPU when 2,048 hosts (re)send
    their groups. Kept here, each list costs that once and later batches look it up by its runs:
    0.88 ms per such batch (with `MEMBER_LISTS.bounds` for the checks and the job's
    `intern_members` by identity).

    Bounded by the members held (`max_members`, 262,144: ~9 MiB, the lists of four 16,384-rank
    jobs in four kinds of groups): emptied when a new list would pass it; a list larger than that
    is expanded every time. Threads share it without a lock: each step is one dict operation under the interpreter lock, and a
    race at worst expands a list twice or counts it twice towards the bound.
    """

    def __init__(self, max_members: int = 1 << 18) -> None:
        self.max_members = max_members
        #: runs -> (members, lowest, highest)
        self._by_runs: dict[tuple[tuple[int, int, int], ...], tuple[tuple[int, ...], int, int]] = {}
        #: id(members) -> (members, lowest, highest): the tuple is held, so its id is its own
        self._by_id: dict[int, tuple[tuple[int, ...], int, int]] = {}
        self._held = 0

    def expand(self, runs: tuple[tuple[int, int, int], ...]) -> tuple[int, ...]:
        """The members of `runs` (already checked: ints, 0 <= start < stop, step >= 1)."""
        known = self._by_runs.get(runs)
        if known is not None:
            return known[0]
        members = tuple(chain.from_iterable(range(*run) for run in runs))
        if len(members) > self.max_members:
            return members  # never held: the bound is on what this keeps
        if self._held + len(members) > self.max_members:
            self.clear()
        got = (members, min(members), max(members))
        self._by_runs[runs] = got
        self._by_id[id(members)] = got
        self._held += len(members)
        return members

    def as_sent(self, ranks: tuple[int, ...]) -> tuple[int, ...]:
        """`ranks` as the object a batch that sends them gets: `expand` of their runs when they
        go as runs (`sent_runs`). A list read back from the store is then the one object the
        job's later batches bring, which `JobState.intern_members` finds by identity: another
        object equal to it is hashed and compared, all of a 16,384-rank world, at every batch
        that carries it (26 % of the diagnosis worker of the owner that took such a job over)."""
        runs = sent_runs(ranks)
        return ranks if runs is None else self.expand(runs)

    def bounds(self, members: tuple[int, ...]) -> tuple[int, int] | None:
        """(lowest, highest) of a list this holds (the very object `expand` returned), else None."""
        got = self._by_id.get(id(members))
        return (got[1], got[2]) if got is not None and got[0] is members else None

    def clear(self) -> None:
        """Forget every list (they are expanded again when next sent)."""
        self._by_runs, self._by_id, self._held = {}, {}, 0


#: The process's member lists sent as runs.
MEMBER_LISTS = MemberLists()


def _decode_runs(raw: object, where: str) -> tuple[int, ...]:
    """The member list that `member_runs` sent as `raw`, checked: at most `MAX_RUNS` runs of
    three ints, 0 <= start < stop <= MAX_WORLD_SIZE, step >= 1, at most MAX_WORLD_SIZE members.
    Expanded once per process (`MEMBER_LISTS`), so every snapshot that sends these runs holds
    one object."""
    if type(raw) is not list or not 0 < len(raw) <= MAX_RUNS:
        raise WireError(f"{where}: expected a list of 1 to {MAX_RUNS} [start, stop, step] runs")
    try:
        key = tuple(map(tuple, raw))
    except TypeError:
        raise WireError(f"{where}: expected a list of [start, stop, step] runs") from None
    total = 0
    for run in key:
        if len(run) != 3 or not set(map(type, run)) <= _INT:
            raise WireError(f"{where}: expected a list of [start, stop, step] runs of ints")
        start, stop, step = run
        if not (0 <= start < stop <= MAX_WORLD_SIZE and step >= 1):
            raise WireError(
                f"{where}: run {list(run)} is not 0 <= start < stop <= {MAX_WORLD_SIZE}, step >= 1"
            )
        total += len(range(start, stop, step))
        if total > MAX_WORLD_SIZE:
            raise WireError(f"{where}: more than {MAX_WORLD_SIZE} members")
    return MEMBER_LISTS.expand(key)


def _refusal(i: int, s: object, reason: str) -> Refusal:
    """The refusal of snapshot `i`, with the identity it claims where it is readable."""
    d = s if isinstance(s, dict) else {}
    job, attempt, rank = d.get("job"), d.get("attempt", 0), d.get("rank")
    return Refusal(
        i,
        reason,
        job=job[:256] if isinstance(job, str) else None,
        attempt=attempt if type(attempt) is int else None,
        rank=rank if type(rank) is int else None,
    )


def _decode_snapshot(
    s: object,
    stacks: list[Stack],
    where: str,
    members_seen: dict[Any, tuple[int, ...]],
    sigs: list[Signature],
) -> Snapshot:
    """One snapshot; `sigs` is the batch's signature table, `members_seen` the group member lists
    its snapshots decoded so far (each one itself)."""
    if not isinstance(s, dict):
        raise WireError(f"{where}: expected an object")
    job = sys.intern(_req(s, "job", str, where))
    if not 1 <= len(job) <= 256:
        raise WireError(f"{where}.job: must be 1-256 characters")
    kind = sys.intern(_req(s, "kind", str, where))
    if kind not in SNAPSHOT_KINDS:
        raise WireError(f"{where}.kind: {kind!r} is not one of {', '.join(SNAPSHOT_KINDS)}")
    rank = _req(s, "rank", int, where)
    if rank < 0:
        raise WireError(f"{where}.rank: must be >= 0")
    groups: dict[str, GroupInfo] = {}
    raw_groups = _opt(s, "groups", dict, where) or {}
    for name, g in raw_groups.items():
        if not isinstance(g, dict):
            raise WireError(f"{where}.groups[{name!r}]: expected an object")
        ranks = g.get("ranks")
        members = None
        if "runs" in g:
            if ranks is not None:
                raise WireError(f"{where}.groups[{name!r}]: both ranks and runs")
            members = _decode_runs(g["runs"], f"{where}.groups[{name!r}].runs")
        elif ranks is not None:
            if type(ranks) is not list:
                raise WireError(f"{where}.groups[{name!r}].ranks: expected a list of ints or null")
            # A world group's member list is thousands of ints, and every rank of a batch sends
            # the same one: decoded once per batch (the snapshots share the tuple), each pass in C.
            members = tuple(ranks)
            try:
                known = members_seen.get(members)
            except TypeError:  # an unhashable member: refused just below
                known = None
            if known is not None:
                members = known
            elif not set(map(type, ranks)) <= _INT:
                raise WireError(f"{where}.groups[{name!r}].ranks: expected a list of ints or null")
            else:
                members_seen[members] = members
        desc = g.get("desc")
        if desc is not None and type(desc) is not str:
            raise WireError(f"{where}.groups[{name!r}].desc: expected a string or null")
        name = sys.intern(str(name))
        groups[name] = GroupInfo(name, sys.intern(desc or ""), members)
    threads = []
    for j, t in enumerate(_opt(s, "thread_stacks", list, where) or []):
        tw = f"{where}.thread_stacks[{j}]"
        if not isinstance(t, dict):
            raise WireError(f"{tw}: expected an object")
        stk = _opt(t, "stk", int, tw)
        if stk is not None and not 0 <= stk < len(stacks):
            raise WireError(f"{tw}.stk: {stk} is not an index into batch.stacks")
        threads.append(
            ThreadStack(
                _opt(t, "thread_name", str, tw) or "",
                _opt(t, "thread_id", int, tw) or 0,
                () if stk is None else stacks[stk],
            )
        )
    columns = _check_columns(_req(s, "entries", dict, where), stacks, sigs, f"{where}.entries")
    iv = _opt(s, "interval_s", (int, float), where)
    raw_config = _opt(s, "config", dict, where)
    progress = None
    raw_progress = _opt(s, "progress", dict, where)
    if raw_progress is not None:
        pstk = _opt(raw_progress, "stk", int, f"{where}.progress")
        if pstk is not None and not 0 <= pstk < len(stacks):
            raise WireError(f"{where}.progress.stk: {pstk} is not an index into batch.stacks")
        progress = progress_from_dict(raw_progress, () if pstk is None else stacks[pstk])
        if progress is None:
            raise WireError(f"{where}.progress.sampled_ns: expected int")
    return Snapshot(
        job=job,
        attempt=_opt(s, "attempt", int, where) or 0,
        rank=rank,
        snapshot_time_ns=_req(s, "snapshot_time_ns", int, where),
        kind=kind,
        world_size=_opt(s, "world_size", int, where),
        local_rank=_opt(s, "local_rank", int, where),
        host=_opt(s, "host", str, where),
        pid=_opt(s, "pid", int, where),
        torch_version=_opt_text(s, "torch_version", where),
        backend=_opt_text(s, "backend", where),
        version=_opt_text(s, "version", where) or "",
        interval_s=None if iv is None else float(iv),
        exception=_opt(s, "exception", str, where),
        wrapped=bool(s.get("wrapped")),
        oldest_record_id=_opt(s, "oldest_record_id", int, where),
        groups=groups,
        thread_stacks=tuple(threads),
        entries=columns.entries(),
        source=_opt_text(s, "source", where) or "",
        config=None if raw_config is None else config_from_dict(raw_config),
        progress=progress,
        columns=columns,
    )


#: The types a member list may hold (bool is not a rank, though isinstance would take it).
_INT = frozenset({int})

#: Entry states as sent.
_STATES = frozenset({"scheduled", "started", "completed"})


# --- entries as columns ----------------------------------------------------------------------

_NONE = type(None)

#: Wire key -> (Entry attribute, value types taken, what the message says, value when left out;
#: `...`: required). `sig` indexes the batch's `sigs`, `stk` its `stacks`.
WIRE_COLUMNS: dict[str, tuple[str, frozenset[type], str, Any]] = {
    "rid": ("record_id", frozenset({int}), "ints", ...),
    "g": ("group", frozenset({str}), "strings", ...),
    "seq": ("collective_seq_id", frozenset({int}), "ints", ...),
    "p2p": ("p2p_seq_id", frozenset({int}), "ints", ...),
    "opid": ("op_id", frozenset({int}), "ints", ...),
    "st": ("state", frozenset({str}), "strings", ...),
    "ret": ("retired", frozenset({bool}), "booleans", ...),
    "tc": ("time_created_ns", frozenset({int}), "ints", ...),
    "ts": ("time_started_ns", frozenset({int, _NONE}), "ints or nulls", None),
    "td": ("time_completed_ns", frozenset({int, _NONE}), "ints or nulls", None),
    "dur": ("duration_ms", frozenset({float, int, _NONE}), "numbers or nulls", None),
    "to": ("timeout_ms", frozenset({int, _NONE}), "ints or nulls", None),
    "thr": ("thread_name", frozenset({str}), "strings", ""),
    "peer": ("peer", frozenset({int, _NONE}), "ints or nulls", None),
}
_GETTERS = {key: attrgetter(attr) for key, (attr, _, _, _) in WIRE_COLUMNS.items()}


def _encode_columns(entries: Sequence[Entry], stack_ref: Any, sig_ref: Any) -> dict[str, Any]:
    """A snapshot's entries as columns; an optional column that holds only its default is left out."""
    cols: dict[str, Any] = {"n": len(entries)}
    for key, (_, _, _, default) in WIRE_COLUMNS.items():
        col = list(map(_GETTERS[key], entries))
        if default is ... or any(v != default for v in col):
            cols[key] = col
    cols["sig"] = list(map(sig_ref, entries))
    if any(e.frames for e in entries):
        cols["stk"] = [stack_ref(e.frames) for e in entries]
    return cols


def _type_names(values: Iterable[Any]) -> str:
    return ", ".join(sorted({type(v).__name__ for v in values}))


def _decode_sigs(raw: list[Any]) -> list[Signature]:
    """The batch's signature table."""
    sigs: list[Signature] = []
    for i, d in enumerate(raw):
        where = f"batch.sigs[{i}]"
        if not isinstance(d, dict):
            raise WireError(f"{where}: expected an object")
        raw_op = _req(d, "op", str, where)
        isp2p = _req(d, "isp2p", bool, where)
        sizes = []
        for key in ("isz", "osz"):
            v = _req(d, key, list, where)
            if not all(type(x) is list and all(type(n) is int for n in x) for x in v):
                raise WireError(f"{where}.{key}: expected a list of lists of ints")
            sizes.append(tuple(map(tuple, v)))
        dtypes = []
        for key in ("idt", "odt"):
            v = _req(d, key, list, where)
            if not all(type(x) is str for x in v):
                raise WireError(f"{where}.{key}: expected a list of strings")
            dtypes.append(tuple(map(sys.intern, v)))
        be = sys.intern(_req(d, "be", str, where))
        raw_op = sys.intern(raw_op)
        sigs.append(
            Signature(
                be, sys.intern(canonical_op(raw_op)), raw_op, isp2p, sizes[0], sizes[1], dtypes[0], dtypes[1]
            )
        )
    return sigs


def _index_column(cols: dict[str, Any], key: str, n: int, size: int, where: str, *, nulls: bool) -> Any:
    """A column of indexes into a table of `size` (None where `nulls` allows)."""
    col = cols.get(key)
    if col is None and nulls:
        return None
    if type(col) is not list or len(col) != n:
        raise WireError(f"{where}.{key}: expected a list of {n} indexes")
    vals = [v for v in col if v is not None] if nulls else col
    if not set(map(type, vals)) <= {int}:
        raise WireError(
            f"{where}.{key}: expected ints{' or nulls' if nulls else ''}, got {_type_names(vals)}"
        )
    if vals and (min(vals) < 0 or max(vals) >= size):
        table = "batch.stacks" if key == "stk" else "batch.sigs"
        raise WireError(
            f"{where}.{key}: {min(vals) if min(vals) < 0 else max(vals)} is not an index into {table}"
        )
    return col


@dataclass(slots=True, eq=False)
class EntryColumns:
    """A snapshot's entries as columns: `cols` maps a `WIRE_COLUMNS` key to its `n` values (a key
    left out holds its default throughout), `sig` indexes the batch's signature table `sigs` and
    `stk` (None: no frames) its stack table `stacks`.

    The server writes rows and folds summaries from these without reading an attribute of each
    entry, and takes a signature's id or fingerprint once per table instead of once per entry.
    """

    n: int
    cols: dict[str, list[Any]]
    sigs: list[Signature]
    sig: list[int]
    stacks: list[Stack]
    stk: list[int | None] | None

    def column(self, key: str) -> Iterable[Any]:
        """All `n` values of the `WIRE_COLUMNS` column `key`."""
        col = self.cols.get(key)
        return repeat(WIRE_COLUMNS[key][3], self.n) if col is None else col

    def frames(self) -> Iterable[Stack]:
        """Each entry's frames."""
        if self.stk is None:
            return repeat((), self.n)
        stacks = self.stacks
        return [() if i is None else stacks[i] for i in self.stk]

    def entries(self) -> list[Entry]:
        """The entries, built."""
        # The signature's fields as columns (a transpose in C).
        sigs = map(self.sigs.__getitem__, self.sig)
        be, op, raw_op, is_p2p, isz, osz, idt, odt = zip(*sigs, strict=True) if self.n else ((),) * 8
        v = self.column
        return entries_from_columns(
            record_id=v("rid"), group=v("g"), collective_seq_id=v("seq"), p2p_seq_id=v("p2p"),
            op_id=v("opid"), backend=be, op=op, raw_op=raw_op, is_p2p=is_p2p, input_sizes=isz,
            output_sizes=osz, input_dtypes=idt, output_dtypes=odt, state=v("st"), retired=v("ret"),
            time_created_ns=v("tc"), time_started_ns=v("ts"), time_completed_ns=v("td"),
            duration_ms=v("dur"), timeout_ms=v("to"), thread_name=v("thr"), peer=v("peer"),
            frames=self.frames(),
        )  # fmt: skip

    @classmethod
    def of(cls, entries: Sequence[Entry]) -> EntryColumns:
        """Entries as columns (what `encode_batch` would send of them)."""
        sigs = _Table[tuple[Any, ...], Signature]()
        stacks = _Table[int, Stack]()  # by identity: the store finds a stack's row by id()

        def sig_ref(e: Entry) -> int:
            key = signature_fields(e)
            return sigs.ref(key, lambda: Signature._make(key))

        def stack_ref(st: Stack) -> int | None:
            return stacks.ref(id(st), lambda: st) if st else None

        cols = _encode_columns(entries, stack_ref, sig_ref)
        return cls(cols.pop("n"), cols, sigs.values, cols.pop("sig"), stacks.values, cols.pop("stk", None))


def _check_columns(
    cols: dict[str, Any], stacks: list[Stack], sigs: list[Signature], where: str
) -> EntryColumns:
    """Check a snapshot's entry columns (types, lengths, states, indexes).

    Each check is one pass in C over a column (`set(map(type, col))`), not a Python loop per
    entry, which is what makes this format cheap to take in.
    """
    n = cols.get("n")
    if type(n) is not int or n < 0:
        raise WireError(f"{where}.n: expected the number of entries (an int >= 0)")
    values: dict[str, list[Any]] = {}
    for key, (_, types, what, default) in WIRE_COLUMNS.items():
        col = cols.get(key)
        if col is None:
            if default is ...:
                raise WireError(f"{where}: missing column {key!r}")
            continue
        if type(col) is not list or len(col) != n:
            raise WireError(f"{where}.{key}: expected a list of {n} values")
        seen = set(map(type, col))
        if not seen <= types:
            raise WireError(f"{where}.{key}: expected {what}, got {_type_names(col)}")
        if key == "dur" and int in seen:
            col = [None if v is None else float(v) for v in col]  # JSON writes 1.0 as 1
        values[key] = col
    if not set(values["st"]) <= _STATES:
        bad = next(v for v in values["st"] if v not in _STATES)
        raise WireError(f"{where}.st: unknown entry state {bad!r}")
    sig = _index_column(cols, "sig", n, len(sigs), where, nulls=False)
    stk = _index_column(cols, "stk", n, len(stacks), where, nulls=True)
    return EntryColumns(n, values, sigs, sig, stacks, stk)


def snapshot_from_dump(
    dump: RankDump, *, entries: list[Entry] | None = None, job: str | None = None
) -> Snapshot:
    """A snapshot of a parsed dump; `entries` narrows it to the changed ones (default: all)."""
    meta = meta_kwargs(dump)
    meta["job"] = job or dump.job or "unknown"
    meta["snapshot_time_ns"] = dump.snapshot_time_ns or 0
    return Snapshot(
        **meta,
        wrapped=dump.wrapped,
        oldest_record_id=dump.entries[0].record_id if dump.entries else None,
        groups=dict(dump.groups),
        thread_stacks=dump.thread_stacks,
        entries=list(dump.entries if entries is None else entries),
        config=dump.config,
        progress=dump.progress,
    )
