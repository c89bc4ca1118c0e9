"""Helpers for the server tests and benchmarks: ingest batches built from real committed dumps.

(A module of helpers, not tests: it holds no test functions.) The dumps under tests/data/fr/ are
from real multi-process gloo jobs; a batch is what a collector would push for them.
"""

from __future__ import annotations

import gzip
import json
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from flightdeck.readers.fr.files import read_dump_file
from flightdeck.records import RankDump
from flightdeck.wire import Batch, Snapshot, encode_batch, snapshot_from_dump

FR_DATA = Path(__file__).resolve().parents[1] / "data" / "fr"


def scenario_expected(name: str) -> dict[str, Any]:
    """The expected verdict of a committed scenario (scenario.json's `expected`)."""
    doc: dict[str, Any] = json.loads((FR_DATA / name / "scenario.json").read_text())
    expected: dict[str, Any] = doc["expected"]
    return expected


def scenario_dumps(name: str) -> dict[int, list[RankDump]]:
    """Every snapshot file of a committed scenario, per rank, oldest snapshot first."""
    out: dict[int, list[RankDump]] = defaultdict(list)
    for p in sorted((FR_DATA / name).glob("rank_*.pkl")):
        d = read_dump_file(p)
        out[d.rank].append(d)
    for dumps in out.values():
        dumps.sort(key=lambda d: d.snapshot_time_ns or 0)
    return dict(out)


def snapshots(dumps: Sequence[RankDump], *, job: str | None = None) -> list[Snapshot]:
    """One wire snapshot per dump (all its entries), as a collector would send them."""
    return [snapshot_from_dump(d, job=job) for d in dumps]


def scenario_snapshots(name: str, job: str, *, live: bool = False) -> list[Snapshot]:
    """Every snapshot of a committed scenario as job `job`, rank by rank; `live`: without the final
    snapshots (a job still running: an ended one pages nobody)."""
    return [
        s
        for dumps in scenario_dumps(name).values()
        for s in snapshots([d for d in dumps if not live or d.kind != "final"], job=job)
    ]


def make_batch(
    snaps: Sequence[Snapshot],
    *,
    batch_id: str | None = None,
    nixl: list[dict[str, Any]] | None = None,
    sent_at_ns: int | None = None,
    collector_host: str = "test-host",
) -> Batch:
    """A batch holding `snaps`, sent at `sent_at_ns` (default: the newest snapshot's time)."""
    sent = sent_at_ns if sent_at_ns is not None else max((s.snapshot_time_ns for s in snaps), default=0)
    return Batch(
        batch_id=batch_id or uuid.uuid4().hex,
        collector_host=collector_host,
        collector_version="test",
        sent_at_ns=sent,
        snapshots=list(snaps),
        nixl=list(nixl or []),
    )


def body(batch: Batch, *, gzipped: bool = True) -> tuple[bytes, dict[str, str]]:
    """The request body and headers for a batch."""
    raw = json.dumps(encode_batch(batch), separators=(",", ":")).encode()
    if gzipped:
        return gzip.compress(raw, compresslevel=1), {
            "Content-Encoding": "gzip",
            "Content-Type": "application/json",
        }
    return raw, {"Content-Type": "application/json"}


def renamed(snap: Snapshot, job: str) -> Snapshot:
    """The same snapshot under another job id."""
    return replace(snap, job=job)


def skip_stuck_view(job: str | None = None) -> list[Snapshot]:
    """The `skip` job (as `job`: default its own name) as a live server sees it while stuck: ranks
    0, 1, 3 wait in seq 12 (their stall snapshots), rank 2 went on without it (its periodic
    snapshot, taken at the same moment): nobody looks silent, so no rank is lost."""
    dumps = scenario_dumps("skip")
    stall_t = max(d.snapshot_time_ns or 0 for ds in dumps.values() for d in ds if d.kind == "stall")
    out = []
    for ds in dumps.values():
        stall = [d for d in ds if d.kind == "stall"]
        if stall:
            out.append(snapshot_from_dump(stall[0], job=job))
        else:
            periodic = next(d for d in ds if d.kind == "periodic")
            out.append(replace(snapshot_from_dump(periodic, job=job), snapshot_time_ns=stall_t))
    return out
