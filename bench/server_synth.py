"""Synthetic large jobs for the server benchmarks, cut from a real gloo dump.

The entries of one rank of the committed `healthy_4` job (real ops, sizes, dtypes and stacks) are
repeated to `entries` collectives per rank for `ranks` ranks: realistic rows, synthetic scale.
"""

from __future__ import annotations

import gzip
import json
import time
import uuid
from dataclasses import replace
from pathlib import Path

from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.fr.merge import merge
from flightdeck.records import Entry, GroupInfo
from flightdeck.wire import Batch, Snapshot, encode_batch

REPO = Path(__file__).resolve().parents[1]
DUMPS = REPO / "tests" / "data" / "fr" / "healthy_4"
MS = 1_000_000


def template() -> list[Entry]:
    """The default-group collectives of rank 0 of the real healthy_4 job (with their stacks)."""
    dump = merge([read_dump_file(p) for p in sorted(DUMPS.glob("rank_0*.pkl"))])
    return [e for e in dump.entries if e.group == "0" and not e.is_p2p]


def rank_entries(tpl: list[Entry], rank: int, first: int, count: int, base_ns: int) -> list[Entry]:
    """Collectives first..first+count-1 (0-based) of one rank, all completed."""
    out = []
    for i in range(first, first + count):
        e = tpl[i % len(tpl)]
        t = base_ns + i * MS + rank * 1000
        out.append(
            replace(
                e,
                record_id=i,
                collective_seq_id=i + 1,
                op_id=i + 1,
                state="completed",
                retired=True,
                time_created_ns=t,
                time_started_ns=t + 10_000,
                time_completed_ns=t + 200_000,
                duration_ms=0.2,
            )
        )
    return out


def snapshot(job: str, rank: int, world: int, entries: list[Entry], t_ns: int) -> Snapshot:
    """A periodic snapshot of `rank` carrying `entries`."""
    return Snapshot(
        job=job,
        attempt=0,
        rank=rank,
        snapshot_time_ns=t_ns,
        kind="periodic",
        world_size=world,
        local_rank=rank % 8,
        host=f"node-{rank // 8:04d}",
        pid=10_000 + rank,
        backend="gloo",
        version="2.10",
        interval_s=1.0,
        groups={"0": GroupInfo("0", "default_pg", tuple(range(world)))},
        entries=entries,
        source="synthetic",
    )


def encode(snaps: list[Snapshot]) -> bytes:
    """A gzip-compressed batch body, sent now (an old `sent_at_ns` reads as a collector replaying
    its queue, and the server would hold the job's verdict back)."""
    batch = Batch(uuid.uuid4().hex, "bench", "bench", time.time_ns(), snaps)
    return gzip.compress(json.dumps(encode_batch(batch), separators=(",", ":")).encode(), compresslevel=1)


def stuck_entry(tpl: list[Entry], rank: int, seq_index: int, base_ns: int) -> Entry:
    """Collective number seq_index (0-based) entered by `rank` and never finished."""
    e = rank_entries(tpl, rank, seq_index, 1, base_ns)[0]
    return replace(
        e, state="scheduled", retired=False, time_started_ns=None, time_completed_ns=None, duration_ms=None
    )
