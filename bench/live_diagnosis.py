"""Cost of the live diagnosis of one large job, in process: fold, diagnose, gauges.

The job is `bench/loadgen/`'s simulated one (N ranks on H hosts, 10 collectives/s over 3
kinds of groups, snapshots every 2 s shipping new and changed entries), run for `--history`
seconds and then fed, snapshot by snapshot, to the server's `LiveDiagnosis` on a scratch SQLite
database (findings and reports are written as in the server). Prints what one 2 s round of
snapshots costs to fold in, the first diagnosis (it compares the whole history held), and the
next ones after one more round (what a live server pays each time: only the collectives that
arrived since are compared), with and without the straggler analysis; and what one scrape of
/metrics costs for the job (the shipped Prometheus scrapes the server every 2 s, docs/alerting.md).

    python bench/live_diagnosis.py --ranks 4096 --hosts 512 --history 30
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere
from bench.loadgen.job import NS, RankSim, Sim, Topology
from flightdeck.server import store
from flightdeck.server.db import connect, migrate
from flightdeck.server.decode_gate import DecodeGate
from flightdeck.server.live import LiveDiagnosis
from flightdeck.server.metrics import IngestMetrics, SharedState, StateCollector
from flightdeck.server.settings import ServerSettings
from flightdeck.wire import Snapshot, decode_batch


def rounds(sim: Sim, t0_ns: int, history_s: float) -> list[list[Snapshot]]:
    """Every rank's snapshots, one list per 2 s snapshot round."""
    out = []
    t = t0_ns + int(sim.interval_s * NS)
    while t <= t0_ns + int(history_s * NS):
        # Through JSON, as the server gets it (the simulator's member lists are tuples).
        docs = (orjson.loads(orjson.dumps(sim.host_doc(h, t))) for h in range(sim.topo.hosts))
        out.append([s for doc in docs for s in decode_batch(doc).snapshots])
        t += int(sim.interval_s * NS)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--hosts", type=int, default=512)
    ap.add_argument("--groups", type=int, default=3)
    ap.add_argument("--history", type=float, default=30.0, help="seconds of the job before measuring")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)

    topo = Topology(args.ranks, args.hosts, args.groups)
    topo.build()
    t0 = time.time_ns() - int((args.history + 2) * NS)
    rng = random.Random(1)
    sim = Sim("bench-live", topo, 10.0, 2.0, t0, 60.0)
    sim.ranks = [RankSim(r, rng.randrange(2_000_000)) for r in range(args.ranks)]
    built = time.perf_counter()
    snaps = rounds(sim, t0, args.history)
    built = time.perf_counter() - built

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/live.db"
        db = connect(url)
        migrate(db)
        settings = ServerSettings(database_url=url, stall_after_s=30)
        live = LiveDiagnosis(
            db=db,
            settings=settings,
            clock=time.time_ns,
            on_events=lambda *_: None,
            on_db_error=lambda: None,
            decode_gate=DecodeGate(),
        )
        with db.write() as session, session.begin():
            job_id, _ = store.upsert_job(
                session=session, name=sim.job, attempt=0, world_size=args.ranks, seen_ns=time.time_ns()
            )
        fold_s = []

        def fold(batch: list[Snapshot]) -> None:
            result = store.IngestResult(duplicate=False, jobs={job_id: (sim.job, 0)}, created_jobs={job_id})
            result.snapshots = [store.AppliedSnapshot(job_id, s) for s in batch]
            live.submit(result)
            started = time.perf_counter()
            live._fold(live.jobs[job_id])
            fold_s.append(time.perf_counter() - started)

        def diagnose(stragglers: bool) -> float:
            js = live.jobs[job_id]
            js.last_stragglers = -1e9 if stragglers else time.monotonic()
            started = time.perf_counter()
            live.diagnose_job(js)
            return time.perf_counter() - started

        for batch in snaps[: -args.repeat * 2]:
            fold(batch)
        timings: dict[str, list[float]] = {
            "first (whole history)": [diagnose(False)],
            "next, with stragglers": [],
            "next, without": [],
        }
        rest = iter(snaps[-args.repeat * 2 :])
        for _ in range(args.repeat):
            for label, stragglers in (("next, with stragglers", True), ("next, without", False)):
                fold(next(rest))
                timings[label].append(diagnose(stragglers))
        entries = sum(len(s.entries) for b in snaps for s in b)
        print(
            f"{args.ranks} ranks / {args.hosts} hosts, {args.groups} group kinds "
            f"({len({g for m in topo.member for g, _, _ in m})} groups), {args.history:.0f} s of history "
            f"({entries:,} entries; simulated in {built:.1f} s)"
        )
        print(f"fold one 2 s round of snapshots: {sorted(fold_s)[len(fold_s) // 2]:.3f} s (median)")
        report = live.jobs[job_id].report
        for label, ts in timings.items():
            print(f"diagnose_job, {label}: {min(ts):.3f} s (best of {len(ts)})")
        print(f"findings: {[f.kind for f in (report.findings if report else [])]}")
        from prometheus_client import CollectorRegistry, generate_latest

        registry = CollectorRegistry()
        registry.register(
            StateCollector(live=live, shared=SharedState(), ingest=IngestMetrics(), clock=time.time_ns)
        )
        scrapes = []
        for _ in range(args.repeat):
            started = time.perf_counter()
            exposition = generate_latest(registry)
            scrapes.append(time.perf_counter() - started)
        series = sum(1 for line in exposition.splitlines() if line and not line.startswith(b"#"))
        print(
            f"one /metrics exposition: {min(scrapes) * 1000:.0f} ms (best of {len(scrapes)}), "
            f"{len(exposition) / 1024:.0f} KiB, {series:,} series"
        )


if __name__ == "__main__":
    main()
