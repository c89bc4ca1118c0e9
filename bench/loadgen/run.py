"""The run: the simulated job's batches (or, with `--digests`, its snapshots for the digests) queued
per host and snapshot interval, the senders, the findings poller and the sampler, and the report
they add up to."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import resource
import time
import uuid
from typing import Any

import httpx

from bench.loadgen.failover import kill_owner
from bench.loadgen.findings import explained_by, fault_seq, finding_brief, own_finding
from bench.loadgen.job import JITTER_NS, NS, RankSim, Sim, Step, Topology, plan_faults
from bench.loadgen.resources import PG_MEM_SOURCE, sampler, take_sample
from bench.loadgen.stats import Stats, pct, windows
from bench.loadgen.transport import Servers, digest_sender, scrape, sender


async def poll_findings(
    client: httpx.AsyncClient, servers: Servers, job: str, sim: Sim, stats: Stats, stop: asyncio.Event
) -> None:
    """Poll the findings API from the first fault on; record when each fault's finding appears."""
    if not sim.faults:
        return
    await asyncio.sleep(max(0.0, (sim.faults[0].at_ns - time.time_ns()) / NS))
    kinds = sim.topo.kinds
    while not stop.is_set() and len(stats.found) < len(sim.faults):
        try:
            r = await client.get(f"{servers.live_url()}/api/v1/jobs/{job}/findings", timeout=10)
            if r.status_code == 200:
                now = time.time_ns()
                for f in sim.faults:
                    if f.index in stats.found or now < f.at_ns:
                        continue
                    for x in r.json()["findings"]:
                        if own_finding(f, x, kinds) and (x.get("opened_at_s") or 0) >= f.at_ns / NS - 1:
                            stats.found[f.index] = ((now - f.at_ns) / NS, x["kind"])
                            break
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.2)


def digest_figures(args: argparse.Namespace, stats: Stats, wall: float, gen_wall: float) -> dict[str, Any]:
    """`--digests`: the digest requests apart from the ingest batches: their rate against the one
    expected (a request per host and interval), latency (all, first and second half), bytes, and
    how many answers asked for the job's entries (and for spans' entries: a mismatch round)."""
    lat = [d[1] for d in stats.digests]
    half = gen_wall / 2
    early = [d[1] for d in stats.digests if d[0] < half]
    late = [d[1] for d in stats.digests if half <= d[0] <= gen_wall]
    return {
        "requests": len(stats.digests),
        "requests_per_s": round(len(stats.digests) / wall, 1),
        "expected_per_s": round(args.hosts / args.interval, 1),
        "request_ms": {p: round(pct(lat, p) * 1000, 2) for p in (50, 90, 99, 100)},
        "request_ms_early_late_p50": [round(pct(early, 50) * 1000, 2), round(pct(late, 50) * 1000, 2)],
        "request_ms_early_late_p99": [round(pct(early, 99) * 1000, 2), round(pct(late, 99) * 1000, 2)],
        "bytes_per_request": round(stats.digest_bytes / max(1, len(stats.digests))),
        "bytes_per_rank_per_s": round(stats.digest_bytes / wall / args.ranks, 1),
        "detail_answers": sum(d[3] for d in stats.digests),
        "span_answers": stats.span_answers,
    }


