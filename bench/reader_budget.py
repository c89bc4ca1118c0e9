"""What the reader's per-file budget costs: `python -m bench.reader_budget [--repeat 200]`.

The budget (`fr.decode.check_budget`: entries, frames and tensor sizes counted per reference, shared
entry objects refused) runs on every decoded dump before it is normalized. This times it on real
2,000-entry gloo dumps (`bench.collector_fixtures.real_dumps`), with frames (stall/final snapshots)
and without (periodic ones), against the unpickling it follows and the whole `read_dump_file`, and
on the crafted 0.8 MB pickle of 400,000 references to one 200-frame entry, which it refuses.
Best of `--repeat` runs each (the least disturbed on a shared machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.collector_fixtures import real_dumps
from flightdeck.readers.fr.decode import DumpBudget, check_budget, load_raw, safe_loads
from flightdeck.readers.fr.errors import DumpError
from flightdeck.readers.fr.files import read_dump_file
from flightdeck.readers.incremental import IncrementalReader
from flightdeck.snapshot_check import check_snapshot
from flightdeck.wire import snapshot_from_dump


def best_us(fn: Callable[[], Any], repeat: int) -> float:
    """Fastest of `repeat` calls, in µs."""
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=200)
    args = ap.parse_args()
    src = real_dumps()[0]
    raw = load_raw(src.read_bytes())
    periodic = dict(raw, entries=[{k: v for k, v in e.items() if k != "frames"} for e in raw["entries"]])
    with tempfile.TemporaryDirectory() as tmp:
        print(
            f"{'dump':34s} {'entries':>7s} {'unpickle':>10s} {'budget':>9s} {'share':>6s} {'read_dump_file':>15s}"
        )
        for name, doc in (
            ("2,000 entries with frames", raw),
            ("2,000 entries, periodic (no frames)", periodic),
        ):
            path = Path(tmp) / "rank_0.pkl"
            data = pickle.dumps(doc, protocol=4)
            path.write_bytes(data)
            loaded = safe_loads(data)
            t_load = best_us(lambda data=data: safe_loads(data), args.repeat)  # type: ignore[misc]
            t_check = best_us(lambda loaded=loaded: check_budget(loaded), args.repeat)  # type: ignore[misc]
            t_read = best_us(lambda path=path: read_dump_file(path), max(10, args.repeat // 10))  # type: ignore[misc]
            print(
                f"{name:34s} {len(doc['entries']):7d} {t_load:8.0f}µs {t_check:7.0f}µs "
                f"{t_check / t_read:6.1%} {t_read / 1e3:12.2f} ms"
            )
        # The collector's own path: a periodic ring rewritten with 50 entries more, read incrementally
        # (decoded, scanned, only the changed entries normalized), with the budget and without one.
        ring = Path(tmp) / "rank_1.pkl"
        old = periodic["entries"]
        last = old[-1]
        # The ring moved on: its 50 oldest entries left, 50 new ones (copies of the newest) came.
        new = [
            dict(e, record_id=last["record_id"] + 1 + i, collective_seq_id=last["collective_seq_id"] + 1 + i)
            for i, e in enumerate(old[-50:])
        ]
        versions = [
            pickle.dumps(periodic, protocol=4),
            pickle.dumps(dict(periodic, entries=old[50:] + new), protocol=4),
        ]
        off = DumpBudget(max_entries=2**62, max_frames=2**62, max_dims=2**62)  # times the walk only

        def second_read() -> float:
            """Seconds of the read of the second version, after the first was read and shipped."""
            reader = IncrementalReader()
            ring.write_bytes(versions[0])
            state = reader.read(ring, identify=lambda _h: None, max_bytes=1 << 30).state
            ring.write_bytes(versions[1])
            t = time.perf_counter()
            reader.read(ring, identify=lambda _h: state, max_bytes=1 << 30)
            return time.perf_counter() - t

        t_on = min(second_read() for _ in range(max(10, args.repeat // 4))) * 1e6
        # What that read pays: the count at decoding, then frames and sizes of the entries it
        # normalizes (the 50 changed ones), checked by `LoadedDump.parse`.
        second = safe_loads(versions[1])
        changed = dict(second, entries=second["entries"][-50:])
        t_check = best_us(lambda: check_budget(changed, off), args.repeat)
        print(
            f"incremental read of a changed periodic ring (50 new entries): {t_on / 1e3:.2f} ms, of which the budget {t_check:.0f}µs ({t_check / t_on:.1%})"
        )
        # The per-snapshot check against the store's limits, on a whole ring (a first read) and on
        # the 50 changed entries of an incremental one.
        whole = snapshot_from_dump(read_dump_file(src))
        part = dataclasses.replace(whole, entries=whole.entries[-50:])
        t_whole = best_us(lambda: check_snapshot(dataclasses.replace(whole)), args.repeat)
        t_part = best_us(lambda: check_snapshot(dataclasses.replace(part)), args.repeat)
        print(
            f"check_snapshot: {t_whole / 1e3:.2f} ms for a whole 2,000-entry snapshot with frames, "
            f"{t_part:.0f}µs for 50 changed entries ({t_part / t_on:.1%} of the incremental read)"
        )
        entry = dict(raw["entries"][0])
        entry["frames"] = [{"name": f"fn{i}", "filename": f"/src/mod{i}.py", "line": i} for i in range(200)]
        crafted = pickle.dumps(dict(raw, entries=[entry] * 400_000), protocol=4)
        path = Path(tmp) / "rank_7.pkl"
        path.write_bytes(crafted)
        t = time.process_time()
        try:
            read_dump_file(path)
            verdict = "accepted"
        except DumpError as exc:
            verdict = f"refused: {exc}"
        print(
            f"crafted {len(crafted) / 1e6:.1f} MB, 400,000 references: {time.process_time() - t:.3f} s CPU, {verdict}"
        )


if __name__ == "__main__":
    main()
