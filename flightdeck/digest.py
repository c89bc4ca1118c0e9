"""Progress digests: where each rank is in each of its process groups, in three numbers.

At thousands of ranks the server cannot afford to store and fold every collective as it happens
(issue 25: 16,384 ranks at 10 collectives/s are 164,000 entries a second). What the hang rule
needs of a rank is much less: per process group, the newest collective it entered, the newest
up to which it finished every collective, and how long it has been waiting in the oldest one it
has not finished. A collector sends that (a *digest*) for its ranks every interval, and ships the
full entries only when the server asks for them (`flightdeck.analysis.board` says when).

The wire form is columnar, one block per job and attempt, so that a host's ranks cost a few
small integers each (`encode_digests` / `decode_digests`):

    {"v": 1, "host": str, "sent_ns": int, "jobs": [{
        "job": str, "attempt": int, "world_size": int | null,
        "groups": [str, ...],        # the block's group names, referenced by index in "g"
        "rank": [int, ...],          # one per rank ...
        "age_ms": [int, ...],        # ... how long before sent_ns its snapshot was taken
        "n": [int, ...],             # ... how many group cells follow for it
        "g": [int, ...],             # one per (rank, group) cell: the group's index
        "e": [int, ...],             # newest collective sequence id entered
        "d": [int, ...],             # entered minus finished (0 when nothing is open)
        "w": [int, ...],             # ms waited in the oldest unfinished one, as of the
                                     # snapshot; -1 when nothing is open or its time is unknown
        "k": [int, ...],             # a newly finished span of SPAN collectives, -1: none
        "h": [int, ...]}]}           # its fingerprint (32 bits; 0 with k = -1)

Mismatches are caught without the entries by spans: the collectives of a group are cut in
spans of `SPAN` sequence ids, and a rank that has finished every collective of a span sends
the span's fingerprint once (`span_fingerprint`: each collective's signature, the part that
must agree across ranks, `flightdeck.analysis.summary.signature`). Ranks whose fingerprint of a
span differs from the others' are where the full diagnosis looks (the server asks for that
span's entries).

Everything decoded is checked against what the board can hold (`DigestError` names the value);
nothing here knows about HTTP, files or the database.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from flightdeck.limits import INT32_MAX, INT64_MAX, MAX_GROUP, MAX_HOST, MAX_JOB, MAX_WORLD_SIZE, name_problem

NS = 1_000_000_000
MS = 1_000_000

#: Digest format version.
VERSION = 1
#: Job blocks per request, group names per block and cells per request: a host runs a few
#: jobs of at most a few hundred ranks, each in a few dozen groups; these bound what one request
#: may make the server allocate whatever it claims.
MAX_JOBS = 64
MAX_GROUPS = 4096
MAX_CELLS = 262_144
#: Longest wait a digest may state (a year, in ms).
MAX_WAIT_MS = 365 * 86400 * 1000
#: Collectives per fingerprinted span: span k holds sequence ids k * SPAN + 1 .. (k + 1) * SPAN.
#: At 10 collectives/s over 4 groups a span completes every ~6 s per group, so its 32-bit
#: fingerprint costs ~2 B/s per rank and group on the wire.
SPAN = 16
MAX_FP = 2**32 - 1


class DigestError(ValueError):
    """A digest request that cannot be taken, with the reason (answered as a 4xx)."""


@dataclass(frozen=True, slots=True)
class GroupProgress:
    """One rank's progress in one process group."""

    group: str
    #: Newest collective sequence id the rank entered (0: none seen).
    entered: int
    #: Newest sequence id up to which the rank finished every collective it entered.
    finished: int
    #: Enqueue time (epoch ns) of the oldest collective entered and not finished; 0 when none
    #: (or when its time is unknown).
    open_since_ns: int = 0
    #: A finished span of SPAN collectives (its index; -1: none to report) and its fingerprint.
    span: int = -1
    span_fp: int = 0


def span_fingerprint(fps: Iterable[int]) -> int:
    """The 32-bit fingerprint of a span from its collectives' signature fingerprints
    (`flightdeck.analysis.summary.fingerprint`), in sequence order."""
    h = hashlib.blake2b(digest_size=4)
    for fp in fps:
        h.update(fp.to_bytes(8, "big"))
    return int.from_bytes(h.digest(), "big")


