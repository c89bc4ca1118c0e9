"""What an open job's state (`JobState`) holds in the server, part by part, in process.

A job of `--ranks` x `--entries` collectives (bench/web_server.py's poster, the memory bench's
job) is posted into an in-process server on a fresh SQLite file, folded in and diagnosed; then
the objects its `JobState` reaches are sized (`sys.getsizeof` over `gc.get_referents`, each
object counted once, in the first part that reaches it) and printed per part, in MiB and KiB a
rank. Scale by ranks: a 1,024-rank job holds 1,024 / `--ranks` times as much.

    python -m bench.job_state_parts --ranks 256
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import time
from types import FunctionType, ModuleType

from bench.web_server import post_job
from tests.support.clock import FakeClock
from tests.support.server_app import TOKEN, make_server


class Sizer:
    """Deep sizes, an object shared between parts counted once."""

    def __init__(self) -> None:
        self.seen: set[int] = {id(None), id(True), id(False)}
        self.parts: dict[str, int] = {}

    def add(self, part: str, obj: object) -> None:
        """Add what `obj` reaches (and nothing counted before) to `part`."""
        stack, total = [obj], 0
        while stack:
            x = stack.pop()
            if id(x) in self.seen or isinstance(x, type | ModuleType | FunctionType):
                continue
            self.seen.add(id(x))
            total += sys.getsizeof(x)
            stack.extend(gc.get_referents(x))
        self.parts[part] = self.parts.get(part, 0) + total


def main(argv: list[str] | None = None) -> None:
    """Post the job, size its state, print the parts."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--entries", type=int, default=2000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        srv = make_server(f"sqlite:///{tmp}/fd.db", FakeClock(time.time_ns()))
        try:
            post_job(srv.client, TOKEN, "parts", args.ranks, args.entries, hang=False)
            srv.diagnose()
            (js,) = srv.svc.live.jobs.values()
            assert js.summaries is not None
            sizer = Sizer()
            groups = 0
            for s in js.summaries.values():
                groups = max(groups, len(s.tracks))
                for t in s.tracks.values():
                    for name in ("created_ns", "fps", "seqs", "op_ids"):
                        col = getattr(t, name)
                        sizer.add(f"track column {name} ({type(col).__name__})", col)
                    sizer.add(f"track tail (the last {len(t.tail)} entries in full)", t.tail)
                    sizer.add("track p2p entries and all_to_all totals", (t.p2p, t.totals))
                    sizer.add("track objects", t)
                sizer.add("stacks per signature (sig_frames)", s.sig_frames)
                sizer.add("signatures (sigs)", s.sigs)
                sizer.add("groups' info", s.groups)
                sizer.add("rank summary: metadata and the rest", s)
            sizer.add("report, JobState's other fields", js)
        finally:
            srv.svc.close()
    total = sum(sizer.parts.values())
    print(
        f"{args.ranks} ranks x {args.entries} collectives ({groups} group(s) a rank): "
        f"{total / 2**20:.2f} MiB, {total / args.ranks / 1024:.1f} KiB a rank, "
        f"{total / args.ranks / max(1, args.entries):.1f} B a collective"
    )
    for part, size in sorted(sizer.parts.items(), key=lambda kv: -kv[1]):
        print(f"  {part:48} {size / 2**20:7.2f} MiB  {size / args.ranks / 1024:6.1f} KiB/rank")


if __name__ == "__main__":
    main()
