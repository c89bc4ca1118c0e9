"""The HTTP side: one host's batches (or, with `--digests`, its digests and the batches the server
asks for) delivered in order over its own keep-alive connection, retried on 429/503 like
`collector/pusher.py`, to the servers still alive (`Servers`); the servers' metrics (`scrape`)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import orjson

from bench.loadgen.job import NS, Sim, Step
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


class Link:
    """One host's way to its server: its connection, moved to the next live server once that one
    is killed (as a load balancer would), and its requests retried like the pusher's."""

    def __init__(self, servers: Servers, index: int) -> None:
        self.servers, self.index = servers, index
        self.url = servers.live_url(index)
        self.conn = Connection(self.url)

    async def post(
        self, path: str, headers: Callable[[], dict[str, str]], body: bytes, stats: Stats
    ) -> tuple[int, bytes, float, float]:
        """POST `body` (with `headers()` as of each try) until it is answered other than 429/503:
        retried after `Retry-After` on those, after 0.5 s on a connection error (on the next live
        server once this one is dead). Returns (status, answer, seconds of the answered request,
        seconds since the first try)."""
        first = time.perf_counter()
        fresh = False
        while True:
            t = time.perf_counter()
            try:
                status, got, text = await self.conn.post(path, headers(), body)
            except OSError:
                if not fresh:
                    # A kept-alive connection the server closed while idle (uvicorn: after 5 s,
                    # the batches' connection between rounds): the next try opens a new one, at
                    # once and not counted as an error.
                    fresh = True
                    continue
                stats.errors += 1
                if self.servers.live_url(self.index) != self.url:
                    self.url = self.servers.live_url(self.index)
                    self.conn = Connection(self.url)
                await asyncio.sleep(0.5)
                continue
            now = time.perf_counter()
            if status in (429, 503):
                (stats.throttled if status == 429 else stats.unavailable).append(now - stats.start)
                retry = float(got.get("retry-after", "1"))
                await asyncio.sleep(retry * (0.5 + random.random()))
                continue
            return status, text, now - t, now - first

    def close(self) -> None:
        """Drop the connection."""
        self.conn.close()


def _headers(token: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Content-Encoding": "gzip",
        "Authorization": f"Bearer {token}",
    }


async def ingest(link: Link, token: str, batch: tuple[str, bytes, int], snap_ns: int, stats: Stats) -> None:
    """Deliver one batch (batch id, gzip body, entries) taken at `snap_ns`; count it in `stats`."""
    batch_id, body, n = batch
    base = {**_headers(token), "Idempotency-Key": batch_id}

    def headers() -> dict[str, str]:
        # As the collector does: how long the batch has waited here, by this clock.
        return {**base, BATCH_AGE_HEADER: f"{(time.time_ns() - snap_ns) / 1e6:.0f}"}

    status, text, took, since_first = await link.post("/api/v1/ingest", headers, body, stats)
    if status != 200:
        stats.errors += 1
        print(f"batch {batch_id}: HTTP {status} {text[:200]!r}", file=sys.stderr)
        return
    now = time.perf_counter()
    lag = (time.time_ns() - snap_ns) / NS
    stats.delivered.append((now - stats.start, took, since_first, lag, n, len(body)))
    stats.entries += n
    stats.batches += 1
    stats.bytes_sent += len(body)


async def sender(
    servers: Servers,
    index: int,
    token: str,
    queue: asyncio.Queue[tuple[str, bytes, int, int] | None],
    stats: Stats,
) -> None:
    """Deliver one host's batches in order, one at a time, retrying 429/503 like the pusher, to
    server `index`, or the next live one once it is killed (as a load balancer would)."""
    link = Link(servers, index)
    try:
        while True:
            item = await queue.get()
            if item is None:
                return
            batch_id, body, n, snap_ns = item
            await ingest(link, token, (batch_id, body, n), snap_ns, stats)
    finally:
        link.close()


async def digest_sender(
    servers: Servers,
    index: int,
    token: str,
    h: int,
    sim: Sim,
    queue: asyncio.Queue[tuple[list[Step], int] | None],
    stats: Stats,
) -> None:
    """Host `h` on progress digests, as a collector in digest mode (`collector/digests.py`): for
    each snapshot of its ranks (their `Step`s, taken at the given epoch ns) one
    `POST /api/v1/digest`; when the answer names the job, the batch of that snapshot (its changed
    entries, its open ones, and the spans' entries the answer names) is queued for
    `POST /api/v1/ingest`, else nothing more. The digests and the batches go on two connections,
    one request in flight on each, as a collector's flush and its pusher thread send them: a
    batch refused with 429 delays the next batches, not the digests. Both retried as `sender` (a
    collector does not retry a digest; no digest failed in the runs measured)."""
    link = Link(servers, index)
    base = _headers(token)
    batches: asyncio.Queue[tuple[tuple[str, bytes, int], int] | None] = asyncio.Queue()

    async def pusher() -> None:
        push = Link(servers, index)
        try:
            while (queued := await batches.get()) is not None:
                await ingest(push, token, queued[0], queued[1], stats)
        finally:
            push.close()

    pushing = asyncio.ensure_future(pusher())
    answered = 0  # the latest round shipped for (a collector answers each round once)
    try:
        while True:
            item = await queue.get()
            if item is None:
                batches.put_nowait(None)
                await pushing
                return
            steps, snap_ns = item
            body = sim.digest_body(h, steps, time.time_ns())
            status, text, took, _ = await link.post("/api/v1/digest", lambda: base, body, stats)
            now = time.perf_counter() - stats.start
            if status != 200:
                stats.errors += 1
                print(f"digest of host {h}: HTTP {status} {text[:200]!r}", file=sys.stderr)
                continue
            try:
                detail = [
                    d for d in orjson.loads(text)["detail"] if d["job"] == sim.job and d["attempt"] == 0
                ]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                stats.errors += 1
                print(f"digest of host {h}: unexpected answer {text[:200]!r}", file=sys.stderr)
                continue
            stats.digests.append((now, took, len(body), bool(detail)))
            stats.digest_bytes += len(body)
            round_id = int(detail[0].get("round") or 0) if detail else 0
            if round_id and round_id == answered:
                detail = []
            elif detail:
                answered = round_id
            if detail:
                # A mismatch round names the spans whose entries go too.
                spans = {str(g): int(k) for g, k in (detail[0].get("spans") or {}).items()}
                stats.span_answers += bool(spans)
                # A round for a stall's evidence names the ranks that ship.
                ranks = frozenset(int(r) for r in detail[0].get("ranks") or ())
                batch = sim.detail_batch(h, steps, spans, ranks)
                if batch is not None:
                    batches.put_nowait((batch, snap_ns))
    finally:
        if not pushing.done():
            pushing.cancel()
        link.close()