def newest_span(finished: int, fps: dict[int, int]) -> tuple[int, int]:
    """(index, fingerprint) of the newest span all of whose collectives are finished by
    `finished` and held in `fps` (seq -> signature fingerprint); (-1, 0) when there is none."""
    k = finished // SPAN - 1
    if k < 0:
        return -1, 0
    seqs = range(k * SPAN + 1, (k + 1) * SPAN + 1)
    if any(q not in fps for q in seqs):
        return -1, 0  # not all held (the ring wrapped, or the rank started mid-span)
    return k, span_fingerprint(fps[q] for q in seqs)


@dataclass(frozen=True, slots=True)
class RankDigest:
    """One rank's digest: its identity, when its snapshot was taken, its progress per group."""

    job: str
    attempt: int
    rank: int
    world_size: int | None
    time_ns: int
    groups: tuple[GroupProgress, ...]


@dataclass(slots=True)
class DigestBlock:
    """One job attempt's digests of a request, as checked columns (see the module's doc): no
    object per rank, so that folding them costs what the numbers cost."""

    job: str
    attempt: int
    world_size: int | None
    groups: list[str]
    rank: list[int]
    #: Snapshot time (epoch ns) per rank.
    time_ns: list[int]
    n: list[int]
    g: list[int]
    entered: list[int]
    finished: list[int]
    #: Enqueue time (epoch ns) of the oldest open collective per cell, 0 when none.
    open_since_ns: list[int]
    #: A newly finished span per cell (-1: none) and its fingerprint.
    span: list[int]
    span_fp: list[int]

    @property
    def cells(self) -> int:
        """(rank, group) cells in the block."""
        return len(self.g)


@dataclass(slots=True)
class DigestRequest:
    """A decoded digest request."""

    host: str
    sent_ns: int
    blocks: list[DigestBlock]

    @property
    def ranks(self) -> int:
        """Ranks across the request's blocks."""
        return sum(len(b.rank) for b in self.blocks)