async def drive(
    args: argparse.Namespace, urls: list[str], token: str, pids: list[int], db_url: str = ""
) -> dict[str, Any]:
    """Run the simulated job against `urls` for `args.duration` seconds; returns the figures."""
    topo = Topology(args.ranks, args.hosts, args.groups)
    topo.build()
    rng = random.Random(7)
    t0 = time.time_ns()
    faults = plan_faults(
        [dataclasses.replace(f) for f in args.faults], t0, args.rate, args.groups, args.ranks
    )
    sim = Sim(
        job=args.job or f"loadgen-{uuid.uuid4().hex[:6]}",
        topo=topo,
        rate=args.rate,
        interval_s=args.interval,
        t0_ns=t0,
        groups_resend_s=args.groups_resend_s,
        ship_completions=not args.drop_completions,
        faults=faults,
        ranks=[RankSim(r, rng.randrange(0, JITTER_NS)) for r in range(args.ranks)],
    )
    stats = Stats(start=time.perf_counter())
    servers = Servers(urls, pids)
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)  # findings and metrics only
    stats.samples.append(await asyncio.to_thread(take_sample, 0.0, pids, {}, db_url))
    stop = asyncio.Event()
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:
        queues: list[asyncio.Queue[tuple[str, bytes, int, int] | None]] = []
        steps: list[asyncio.Queue[tuple[list[Step], int] | None]] = []
        if args.digests:
            steps = [asyncio.Queue() for _ in range(args.hosts)]
            senders = [
                asyncio.create_task(digest_sender(servers, h % len(urls), token, h, sim, steps[h], stats))
                for h in range(args.hosts)
            ]
        else:
            queues = [asyncio.Queue() for _ in range(args.hosts)]
            senders = [
                asyncio.create_task(sender(servers, h % len(urls), token, queues[h], stats))
                for h in range(args.hosts)
            ]
        poller = asyncio.create_task(poll_findings(client, servers, sim.job, sim, stats, stop))
        killer = None
        if args.kill_owner_at is not None:
            killer = asyncio.create_task(kill_owner(client, servers, sim.job, args.kill_owner_at, stats))
        sampling = asyncio.create_task(sampler(pids, db_url, args.window_s, stats, stop))
        # Hosts snapshot at their own phase within the interval, like independent collectors.
        phase = [args.interval * h / args.hosts for h in range(args.hosts)]
        end = time.monotonic() + args.duration
        start = time.monotonic()
        k = 0
        backlog_max = 0
        while time.monotonic() < end:
            for h in range(args.hosts):
                due = start + k * args.interval + phase[h]
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                elif delay < -args.interval / 2:
                    stats.late_ticks += 1
                if time.monotonic() >= end:
                    break
                now_ns = time.time_ns()
                if args.digests:
                    # The snapshot is taken now; its digest is built when it goes out.
                    steps[h].put_nowait((sim.host_steps(h, now_ns), now_ns))
                    backlog_max = max(backlog_max, steps[h].qsize())
                else:
                    batch_id, body, n = sim.host_batch(h, now_ns)
                    queues[h].put_nowait((batch_id, body, n, now_ns))
                    backlog_max = max(backlog_max, queues[h].qsize())
            k += 1
        gen_wall = time.perf_counter() - stats.start
        for q in queues:
            q.put_nowait(None)
        for sq in steps:
            sq.put_nowait(None)
        await asyncio.wait(senders, timeout=args.drain_s)
        drained = all(t.done() for t in senders)
        for t in senders:
            t.cancel()
        if not poller.done() and sim.faults:
            await asyncio.wait([poller], timeout=args.stall_after + 10)
        if killer is not None:
            await asyncio.wait([killer], timeout=10)
            killer.cancel()
        stop.set()
        poller.cancel()
        await sampling
        try:
            doc = (
                await client.get(f"{servers.live_url()}/api/v1/jobs/{sim.job}/findings", timeout=30)
            ).json()
            stats.findings = list(doc["findings"])
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        server_stats = [
            await scrape(client, u) if up else {} for u, up in zip(urls, servers.alive, strict=True)
        ]
    wall = time.perf_counter() - stats.start
    last = await asyncio.to_thread(take_sample, wall, pids, {}, db_url)
    stats.samples.append(last)
    first = stats.samples[0]
    cpu = [(b - a) / wall for a, b in zip(first.server_cpu_s, last.server_cpu_s, strict=True)]
    rss_peak = [max(s.server_rss_peak[i] for s in stats.samples) for i in range(len(pids))]
    request_s = [(r[0], r[1]) for r in stats.delivered]
    half = gen_wall / 2
    early = [s for t, s in request_s if t < half]
    late = [s for t, s in request_s if half <= t <= gen_wall]
    offered = args.ranks * args.rate
    # Steady state: from 10 s in to the first fault that stops the simulated job (for a while or
    # for good; a mismatch held 0 s does not); None when that comes before 11 s.
    stops = [(f.at_ns - t0) / NS for f in faults if f.hold_s != 0.0]
    t_end = min([gen_wall, *stops])
    steady = None
    if t_end >= 11.0:
        steady = round(sum(r[4] for r in stats.delivered if 10.0 <= r[0] < t_end) / (t_end - 10.0))
    by_fault: dict[int, list[str]] = {f.index: [] for f in faults}
    false: list[dict[str, Any]] = []
    for x in stats.findings:
        f = explained_by(faults, x, args.groups)
        if f is None:
            false.append(finding_brief(x, t0))
        else:
            by_fault[f.index].append(x["kind"])
    kinds: dict[str, int] = {}
    for x in stats.findings:
        kinds[x["kind"]] = kinds.get(x["kind"], 0) + 1
    fault_rows = []
    for f in faults:
        found = stats.found.get(f.index)
        after_stall = None
        if found is not None:
            after_stall = round(found[0] - (args.stall_after if f.kind == "hang" else 0.0), 2)
        fault_rows.append(
            {
                "fault": f.label(),
                "at_s": round((f.at_ns - t0) / NS, 1),
                "group": "0",
                "seq": fault_seq(f, args.groups),
                "to_finding_s": None if found is None else round(found[0], 2),
                "finding_after_stall_s": after_stall,
                "finding_kind": "" if found is None else found[1],
                "explains": by_fault[f.index],
            }
        )
    db_growth = last.db_bytes - first.db_bytes
    return {
        "job": sim.job,
        "digests": args.digests,
        "ship_completions": not args.drop_completions,
        "ranks": args.ranks,
        "hosts": args.hosts,
        "groups": args.groups,
        "servers": len(urls),
        "interval_s": args.interval,
        "rate_per_rank": args.rate,
        "duration_s": args.duration,
        "groups_resend_s": args.groups_resend_s,
        "wall_s": round(wall, 1),
        "offered_collectives_per_s": offered,
        "entries_per_s": round(stats.entries / wall),
        "steady_entries_per_s": steady,
        "batches_per_s": round(stats.batches / wall, 1),
        "entries": stats.entries,
        "kib_per_batch": round(stats.bytes_sent / max(1, stats.batches) / 1024, 1),
        # Both request kinds (ingest batches and, with --digests, digests): what leaves the hosts.
        "bytes_per_rank_per_s": round((stats.bytes_sent + stats.digest_bytes) / wall / args.ranks, 1),
        "ingest_bytes_per_rank_per_s": round(stats.bytes_sent / wall / args.ranks, 1),
        **({"digest": digest_figures(args, stats, wall, gen_wall)} if args.digests else {}),
        "request_ms": {p: round(pct([s for _, s in request_s], p) * 1000) for p in (50, 90, 99)},
        "request_ms_early_late_p50": [round(pct(early, 50) * 1000), round(pct(late, 50) * 1000)],
        "request_ms_early_late_p99": [round(pct(early, 99) * 1000), round(pct(late, 99) * 1000)],
        "delivery_ms": {p: round(pct([r[2] for r in stats.delivered], p) * 1000) for p in (50, 99)},
        "lag_s": {p: round(pct([r[3] for r in stats.delivered], p), 2) for p in (50, 99, 100)},
        "backlog_max_batches_per_host": backlog_max,
        "drained": drained,
        "throttled_429": len(stats.throttled),
        "unavailable_503": len(stats.unavailable),
        "errors": stats.errors,
        "late_ticks": stats.late_ticks,
        "faults": fault_rows,
        "findings": kinds,
        "false_findings": len(false),
        "false_finding_list": false[:20],
        "failover": stats.failover or None,
        "server_cpu": [round(c, 2) for c in cpu],
        # CPU ms per second of a simulated rank: the cost of one more rank.
        "server_cpu_ms_per_rank_s": [round(c * 1000 / args.ranks, 4) for c in cpu],
        "server_rss_mib": [round(r / 2**20) for r in rss_peak],
        "server_rss_mib_start_end": [
            [round(a / 2**20), round(b / 2**20)]
            for a, b in zip(first.server_rss, last.server_rss, strict=True)
        ],
        "generator_cpu": round((last.generator_cpu_s - first.generator_cpu_s) / wall, 2),
        "generator_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        # Per server: diagnoses run, the share of a core they took, batches per ingest transaction.
        "diagnoses": [m.get("flightdeck_diagnosis_duration_seconds_count", 0) for m in server_stats],
        "diagnosis_core_share": [
            round(m.get("flightdeck_diagnosis_duration_seconds_sum", 0) / wall, 3) for m in server_stats
        ],
        "batches_per_transaction": [
            round(
                m.get("flightdeck_ingest_group_size_batches_sum", 0)
                / max(1, m.get("flightdeck_ingest_group_size_batches_count", 0)),
                1,
            )
            for m in server_stats
        ],
        "machine_busy": round(
            (last.machine[0] - first.machine[0]) / max(1.0, last.machine[1] - first.machine[1]), 2
        ),
        **(
            {
                "postgres_cpu": round((last.pg_cpu_s - first.pg_cpu_s) / wall, 2),
                "postgres_cpu_ms_per_rank_s": round(
                    (last.pg_cpu_s - first.pg_cpu_s) / wall * 1000 / args.ranks, 4
                ),
                "postgres_mem_mib_start_end": [round(first.pg_mem / 2**20), round(last.pg_mem / 2**20)],
                "postgres_mem_source": PG_MEM_SOURCE[0],
                "postgres_backends": last.pg_backends,
            }
            if db_url.startswith("postgresql")
            else {}
        ),
        **(
            {
                "db_mib": round(last.db_bytes / 2**20, 1),
                "db_mib_start_end": [round(first.db_bytes / 2**20, 1), round(last.db_bytes / 2**20, 1)],
                "db_mib_per_hour": round(db_growth / 2**20 / wall * 3600),
            }
            if db_url
            else {}
        ),
        "window_s": args.window_s,
        "windows": windows(stats, args.ranks, wall, args.window_s),
    }
