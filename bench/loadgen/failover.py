"""The owner of the job killed mid-run (`--kill-owner-at`): how long until another server
diagnoses the job again.

Which process owns a job is whichever holds its advisory lock; from outside, it is the one that
exports the job's series (`flightdeck.server.export.ExportPolicy`: only the owner does). At the
chosen moment the owner is killed with SIGKILL (no clean shutdown: its connections, and with them
its locks, die with it), the senders that were talking to it move to the next live server as a
load balancer would send them, and the other servers' diagnosis counts are polled until one of
them moves: the seconds from the kill to that are the failover.
A job on digests is diagnosed in full only when a round's entries come, minutes apart, but the
process taking it over rebuilds it from the store and diagnoses it at once: until then its board
cannot page, so that diagnosis is the takeover's end there too.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx

from bench.loadgen.stats import Stats
from bench.loadgen.transport import Servers, scrape

DIAGNOSES = "flightdeck_diagnosis_duration_seconds_count"


async def diagnoses(client: httpx.AsyncClient, url: str) -> float | None:
    """A server's count of diagnoses run (None when it does not answer)."""
    return (await scrape(client, url)).get(DIAGNOSES)


async def exports_job(client: httpx.AsyncClient, url: str, job: str) -> bool:
    """Whether a server exports series of the job (its owner does; False when it does not answer)."""
    try:
        text = (await client.get(f"{url}/metrics", timeout=30)).text
    except httpx.HTTPError:
        return False
    return f'job="{job}"' in text


async def kill_owner(
    client: httpx.AsyncClient, servers: Servers, job: str, at_s: float, stats: Stats, timeout_s: float = 120.0
) -> None:
    """At `at_s` seconds into the run, SIGKILL the server that owns the job, then record in
    `stats.failover` how long until another server's diagnosis count moves."""
    await asyncio.sleep(max(0.0, stats.start + at_s - time.perf_counter()))
    owners = [i for i, u in enumerate(servers.urls) if await exports_job(client, u, job)]
    if len(owners) != 1:
        stats.failover = {"error": f"{len(owners)} servers export the job's series, not one"}
        return
    owner = owners[0]
    before = [await diagnoses(client, u) for u in servers.urls]
    os.kill(servers.pids[owner], signal.SIGKILL)
    killed = time.perf_counter()
    servers.alive[owner] = False
    others = [i for i in range(len(servers.urls)) if i != owner]
    while time.perf_counter() - killed < timeout_s:
        for i in others:
            c = await diagnoses(client, servers.urls[i])
            if c is not None and c > (before[i] or 0):
                stats.failover = {
                    "killed_server": owner,
                    "killed_at_s": round(killed - stats.start, 1),
                    "diagnosis_back_s": round(time.perf_counter() - killed, 2),
                    "by_server": i,
                }
                return
        await asyncio.sleep(0.1)
    stats.failover = {
        "killed_server": owner,
        "killed_at_s": round(killed - stats.start, 1),
        "diagnosis_back_s": None,
    }
