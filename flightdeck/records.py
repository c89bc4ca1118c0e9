"""Typed, normalized flight-recorder records: the one shape every layer after the reader sees.

The reader (`flightdeck.readers.fr`) turns PyTorch's dump formats into these; the collector
ships them (see `to_wire` / `from_wire`); the server stores them; the analysis consumes them.
Nothing here knows about pickle, JSON dump quirks, files or databases.

One module over 500 lines: the vocabulary every stage shares (reader, wire, store, analysis,
pages), each record with its JSON form beside it; split, every stage would import from all parts.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Any, Literal, NamedTuple, Protocol

State = Literal["scheduled", "started", "completed"]
SnapshotKind = Literal["periodic", "stall", "final", "dump"]

#: The entry NCCL writes after the per-op entries of a coalesced group (`_coalescing_manager` on
#: the slow path, `batch_isend_irecv`): no sizes of its own, but the group's state and times.
COALESCED_END_OPS = frozenset({"coalesced", "ALLGATHER_coalesced", "REDUCE_SCATTER_coalesced"})

#: Ops that PyTorch records under several names; one canonical name makes ranks comparable.
OP_ALIASES: dict[str, str] = {
    "_all_gather_base": "all_gather",
    "_allgather_base": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "allgather": "all_gather",
    "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "allreduce": "all_reduce",
    "alltoall": "all_to_all",
    "alltoall_base": "all_to_all",
    "all_to_all_single": "all_to_all",
    "allgather_coalesced": "all_gather_coalesced",
    "allreduce_coalesced": "all_reduce_coalesced",
}


@dataclass(frozen=True, slots=True)
class Frame:
    """One Python (or C++) stack frame, innermost first in a stack."""

    name: str
    filename: str
    line: int

    def __reduce__(self) -> tuple[type[Frame], tuple[str, str, int]]:
        # Pickled as a constructor call: a frozen slots dataclass's default (its __setstate__
        # looks its fields up on every object) was ~70% of unpickling a rank's summary, which
        # `flightdeck analyze`'s reader processes send to the parent for every rank.
        return (Frame, (self.name, self.filename, self.line))


Stack = tuple[Frame, ...]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """A process group as the job knows it: `name` is `process_group[0]`, the cross-rank identity."""

    name: str
    desc: str
    #: Global ranks of the members, sorted; None when no source told us.
    ranks: tuple[int, ...] | None = None

    def __reduce__(self) -> tuple[type[GroupInfo], tuple[str, str, tuple[int, ...] | None]]:
        return (GroupInfo, (self.name, self.desc, self.ranks))  # as `Frame.__reduce__`


@dataclass(slots=True)
class Entry:
    """One collective or point-to-point op as recorded by one rank.

    Treat as immutable (use `dataclasses.replace`); not frozen only because a frozen dataclass
    costs 5x more to build, and readers build millions of these.
    """

    record_id: int
    group: str
    collective_seq_id: int
    p2p_seq_id: int
    op_id: int
    backend: str
    #: Canonical op name (see OP_ALIASES); `raw_op` keeps what the dump said.
    op: str
    raw_op: str
    is_p2p: bool
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]
    state: State
    #: True once the backend is done with the op (also on failure); gloo's only in-flight signal.
    retired: bool
    time_created_ns: int
    time_started_ns: int | None = None
    time_completed_ns: int | None = None
    duration_ms: float | None = None
    timeout_ms: int | None = None
    thread_name: str = ""
    #: For point-to-point ops: the peer's global rank when the dump names it, else None.
    peer: int | None = None
    frames: Stack = ()

    @property
    def finished(self) -> bool:
        """Whether this rank is done with the op (completed, or retired by the backend)."""
        return self.state == "completed" or self.retired


def entries_from_columns(
    *,
    record_id: Iterable[int],
    group: Iterable[str],
    collective_seq_id: Iterable[int],
    p2p_seq_id: Iterable[int],
    op_id: Iterable[int],
    backend: Iterable[str],
    op: Iterable[str],
    raw_op: Iterable[str],
    is_p2p: Iterable[bool],
    input_sizes: Iterable[tuple[tuple[int, ...], ...]],
    output_sizes: Iterable[tuple[tuple[int, ...], ...]],
    input_dtypes: Iterable[tuple[str, ...]],
    output_dtypes: Iterable[tuple[str, ...]],
    state: Iterable[State],
    retired: Iterable[bool],
    time_created_ns: Iterable[int],
    time_started_ns: Iterable[int | None],
    time_completed_ns: Iterable[int | None],
    duration_ms: Iterable[float | None],
    timeout_ms: Iterable[int | None],
    thread_name: Iterable[str],
    peer: Iterable[int | None],
    frames: Iterable[Stack],
) -> list[Entry]:
    """Entries built from one column (an iterable of equal length) per `Entry` field.

    The readers' and the wire decoder's fast paths build every entry of a dump or a snapshot here:
    `map` calls `Entry` from C with the fields by position, where a keyword call costs about 3x
    the construction (CPython packs the keywords into a dict for a class's `__init__`). This is
    the one place outside the reader's per-entry fast path (`fr.normalize._entry`) that passes `Entry`'s
    fields by position; tests/test_records.py checks that the order is `Entry`'s.
    """
    return list(
        map(
            Entry,
            record_id, group, collective_seq_id, p2p_seq_id, op_id, backend, op, raw_op, is_p2p,
            input_sizes, output_sizes, input_dtypes, output_dtypes, state, retired,
            time_created_ns, time_started_ns, time_completed_ns, duration_ms, timeout_ms,
            thread_name, peer, frames,
        )
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """The Python stack of one thread at snapshot time (taken while a collective is stuck)."""

    thread_name: str
    thread_id: int
    frames: Stack


@dataclass(frozen=True, slots=True)
class Progress:
    """Whether the rank's main (training) thread is working: the agent's evidence, sampled a few
    times a second and carried by every snapshot (sidecar key `progress`).

    A rank the others wait for that still burns CPU or whose stack keeps changing is busy (slow:
    a checkpoint save, a long evaluation); one that sleeps or blocks (no CPU, the same stack: a
    data-loader queue, a lock, a dead peer) is stuck. `flightdeck.analysis.progress` decides.
    """

    #: When the agent last sampled the thread (epoch ns).
    sampled_ns: int
    #: The latest sample that saw it progress (CPU time grew, its stack changed, or it was in disk
    #: I/O); None: no progress seen since the agent started sampling.
    active_ns: int | None = None
    #: When the agent started sampling (epoch ns): "no progress seen" means nothing before this.
    since_ns: int | None = None
    #: CPU time of the thread (user + system, ns, from /proc/self/task/<tid>/stat); None off Linux.
    cpu_ns: int | None = None
    #: Share of one core the thread used over the agent's last sampling window (0..1).
    cpu_share: float | None = None
    #: Scheduler state at the last sample (R running, S sleeping, D disk I/O, ...); "" unknown.
    state: str = ""
    #: Fingerprint of the innermost frames (name, file, line) of the thread's Python stack.
    stack_fp: str = ""
    #: The thread's innermost Python frames, innermost first (a bounded number, always including
    #: the innermost user frame when the thread has one).
    frames: Stack = ()


#: Most frames kept in a `Progress` (the innermost ones).
PROGRESS_MAX_FRAMES = 24


def progress_to_dict(p: Progress, frames: object = None) -> dict[str, Any]:
    """A progress record as plain JSON-able data; `frames` replaces the frame list (the wire and
    the store refer to a stack table instead: pass the reference as `frames` and key `stk`)."""
    d: dict[str, Any] = {
        "sampled_ns": p.sampled_ns,
        "active_ns": p.active_ns,
        "since_ns": p.since_ns,
        "cpu_ns": p.cpu_ns,
        "cpu_share": p.cpu_share,
        "state": p.state,
        "stack_fp": p.stack_fp,
    }
    if frames is None:
        d["frames"] = [{"name": f.name, "filename": f.filename, "line": f.line} for f in p.frames]
    else:
        d["stk"] = frames
    return d


def progress_from_dict(d: object, frames: Stack | None = None) -> Progress | None:
    """Read a progress record leniently: None unless `d` is an object with an int `sampled_ns`;
    fields of the wrong type are dropped. `frames`: the stack when `d` refers to a table."""
    if not isinstance(d, dict):
        return None

    def integer(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) and -(1 << 63) <= v < (1 << 63) else None

    sampled = integer(d.get("sampled_ns"))
    if sampled is None:
        return None
    share = d.get("cpu_share")
    if frames is None:
        raw = d.get("frames")
        out: list[Frame] = []
        if isinstance(raw, list):
            for f in raw[:PROGRESS_MAX_FRAMES]:
                if isinstance(f, dict):
                    out.append(
                        Frame(
                            str(f.get("name", ""))[:256],
                            str(f.get("filename", ""))[:1024],
                            integer(f.get("line")) or 0,
                        )
                    )
        frames = tuple(out)
    state, fp = d.get("state"), d.get("stack_fp")
    return Progress(
        sampled_ns=sampled,
        active_ns=integer(d.get("active_ns")),
        since_ns=integer(d.get("since_ns")),
        cpu_ns=integer(d.get("cpu_ns")),
        cpu_share=float(share) if isinstance(share, int | float) and not isinstance(share, bool) else None,
        state=state[:8] if isinstance(state, str) else "",
        stack_fp=fp[:64] if isinstance(fp, str) else "",
        frames=frames,
    )


@dataclass(frozen=True, slots=True)
class RankMeta:
    """What a snapshot says about its rank and itself, besides what the rank recorded: who the
    rank is (job, attempt, rank, host, pid, ...), what it runs (torch, backend, dump format), and
    what snapshot this is (when, which kind, how often they come, the exception it died with).

    One definition for the three shapes that carry a rank's metadata: a file's `RankDump`, the
    wire's `flightdeck.wire.Snapshot` and the diagnosis's `flightdeck.analysis.summary.RankSummary`.
    Each keeps these fields as its own attributes (the diagnosis, the web pages and the store read
    `summary.host`, `snap.pid` in hundreds of places; a nested `meta` would change every one of
    them and add an attribute lookup to each), and whatever copies them from one to the other goes
    through `meta_kwargs` (build one of the three with another's), `meta_of` (read them as a
    `RankMeta`) or `set_meta` (overwrite them with a `RankMeta`'s), so the list of fields is
    written here only (and in `MetaHolder`, against which mypy checks the three). A copy costs an
    `attrgetter` call per snapshot (about a microsecond), nothing per entry.

    Not here, although two of the shapes share them: what a snapshot holds of the rank's state
    (its groups, entries, thread stacks, configuration report, progress, whether its ring wrapped),
    which each merge rule treats on its own (`flightdeck.analysis.merge`), and what only the files
    know (`snapshot_time_from_file`, `comm_lib_version`, `pg_status`, the reader's warnings).
    """

    job: str | None = None
    attempt: int = 0
    rank: int = 0
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    torch_version: str | None = None
    backend: str | None = None
    #: The flight recorder's dump format version ("" when unknown).
    version: str = ""
    #: Where the snapshot came from (a file's path, "wire", "db").
    source: str = ""
    #: When the snapshot was taken (epoch ns); None: unknown (a `RankDump` without a time).
    snapshot_time_ns: int | None = None
    #: A `SnapshotKind`; a str, as `Snapshot` and `RankSummary` hold it.
    kind: str = "dump"
    #: Seconds between periodic snapshots, when an agent took them.
    interval_s: float | None = None
    #: The exception a rank died with, when its final snapshot recorded one.
    exception: str | None = None


#: `RankMeta`'s fields, in order.
META_FIELDS: tuple[str, ...] = tuple(RankMeta.__dataclass_fields__)
_meta_values = attrgetter(*META_FIELDS)


class MetaHolder(Protocol):
    """What holds a rank's metadata: a `RankMeta`, `RankDump`, `Snapshot` or `RankSummary`."""

    @property
    def job(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    @property
    def rank(self) -> int: ...
    @property
    def world_size(self) -> int | None: ...
    @property
    def local_rank(self) -> int | None: ...
    @property
    def host(self) -> str | None: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def torch_version(self) -> str | None: ...
    @property
    def backend(self) -> str | None: ...
    @property
    def version(self) -> str: ...
    @property
    def source(self) -> str: ...
    @property
    def snapshot_time_ns(self) -> int | None: ...
    @property
    def kind(self) -> str: ...
    @property
    def interval_s(self) -> float | None: ...
    @property
    def exception(self) -> str | None: ...


def meta_kwargs(holder: MetaHolder) -> dict[str, Any]:
    """The metadata a `RankMeta`, `RankDump`, `Snapshot` or `RankSummary` holds, by field name: to
    build one of the others with (`Snapshot(**meta_kwargs(dump), ...)`)."""
    return dict(zip(META_FIELDS, _meta_values(holder), strict=True))


def meta_of(holder: MetaHolder) -> RankMeta:
    """The metadata a `RankDump`, `Snapshot` or `RankSummary` holds."""
    return RankMeta(*_meta_values(holder))


def set_meta(holder: object, meta: RankMeta) -> None:
    """Overwrite the metadata of a `RankDump`, `Snapshot` or `RankSummary` with `meta`'s."""
    for name, value in zip(META_FIELDS, _meta_values(meta), strict=True):
        setattr(holder, name, value)


@dataclass(slots=True)
class RankDump:
    """Everything one snapshot (or merged snapshots) of one rank tells us."""

    rank: int
    source: str
    version: str
    entries: list[Entry]
    groups: dict[str, GroupInfo] = field(default_factory=dict)
    job: str | None = None
    attempt: int = 0
    world_size: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    torch_version: str | None = None
    backend: str | None = None
    comm_lib_version: str | None = None
    #: When the snapshot was taken (epoch ns); from metadata, else the file's mtime.
    snapshot_time_ns: int | None = None
    #: Whether `snapshot_time_ns` is only the file's mtime (no sidecar said when the dump was
    #: taken): a copy sets it to when it was copied, so the diagnosis does not trust it.
    snapshot_time_from_file: bool = False
    kind: SnapshotKind = "dump"
    #: Seconds between periodic snapshots, when an agent took them.
    interval_s: float | None = None
    #: The exception a rank died with, when its final snapshot recorded one.
    exception: str | None = None
    thread_stacks: tuple[ThreadStack, ...] = ()
    #: Whether the ring buffer had wrapped (older entries were overwritten).
    wrapped: bool = False
    #: Oldest record id of the ring when this snapshot holds only part of it (the agent's
    #: `rank_<R>.recent.pkl`: the entries changed since its last whole-ring snapshot); else None.
    ring_first: int | None = None
    warnings: tuple[str, ...] = ()
    #: The rank's configuration report (versions, FR settings, group timeouts, env), when an agent
    #: wrote one.
    config: RankConfig | None = None
    #: The dump's `pg_status` by group name: (last enqueued, last started, last completed) as the
    #: backend counts them (-1: none yet; NCCL's "started" stays -1 without timing).
    pg_status: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    #: Whether its main thread is working (CPU time, stack), when an agent sampled it.
    progress: Progress | None = None


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """One process group as configured on one rank: `name` is `process_group[0]`."""

    name: str
    desc: str = ""
    #: The backend string torch holds for the group, e.g. "cpu:gloo,cuda:nccl".
    backend: str | None = None
    #: The group's collective timeout in ms (new_group does not inherit init_process_group's).
    timeout_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RankConfig:
    """What one rank runs with: versions, flight-recorder settings, groups, relevant env vars.

    Reported by the agent (sidecar key `config`) once per start and whenever it changes; shipped on
    the wire with the same keys (`config_to_dict` / `config_from_dict`).
    """

    torch_version: str | None = None
    torch_git_version: str | None = None
    cuda_version: str | None = None
    #: NCCL version (torch.cuda.nccl.version(), else the dump's `comm_lib_version`).
    nccl_version: str | None = None
    python_version: str | None = None
    #: Effective flight-recorder ring size in entries (0: recording off).
    fr_buffer_size: int | None = None
    #: The variable that set it (None: torch's default of 2000).
    fr_buffer_size_var: str | None = None
    #: Whether NCCL dumps the flight recorder on a watchdog timeout.
    dump_on_timeout: bool | None = None
    groups: tuple[GroupConfig, ...] = ()
    #: `TORCH_*` / `NCCL_*` variables (name, value), sorted; secret-looking values redacted.
    env: tuple[tuple[str, str], ...] = ()
    #: Where the job reads and writes distributed checkpoints (FLIGHTDECK_AGENT_CHECKPOINT_DIR).
    checkpoint_dir: str | None = None
    #: True when versions were replaced by the test-only FLIGHTDECK_TEST_VERSION_OVERRIDE hook.
    simulated: bool = False


#: Longest string kept in a config report (values are cut, never rejected).
CONFIG_MAX_STR = 512
#: Most env vars / groups kept in a config report.
CONFIG_MAX_ITEMS = 256


def config_to_dict(c: RankConfig) -> dict[str, Any]:
    """A config report as plain JSON-able data (the sidecar and wire shape)."""
    return {
        "torch_version": c.torch_version,
        "torch_git_version": c.torch_git_version,
        "cuda_version": c.cuda_version,
        "nccl_version": c.nccl_version,
        "python_version": c.python_version,
        "fr_buffer_size": c.fr_buffer_size,
        "fr_buffer_size_var": c.fr_buffer_size_var,
        "dump_on_timeout": c.dump_on_timeout,
        "groups": {
            g.name: {"desc": g.desc, "backend": g.backend, "timeout_ms": g.timeout_ms} for g in c.groups
        },
        "env": dict(c.env),
        "checkpoint_dir": c.checkpoint_dir,
        "simulated": c.simulated,
    }


def config_from_dict(d: object) -> RankConfig:
    """Read a config report leniently: fields of the wrong type are dropped, strings are cut.

    Raises ValueError only when `d` is not an object at all.
    """
    if not isinstance(d, dict):
        raise ValueError(f"config: expected an object, got {type(d).__name__}")

    def text(v: object) -> str | None:
        return v[:CONFIG_MAX_STR] if isinstance(v, str) and v else None

    def integer(v: object) -> int | None:
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    groups: list[GroupConfig] = []
    raw_groups = d.get("groups")
    if isinstance(raw_groups, dict):
        for name, g in list(raw_groups.items())[:CONFIG_MAX_ITEMS]:
            if isinstance(g, dict):
                groups.append(
                    GroupConfig(
                        str(name)[:128],
                        text(g.get("desc")) or "",
                        text(g.get("backend")),
                        integer(g.get("timeout_ms")),
                    )
                )
    env: list[tuple[str, str]] = []
    raw_env = d.get("env")
    if isinstance(raw_env, dict):
        for k, v in raw_env.items():
            if isinstance(k, str) and isinstance(v, str) and k.startswith(("TORCH_", "NCCL_")):
                env.append((k[:128], v[:CONFIG_MAX_STR]))
    dot = d.get("dump_on_timeout")
    return RankConfig(
        torch_version=text(d.get("torch_version")),
        torch_git_version=text(d.get("torch_git_version")),
        cuda_version=text(d.get("cuda_version")),
        nccl_version=text(d.get("nccl_version")),
        python_version=text(d.get("python_version")),
        fr_buffer_size=integer(d.get("fr_buffer_size")),
        fr_buffer_size_var=text(d.get("fr_buffer_size_var")),
        dump_on_timeout=dot if isinstance(dot, bool) else None,
        groups=tuple(sorted(groups, key=lambda g: g.name)),
        env=tuple(sorted(env)[:CONFIG_MAX_ITEMS]),
        checkpoint_dir=text(d.get("checkpoint_dir")),
        simulated=d.get("simulated") is True,
    )


# --- wire format -------------------------------------------------------------------------------
# Plain JSON-able dicts with short keys; stacks are sent once per batch in a table and referenced
# by index, since a ring buffer repeats the same few call sites thousands of times.

WIRE_VERSION = 2


def frames_to_wire(frames: Stack) -> list[list[Any]]:
    """Encode a stack as `[[name, filename, line], ...]`."""
    return [[f.name, f.filename, f.line] for f in frames]


def frames_from_wire(raw: list[list[Any]]) -> Stack:
    """Decode `frames_to_wire` output (names and file names interned: every rank sends the same)."""
    return tuple(Frame(sys.intern(str(n)), sys.intern(str(fn)), int(ln)) for n, fn, ln in raw)


Sizes = tuple[tuple[int, ...], ...]


class Signature(NamedTuple):
    """An entry's signature: the fields a ring repeats in nearly every entry, in `Entry`'s order.

    The wire sends each distinct one once per batch (`sigs`), the store keeps one row per distinct
    one, and the server's fold takes a fingerprint once per signature, not once per entry. Not to
    be confused with `flightdeck.analysis.summary.Comparable`, the part of it that must agree
    across the ranks of one collective.
    """

    backend: str
    #: Canonical op name (`canonical_op(raw_op)` once decoded from the wire or the store).
    op: str
    raw_op: str
    is_p2p: bool
    input_sizes: Sizes
    output_sizes: Sizes
    input_dtypes: tuple[str, ...]
    output_dtypes: tuple[str, ...]


#: An entry's `Signature` fields as a plain tuple, built in C: equal to (and hashing as) the
#: `Signature`, so hot paths key tables by it per entry and make the `Signature` once per table item.
signature_fields = attrgetter(*Signature._fields)


def signature_to_wire(e: Entry) -> dict[str, Any]:
    """The fields of an entry that a ring repeats in nearly every entry (backend, op, sizes,
    dtypes): sent once per batch, in its `sigs`."""
    return {
        "be": e.backend,
        "op": e.raw_op,
        "isp2p": e.is_p2p,
        "isz": [list(s) for s in e.input_sizes],
        "osz": [list(s) for s in e.output_sizes],
        "idt": list(e.input_dtypes),
        "odt": list(e.output_dtypes),
    }


def canonical_op(raw: str) -> str:
    """Canonical op name: strip the backend prefix and peer suffix, resolve aliases."""
    op = raw.split(":", 1)[1] if ":" in raw else raw
    op = op.split(" ", 1)[0]
    return OP_ALIASES.get(op, op)


def with_progress_of(e: Entry, end: Entry) -> Entry:
    """`e` with the state, completion and times of its coalesced group's end entry (the reader
    folds the two when it reads them together; the summary when the end entry comes alone)."""
    return replace(
        e,
        state=end.state,
        retired=end.retired,
        time_started_ns=end.time_started_ns,
        time_completed_ns=end.time_completed_ns,
        duration_ms=end.duration_ms,
        timeout_ms=end.timeout_ms if end.timeout_ms is not None else e.timeout_ms,
    )
