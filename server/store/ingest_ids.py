"""Row ids an ingest transaction refers to (hosts, stacks, signatures, process groups),
found or created in bulk, and the per-process cache of them (`IngestCache`, `CacheUpdate`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import case, func, select
from sqlalchemy.orm import Session

from flightdeck.records import Signature, Stack, frames_to_wire
from flightdeck.server.models import Host, ProcessGroup, StackRow
from flightdeck.server.models import Signature as SignatureRow
from flightdeck.server.store.common import _IN_CHUNK, _chunks, _digest, _insert
from flightdeck.wire import EntryColumns, Snapshot


@dataclass(slots=True)
class CacheUpdate:
    """Row ids one transaction found or created; valid only once it committed."""

    signatures: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, int] = field(default_factory=dict)
    #: (job id, group name) -> (group row id, desc, members)
    groups: dict[tuple[int, str], tuple[int, str, tuple[int, ...] | None]] = field(default_factory=dict)
    #: (job name, attempt) -> (job row id, world size, server time of this write)
    jobs: dict[tuple[str, int], tuple[int, int | None, int]] = field(default_factory=dict)
    #: collector token id -> server time of this `last_push_ns` write
    tokens: dict[int, int] = field(default_factory=dict)
    #: stack -> its row id
    stacks: dict[Stack, int] = field(default_factory=dict)


@dataclass(slots=True)
class IngestCache:
    """Per-process memory of rows that every batch of a job would otherwise look up or rewrite.

    Signatures, hosts and stacks are content-addressed and never deleted: their ids are cached
    for good (stacks up to `max_stacks`: the frames of every collective call site of every job).
    Process groups are rewritten only when their description or members change. The job row's
    `last_seen_ns` and a token's `last_push_ns` are written at most every `touch_every_ns`: every
    batch of a job updating the same row serializes all ingest transactions on its row lock.
    Only committed ids are learned (`learn` after COMMIT), so a rolled-back batch leaves no id
    of a row that does not exist.
    """

    touch_every_ns: int = 1_000_000_000
    signatures: dict[str, int] = field(default_factory=dict)
    hosts: dict[str, int] = field(default_factory=dict)
    groups: dict[tuple[int, str], tuple[int, str, tuple[int, ...] | None]] = field(default_factory=dict)
    jobs: dict[tuple[str, int], tuple[int, int | None, int]] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    stacks: dict[Stack, int] = field(default_factory=dict)
    max_stacks: int = 100_000

    def learn(self, update: CacheUpdate) -> None:
        """Remember what a committed transaction found (dict updates: safe across threads)."""
        if len(self.stacks) + len(update.stacks) > self.max_stacks:
            self.stacks = {}  # a miss costs one lookup; unbounded memory costs the process
        self.stacks.update(update.stacks)
        self.signatures.update(update.signatures)
        self.hosts.update(update.hosts)
        self.groups.update(update.groups)
        self.jobs.update(update.jobs)
        self.tokens.update(update.tokens)


def _host_ids(session: Session, names: set[str], cache: IngestCache, learned: CacheUpdate) -> dict[str, int]:
    out = {n: cache.hosts[n] for n in names if n in cache.hosts}
    missing = sorted({n[:255] for n in names if n not in out})
    if not missing:
        return out
    session.execute(
        _insert(session, Host).on_conflict_do_nothing(index_elements=["name"]),
        [{"name": n} for n in missing],
    )
    rows = dict(session.execute(select(Host.name, Host.id).where(Host.name.in_(missing))).tuples().all())
    for n in names:
        if n not in out and n[:255] in rows:
            out[n] = learned.hosts[n] = rows[n[:255]]
    return out


def _stack_ids(
    session: Session,
    snapshots: Sequence[Snapshot],
    columns: Sequence[EntryColumns],
    cache: IngestCache,
    learned: CacheUpdate,
) -> dict[int, int]:
    """id(stack tuple) -> stack row id, for every stack the snapshots reference.

    Decoding makes every reference to stack table slot k the same tuple object, so `id()` finds
    a stack without hashing its frames once per entry. Stacks the process has stored or seen
    before are not written again: stall and final snapshots, and torch's own dumps, carry every
    entry's call-site stack.
    """
    by_obj: dict[int, Stack] = {}
    for s, c in zip(snapshots, columns, strict=True):
        if c.stk is not None:
            for i in set(c.stk):
                if i is not None and c.stacks[i]:
                    by_obj.setdefault(id(c.stacks[i]), c.stacks[i])
        for t in s.thread_stacks:
            if t.frames:
                by_obj.setdefault(id(t.frames), t.frames)
        if s.progress is not None and s.progress.frames:
            by_obj.setdefault(id(s.progress.frames), s.progress.frames)
    out: dict[int, int] = {}
    missing: dict[int, Stack] = {}
    for k, st in by_obj.items():
        known = cache.stacks.get(st)
        if known is None:
            missing[k] = st
        else:
            out[k] = known
    if not missing:
        return out
    wire = {k: frames_to_wire(st) for k, st in missing.items()}
    hashes = {k: _digest(w) for k, w in wire.items()}
    unique = {h: wire[k] for k, h in hashes.items()}
    session.execute(
        _insert(session, StackRow).on_conflict_do_nothing(index_elements=["hash"]),
        [{"hash": h, "frames": w} for h, w in sorted(unique.items())],
    )
    ids: dict[str, int] = {}
    for chunk in _chunks(sorted(unique), _IN_CHUNK):
        ids.update(
            dict(
                session.execute(select(StackRow.hash, StackRow.id).where(StackRow.hash.in_(chunk)))
                .tuples()
                .all()
            )
        )
    for k, h in hashes.items():
        out[k] = learned.stacks[missing[k]] = ids[h]
    return out


def _signature_ids(
    session: Session, keys: Sequence[Signature], cache: IngestCache, learned: CacheUpdate
) -> dict[Signature, int]:
    """Signature row id of each distinct key, creating the missing signatures."""
    if not keys:
        return {}
    rows = {}
    for k in keys:
        backend, _op, raw_op, is_p2p, isz, osz, idt, odt = k
        d = {
            "raw_op": raw_op[:256],
            "backend": backend[:64],
            "is_p2p": is_p2p,
            "input_sizes": [list(x) for x in isz],
            "output_sizes": [list(x) for x in osz],
            "input_dtypes": list(idt),
            "output_dtypes": list(odt),
        }
        d["hash"] = _digest(
            [raw_op, backend, is_p2p, d["input_sizes"], d["output_sizes"], list(idt), list(odt)]
        )
        rows[k] = d
    ids: dict[str, int] = {
        str(d["hash"]): cache.signatures[str(d["hash"])]
        for d in rows.values()
        if d["hash"] in cache.signatures
    }
    new = sorted((d for d in rows.values() if d["hash"] not in ids), key=lambda d: str(d["hash"]))
    if new:
        session.execute(_insert(session, SignatureRow).on_conflict_do_nothing(index_elements=["hash"]), new)
        hashes = sorted({str(d["hash"]) for d in new})
        for chunk in _chunks(hashes, _IN_CHUNK):
            found = dict(
                session.execute(
                    select(SignatureRow.hash, SignatureRow.id).where(SignatureRow.hash.in_(chunk))
                )
                .tuples()
                .all()
            )
            ids.update(found)
            learned.signatures.update(found)
    return {k: ids[str(d["hash"])] for k, d in rows.items()}


def _group_ids(
    session: Session,
    snapshots: Sequence[Snapshot],
    columns: Sequence[EntryColumns],
    job_ids: dict[tuple[str, int], int],
    cache: IngestCache,
    learned: CacheUpdate,
) -> dict[int, dict[str, int]]:
    """job id -> group name -> group row id, creating groups (and updating desc / members).

    A group the cache holds with the same description and members is not written again: the
    collector sends every rank's groups with each snapshot, and rewriting a 4,096-member list
    per snapshot would be most of the work of a batch.
    """
    wanted: dict[tuple[int, str], tuple[str, tuple[int, ...] | None]] = {}
    for s, c in zip(snapshots, columns, strict=True):
        job_id = job_ids[(s.job, s.attempt)]
        for name, g in s.groups.items():
            wanted[(job_id, name[:128])] = (g.desc[:256], None if g.ranks is None else tuple(g.ranks))
        for name in dict.fromkeys(c.cols["g"]):
            if (job_id, name) not in wanted:
                wanted[(job_id, name[:128])] = ("", None)
    out: dict[int, dict[str, int]] = {j: {} for j in job_ids.values()}
    if not wanted:
        return out
    write: dict[tuple[int, str], tuple[str, tuple[int, ...] | None]] = {}
    for key, (desc, ranks) in wanted.items():
        known = cache.groups.get(key)
        if known is not None and desc in ("", known[1]) and (ranks is None or ranks == known[2]):
            out[key[0]][key[1]] = known[0]
        else:
            write[key] = (desc or (known[1] if known else ""), ranks or (known[2] if known else None))
    if not write:
        return out
    ins = _insert(session, ProcessGroup)
    ex = ins.excluded
    stmt = ins.on_conflict_do_update(
        index_elements=["job_id", "name"],
        set_={
            "desc": case((ex.desc != "", ex.desc), else_=ProcessGroup.desc),
            "ranks": func.coalesce(ex.ranks, ProcessGroup.ranks),
        },
    )
    session.execute(
        stmt,
        [
            {"job_id": j, "name": n, "desc": d, "ranks": None if r is None else list(r)}
            for (j, n), (d, r) in sorted(write.items())
        ],
    )
    for job_id in out:
        names = [n for (j, n) in write if j == job_id]
        for chunk in _chunks(names, _IN_CHUNK):
            q = select(ProcessGroup.name, ProcessGroup.id).where(
                ProcessGroup.job_id == job_id, ProcessGroup.name.in_(chunk)
            )
            for n, gid in session.execute(q).tuples():
                out[job_id][n] = gid
                learned.groups[(job_id, n)] = (gid, *write[(job_id, n)])
    return out
