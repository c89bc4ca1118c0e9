"""The HTTP side: one host's batches delivered in order over its own keep-alive connection,
retried on 429/503 like `collector/pusher.py`, to the servers still alive (`Servers`); the
servers' metrics (`scrape`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from dataclasses import dataclass, field

import httpx

from bench.loadgen.job import NS
from bench.loadgen.stats import Stats
from flightdeck.wire import BATCH_AGE_HEADER


@dataclass(slots=True)
class Servers:
    """The servers' URLs and pids, and which are still alive (shared by the senders and pollers)."""

    urls: list[str]
    pids: list[int]
    alive: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.alive = [True] * len(self.urls)

    def live_url(self, prefer: int = 0) -> str:
        """The URL of server `prefer` when it is alive, else of the next live one."""
        n = len(self.urls)
        for k in range(n):
            i = (prefer + k) % n
            if self.alive[i]:
                return self.urls[i]
        return self.urls[prefer % n]


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The server's unlabelled samples from /metrics (empty if it does not answer)."""
    try:
        text = (await client.get(f"{url}/metrics", timeout=30)).text
    except httpx.HTTPError:
        return {}
    out = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("flightdeck_") and "{" not in name:
            with contextlib.suppress(ValueError):
                out[name] = float(value)
    return out


class Connection:
    """One keep-alive HTTP/1.1 connection, written and parsed by hand.

    A host sends one request at a time, so each sender keeps its own connection. httpx costs
    ~2 ms of CPU per request, which at thousands of simulated ranks made the generator, sharing
    the machine with the server, the bottleneck of the measurement; the bytes on the wire are
    the same (the server cannot tell).
    """

    def __init__(self, url: str) -> None:
        rest = url.split("://", 1)[1]
        host, _, port = rest.partition(":")
        self.host, self.port = host, int(port or 80)
        self._rw: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def post(
        self, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """POST `body`; returns (status, lower-cased headers, body). Raises OSError on failure."""
        if self._rw is None:
            self._rw = await asyncio.open_connection(self.host, self.port)
        reader, writer = self._rw
        head = f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        try:
            writer.write(head.encode() + b"\r\n" + body)
            await writer.drain()
            status_line = await reader.readuntil(b"\r\n")
            raw = await reader.readuntil(b"\r\n\r\n")
            got = {}
            for line in raw.decode("latin-1").split("\r\n"):
                k, sep, v = line.partition(":")
                if sep:
                    got[k.strip().lower()] = v.strip()
            data = await reader.readexactly(int(got.get("content-length", "0")))
            if got.get("connection", "").lower() == "close":
                self.close()
            return int(status_line.split()[1]), got, data
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError) as exc:
            self.close()
            raise OSError(f"request failed: {exc}") from exc

    def close(self) -> None:
        """Drop the connection (the next request opens a new one)."""
        if self._rw is not None:
            self._rw[1].close()
            self._rw = None


async def sender(
    servers: Servers,
    index: int,
    token: str,
    queue: asyncio.Queue[tuple[str, bytes, int, int] | None],
    stats: Stats,
) -> None:
    """Deliver one host's batches in order, one at a time, retrying 429/503 like the pusher, to
    server `index`, or the next live one once it is killed (as a load balancer would)."""
    headers = {
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "Authorization": f"Bearer {token}",
    }
    url = servers.live_url(index)
    conn = Connection(url)
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            batch_id, body, n, snap_ns = item
            first = time.perf_counter()
            while True:
                t = time.perf_counter()
                try:
                    # As the collector does: how long the batch has waited here, by this clock.
                    age = {BATCH_AGE_HEADER: f"{(time.time_ns() - snap_ns) / 1e6:.0f}"}
                    status, got, text = await conn.post(
                        "/api/v1/ingest", {**headers, "Idempotency-Key": batch_id, **age}, body
                    )
                except OSError:
                    stats.errors += 1
                    if servers.live_url(index) != url:
                        url = servers.live_url(index)
                        conn = Connection(url)
                    await asyncio.sleep(0.5)
                    continue
                now = time.perf_counter()
                if status in (429, 503):
                    (stats.throttled if status == 429 else stats.unavailable).append(now - stats.start)
                    retry = float(got.get("retry-after", "1"))
                    await asyncio.sleep(retry * (0.5 + random.random()))
                    continue
                if status != 200:
                    stats.errors += 1
                    print(f"batch {batch_id}: HTTP {status} {text[:200]!r}", file=sys.stderr)
                    break
                lag = (time.time_ns() - snap_ns) / NS
                stats.delivered.append((now - stats.start, now - t, now - first, lag, n, len(body)))
                stats.entries += n
                stats.batches += 1
                stats.bytes_sent += len(body)
                break
    finally:
        conn.close()
