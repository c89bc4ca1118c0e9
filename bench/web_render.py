"""Server time of the incident page: `python bench/web_render.py` (prints a table).

A synthetic hang: every rank records `collectives` all_reduces in group 0, the last one still in
flight, except rank 3, which never entered it. Entries are built as the reader would build them
(records of gloo all_reduces with a real-looking 15-frame stack). Times are measured through the
real router in process (httpx ASGITransport: routing, WebData window query, view, Jinja render),
median of `repeat` requests, after one warm-up. The diagnosis runs once up front (the server
caches the verdict; it is not part of a page request) and is reported separately.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx
from fastapi import FastAPI

from flightdeck.analysis import Options
from flightdeck.records import Entry, Frame, GroupInfo, RankDump
from flightdeck.web.routes import make_router
from tests.support.dump_data import DumpData

T0 = 1_800_000_000_000_000_000
FRAMES = tuple(Frame(f"fn_{i}", f"/srv/train/module_{i}.py", 10 + i) for i in range(15))


def synthetic_job(n_ranks: int, collectives: int, *, t0: int = T0) -> list[RankDump]:
    """Merged dumps of a hung job: rank 3 never entered the last collective; the first entry
    recorded at `t0` (epoch ns)."""
    members = tuple(range(n_ranks))
    dumps = []
    for r in range(n_ranks):
        last = collectives - 1 if r == 3 else collectives
        entries = [
            Entry(
                record_id=s,
                group="0",
                collective_seq_id=s,
                p2p_seq_id=0,
                op_id=s,
                backend="gloo",
                op="all_reduce",
                raw_op="gloo:all_reduce",
                is_p2p=False,
                input_sizes=((256,),),
                output_sizes=((256,),),
                input_dtypes=("Float",),
                output_dtypes=("Float",),
                state="scheduled",
                retired=s < collectives,
                time_created_ns=t0 + s * 10_000_000 + r * 1000,
                frames=FRAMES,
            )
            for s in range(1, last + 1)
        ]
        dumps.append(
            RankDump(
                rank=r,
                source=f"rank_{r}.pkl",
                version="2.10",
                entries=entries,
                groups={"0": GroupInfo("0", "default_pg", members)},
                job="bench",
                world_size=n_ranks,
                host=f"node{r // 8}",
                pid=10_000 + r,
                snapshot_time_ns=t0 + collectives * 10_000_000 + 60_000_000_000,
                kind="periodic",
                interval_s=1.0,
            )
        )
    return dumps


def _median_ms(app: FastAPI, url: str, headers: dict[str, str], repeat: int) -> float:
    async def go() -> float:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            (await c.get(url, headers=headers)).raise_for_status()  # warm-up (template compile)
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                r = await c.get(url, headers=headers)
                times.append((time.perf_counter() - t) * 1000)
                r.raise_for_status()
            return statistics.median(times)

    return asyncio.run(go())


def main() -> None:
    """Run the two sizes of the issue and print the figures with their targets."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    print(
        f"{'ranks':>6} {'colls':>6} {'diagnose':>10} {'page':>10} {'timeline':>10} {'wall time':>10}"
        f" {'target':>8}  rows"
    )
    for n_ranks, collectives, target_ms in ((64, 500, 150), (1024, 2000, 1000)):
        dumps = synthetic_job(n_ranks, collectives)
        t = time.perf_counter()
        data = DumpData.from_dumps({"bench": dumps}, options=Options(stall_after_s=2.0))
        diag_ms = (time.perf_counter() - t) * 1000
        app = FastAPI()
        app.include_router(make_router(data))
        page = _median_ms(app, "/jobs/bench", {}, args.repeat)
        frag = _median_ms(app, "/jobs/bench", {"HX-Request": "true", "HX-Target": "timeline"}, args.repeat)
        # The wall-time view of the same window (the page with ?view=time).
        wall = _median_ms(app, "/jobs/bench?view=time", {}, args.repeat)
        view = _jobs_rows(app)
        ok = "ok" if max(page, frag, wall) < target_ms else "SLOW"
        print(
            f"{n_ranks:>6} {collectives:>6} {diag_ms:>8.0f}ms {page:>8.1f}ms {frag:>8.1f}ms {wall:>8.1f}ms"
            f" {target_ms:>6}ms  {view} {ok}"
        )


def _jobs_rows(app: FastAPI) -> int:
    async def go() -> int:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as c:
            rows: int = len((await c.get("/jobs/bench?format=json")).json()["rows"])
            return rows

    return asyncio.run(go())


if __name__ == "__main__":
    main()