def encode_digests(host: str, sent_ns: int, digests: Sequence[RankDigest]) -> dict[str, Any]:
    """The wire form of a host's digests (one block per job attempt, in order of first use)."""
    blocks: dict[tuple[str, int], dict[str, Any]] = {}
    index: dict[tuple[str, int], dict[str, int]] = {}
    for d in digests:
        key = (d.job, d.attempt)
        b = blocks.get(key)
        if b is None:
            b = blocks[key] = {
                "job": d.job, "attempt": d.attempt, "world_size": d.world_size, "groups": [],
                "rank": [], "age_ms": [], "n": [], "g": [], "e": [], "d": [], "w": [], "k": [], "h": [],
            }  # fmt: skip
            index[key] = {}
        names = index[key]
        b["rank"].append(d.rank)
        b["age_ms"].append(max(0, (sent_ns - d.time_ns) // MS))
        b["n"].append(len(d.groups))
        for p in d.groups:
            i = names.get(p.group)
            if i is None:
                i = names[p.group] = len(b["groups"])
                b["groups"].append(p.group)
            b["g"].append(i)
            b["e"].append(p.entered)
            b["d"].append(max(0, p.entered - p.finished))
            b["w"].append(max(0, (d.time_ns - p.open_since_ns) // MS) if p.open_since_ns else -1)
            b["k"].append(p.span)
            b["h"].append(p.span_fp if p.span >= 0 else 0)
    return {"v": VERSION, "host": host, "sent_ns": sent_ns, "jobs": list(blocks.values())}


def _ints(raw: object, where: str, low: int, high: int) -> list[int]:
    if not isinstance(raw, list):
        raise DigestError(f"{where}: expected a list of integers")
    # One pass in C for the common case; the slow loop only names the bad value.
    if all(type(v) is int for v in raw) and (not raw or (min(raw) >= low and max(raw) <= high)):
        return raw
    for i, v in enumerate(raw):
        if type(v) is not int or not low <= v <= high:
            raise DigestError(f"{where}[{i}]: {v!r} is not an integer in [{low}, {high}]")
    raise AssertionError("unreachable")


def _name(raw: object, where: str, limit: int) -> str:
    problem = name_problem(raw, limit)
    if problem is not None:
        raise DigestError(f"{where}: {problem}")
    assert isinstance(raw, str)
    return raw


def decode_digests(doc: object) -> DigestRequest:
    """A digest request from its parsed JSON, every value checked; raises DigestError."""
    if not isinstance(doc, dict):
        raise DigestError("a digest request is a JSON object")
    if doc.get("v") != VERSION:
        raise DigestError(f"v: digest format {doc.get('v')!r} is not supported (this server: {VERSION})")
    host = _name(doc.get("host"), "host", MAX_HOST)
    sent_ns = doc.get("sent_ns")
    if type(sent_ns) is not int or not 0 < sent_ns <= INT64_MAX:
        raise DigestError("sent_ns: expected a positive integer (epoch ns)")
    jobs = doc.get("jobs")
    if not isinstance(jobs, list) or len(jobs) > MAX_JOBS:
        raise DigestError(f"jobs: expected a list of at most {MAX_JOBS} blocks")
    blocks: list[DigestBlock] = []
    cells = 0
    for j, raw in enumerate(jobs):
        where = f"jobs[{j}]"
        if not isinstance(raw, dict):
            raise DigestError(f"{where}: expected an object")
        block = _decode_block(raw, where, sent_ns)
        cells += block.cells
        if cells > MAX_CELLS:
            raise DigestError(f"{where}: more than {MAX_CELLS} (rank, group) cells in one request")
        blocks.append(block)
    return DigestRequest(host=host, sent_ns=sent_ns, blocks=blocks)


def _decode_block(raw: dict[str, Any], where: str, sent_ns: int) -> DigestBlock:
    job = _name(raw.get("job"), f"{where}.job", MAX_JOB)
    attempt = raw.get("attempt")
    if type(attempt) is not int or not 0 <= attempt <= INT32_MAX:
        raise DigestError(f"{where}.attempt: expected an integer in [0, {INT32_MAX}]")
    world = raw.get("world_size")
    if world is not None and (type(world) is not int or not 1 <= world <= MAX_WORLD_SIZE):
        raise DigestError(f"{where}.world_size: expected null or an integer in [1, {MAX_WORLD_SIZE}]")
    names = raw.get("groups")
    if not isinstance(names, list) or len(names) > MAX_GROUPS:
        raise DigestError(f"{where}.groups: expected a list of at most {MAX_GROUPS} names")
    groups = [_name(v, f"{where}.groups[{i}]", MAX_GROUP) for i, v in enumerate(names)]
    top = (world or MAX_WORLD_SIZE) - 1
    rank = _ints(raw.get("rank"), f"{where}.rank", 0, top)
    if len(set(rank)) != len(rank):
        raise DigestError(f"{where}.rank: a rank is listed twice")
    age = _ints(raw.get("age_ms"), f"{where}.age_ms", 0, sent_ns // MS)
    n = _ints(raw.get("n"), f"{where}.n", 0, MAX_GROUPS)
    if not len(rank) == len(age) == len(n):
        raise DigestError(f"{where}: rank, age_ms and n differ in length")
    total = sum(n)
    if total > MAX_CELLS:
        raise DigestError(f"{where}.n: more than {MAX_CELLS} (rank, group) cells")
    g = _ints(raw.get("g"), f"{where}.g", 0, len(groups) - 1)
    e = _ints(raw.get("e"), f"{where}.e", 0, INT64_MAX)
    d = _ints(raw.get("d"), f"{where}.d", 0, INT64_MAX)
    w = _ints(raw.get("w"), f"{where}.w", -1, MAX_WAIT_MS)
    k = _ints(raw.get("k"), f"{where}.k", -1, INT64_MAX // SPAN)
    h = _ints(raw.get("h"), f"{where}.h", 0, MAX_FP)
    if not len(g) == len(e) == len(d) == len(w) == len(k) == len(h) == total:
        raise DigestError(f"{where}: g, e, d, w, k and h must hold sum(n) = {total} values each")
    finished = [a - b for a, b in zip(e, d, strict=True)]
    if finished and min(finished) < 0:
        raise DigestError(f"{where}.d: a cell finished before sequence id 0 (d > e)")
    time_ns = [sent_ns - a * MS for a in age]
    # Each cell's open-since time from its rank's snapshot time (cells follow their rank's order).
    since: list[int] = []
    at = 0
    for t, count in zip(time_ns, n, strict=True):
        for waited in w[at : at + count]:
            since.append(max(1, t - waited * MS) if waited >= 0 else 0)
        at += count
    return DigestBlock(
        job=job, attempt=attempt, world_size=world, groups=groups, rank=rank, time_ns=time_ns,
        n=n, g=g, entered=e, finished=finished, open_since_ns=since, span=k, span_fp=h,
    )  # fmt: skip
