"""Malformed and edge-case requests for a real server, and the tally of how it answered.

(A module of helpers, not tests: `tests/test_hostile_input.py` drives it with hypothesis, and
`bench/hostile_input.py` with a seeded random corpus.) A request is chosen by a few integers
(`Choice`), so hypothesis can explore and shrink the space while a bench draws them at random.

Every ingest request carries, beside the hostile part, healthy snapshots of their own jobs
(`healthy-<n>`): those must be stored whatever else the batch holds, which is how "entries lost"
is counted. Reads take their routes from the server's OpenAPI schema, plus the dashboard pages.
"""

from __future__ import annotations

import copy
import gzip
import json
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx

from flightdeck.nixl_records import Histogram, NixlSample
from flightdeck.server import store
from flightdeck.server.db import connect
from flightdeck.wire import encode_batch
from tests.support.server_batches import make_batch, scenario_dumps, snapshots

#: Integers at and around every bound the store and the validation have.
INTS: tuple[int, ...] = (
    -(2**63) - 1, -(2**63), -(2**31) - 1, -1, 0, 1, 7, 2**31 - 1, 2**31, 2**32, 2**53 + 1,
    1_048_575, 1_048_576, 1_048_577, 10_000_000, 2_000_000_000, 2_592_000_000,
    2**63 - 1, 2**63, 2**64 - 1,
)  # fmt: skip
#: Everything else a JSON value can be, with the strings a store or a terminal chokes on.
OTHERS: tuple[Any, ...] = (
    None, True, False, 1.5, -0.0, 1e308, -1e308, "", "0", "abc", "\x00", "a\x00b",
    "\x1b[31mred\x1b[0m", "\x1b]0;title\x07", "\r\n", "\x7f\x9b", "x" * 129, "x" * 257, "x" * 5000,
    "é漢🙂", "<script>alert(1)</script>", "'; DROP TABLE jobs; --", [], [1, 2], [None], [[1]],
    {}, {"a": 1}, {"": None},
)  # fmt: skip
VALUES: tuple[Any, ...] = INTS + OTHERS

#: Top-level fields of a batch, of a snapshot, and entry columns, signature and group fields.
BATCH_FIELDS = ("wire_version", "batch_id", "collector", "sent_at_ns", "stacks", "sigs", "snapshots", "nixl")
SNAPSHOT_FIELDS = (
    "job", "attempt", "rank", "snapshot_time_ns", "kind", "world_size", "local_rank", "host", "pid",
    "torch_version", "backend", "version", "interval_s", "exception", "wrapped", "oldest_record_id",
    "groups", "thread_stacks", "entries", "source", "config",
)  # fmt: skip
COLUMNS = (
    "n",
    "rid",
    "g",
    "seq",
    "p2p",
    "opid",
    "st",
    "ret",
    "tc",
    "ts",
    "td",
    "dur",
    "to",
    "thr",
    "peer",
    "sig",
    "stk",
)
SIG_FIELDS = ("be", "op", "isp2p", "isz", "osz", "idt", "odt")
NIXL_FIELDS = (
    "host",
    "agent",
    "pid",
    "local_rank",
    "source",
    "read_time_ns",
    "run",
    "tx_bytes",
    "errors",
    "v",
)

#: Dashboard pages (not in the OpenAPI schema), with `{job}` and `{rank}` to fill.
WEB_PATHS = (
    "/",
    "/nixl",
    "/jobs/{job}",
    "/jobs/{job}/ranks/{rank}",
    "/jobs/{job}/cell",
)
WEB_QUERY = ("group", "start", "ranks", "expand", "view", "seq", "rank", "format")

#: Kinds of request, by weight: mutated batches most, then reads, then raw garbage.
KINDS = (
    "snapshot",
    "snapshot",
    "snapshot",
    "column",
    "column",
    "batch",
    "sig",
    "nixl",
    "raw",
    "read",
    "read",
    "read",
)


@dataclass(frozen=True, slots=True)
class Choice:
    """What one request is: a kind, then indexes into the fields and values (taken modulo)."""

    kind: int
    where: int
    value: int
    extra: int


@dataclass(frozen=True, slots=True)
class Request:
    """One HTTP request, and the healthy entries it carries per job (stored if all is well)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes = b""
    healthy: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class Tally:
    """How the server answered a corpus."""

    tried: int = 0
    by_status: dict[int, int] = field(default_factory=dict)
    server_errors: list[str] = field(default_factory=list)
    #: Requests after which the server had closed the connection (a new one had to be opened).
    dropped: int = 0
    #: Requests that got no answer at all (the connection failed or timed out).
    no_answer: list[str] = field(default_factory=list)
    #: The request sent on a new connection each time, for the report.
    drops: list[str] = field(default_factory=list)
    #: Healthy entries sent per job, in batches the server said it applied.
    healthy: dict[str, int] = field(default_factory=dict)

    @property
    def five_xx(self) -> int:
        """Answers >= 500."""
        return sum(n for s, n in self.by_status.items() if s >= 500)


class Corpus:
    """Builds requests from `Choice`s: real healthy snapshots of real dumps, then one edit."""

    def __init__(self, now_ns: int, token: str | None = None, openapi: dict[str, Any] | None = None) -> None:
        dumps = scenario_dumps("healthy_4")
        snaps = snapshots([dumps[r][-1] for r in sorted(dumps)])
        self._base: dict[str, Any] = encode_batch(make_batch(snaps, sent_at_ns=now_ns))
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._n = 0
        self._reads = _read_routes(openapi or {})
        self._bomb_body: bytes | None = None
        self._nixl = NixlSample(
            host="node-1",
            agent="agent-a",
            pid=42,
            local_rank=0,
            source="mp",
            read_time_ns=now_ns,
            run="r1",
            format_version=1,
            tx_bytes=1,
            rx_bytes=1,
            tx_requests=1,
            rx_requests=1,
            memory_registered_bytes=0,
            memory_deregistered_bytes=0,
            errors=(),
            events_dropped=0,
            xfer_time=Histogram.empty((10.0, 100.0)),
            post_time=Histogram.empty((10.0, 100.0)),
        ).to_wire()

    def request(self, c: Choice) -> Request:
        """The request `c` stands for."""
        self._n += 1
        kind = KINDS[c.kind % len(KINDS)]
        if kind == "read":
            return self._read(c)
        if kind == "raw":
            return self._raw(c)
        doc = copy.deepcopy(self._base)
        doc["batch_id"] = f"{uuid.uuid4().hex}"
        healthy_job = f"healthy-{uuid.uuid4().hex[:8]}"
        for s in doc["snapshots"]:
            s["job"] = healthy_job
        victim = copy.deepcopy(doc["snapshots"][c.extra % len(doc["snapshots"])])
        victim["job"] = f"hostile-{self._n}"
        value = VALUES[c.value % len(VALUES)]
        healthy = {healthy_job: sum(s["entries"]["n"] for s in doc["snapshots"])}
        if kind == "snapshot":
            _put(victim, SNAPSHOT_FIELDS[c.where % len(SNAPSHOT_FIELDS)], value, c.extra)
        elif kind == "column":
            col = COLUMNS[c.where % len(COLUMNS)]
            entries = victim["entries"]
            n = entries["n"]
            if col == "n" or c.extra % 3 == 0 or not isinstance(entries.get(col), list):
                entries[col] = value if col == "n" or c.extra % 2 else [value] * max(1, n)
            else:
                entries[col][c.extra % max(1, n)] = value
        elif kind == "sig":
            # A signature of the victim's own (appended): only the victim refers to it.
            sig = copy.deepcopy(doc["sigs"][0])
            sig[SIG_FIELDS[c.where % len(SIG_FIELDS)]] = value
            doc["sigs"].append(sig)
            victim["entries"]["sig"] = [len(doc["sigs"]) - 1] * victim["entries"]["n"]
        elif kind == "nixl":
            sample = dict(self._nixl)
            sample[NIXL_FIELDS[c.where % len(NIXL_FIELDS)]] = value
            doc["nixl"] = [dict(self._nixl), sample]
        elif kind == "batch":
            doc["snapshots"].append(victim)
            name = BATCH_FIELDS[c.where % len(BATCH_FIELDS)]
            if name == "collector" and c.extra % 2:
                doc["collector"]["host"] = value
            else:
                doc[name] = value
            healthy = {}  # the batch itself is bad: nothing of it need be kept
        if kind != "batch":
            doc["snapshots"].append(victim)
        return Request("POST", "/api/v1/ingest", self._ingest_headers(), _gzip_json(doc), healthy)

    def _ingest_headers(self) -> dict[str, str]:
        return {**self._auth, "Content-Encoding": "gzip", "Content-Type": "application/json"}

    def _bomb(self) -> bytes:
        """70 MB of spaces in 70 kB of gzip (over the default 64 MiB limit once decompressed)."""
        if self._bomb_body is None:
            self._bomb_body = gzip.compress(b" " * 70_000_000, compresslevel=9)
        return self._bomb_body

    def _raw(self, c: Choice) -> Request:
        rng = random.Random(c.value * 7919 + c.extra)
        good = _gzip_json(self._base)
        bodies: list[tuple[bytes, dict[str, str]]] = [
            (rng.randbytes(rng.randrange(1, 4096)), {"Content-Encoding": "gzip"}),
            (good[: rng.randrange(1, len(good))], {"Content-Encoding": "gzip"}),
            (json.dumps(VALUES[c.value % len(VALUES)]).encode(), {}),
            (b"[" * 10_000 + b"]" * 10_000, {}),
            (b'{"wire_version": 2}' + b" " * 100, {"Content-Encoding": "br"}),
            (self._bomb(), {"Content-Encoding": "gzip"}),
            (gzip.compress(b"\x00" * 1000), {"Content-Encoding": "gzip"}),
            (json.dumps({**self._base, "snapshots": [self._base["snapshots"][0]] * 3}).encode(), {}),
        ]
        body, headers = bodies[c.where % len(bodies)]
        return Request(
            "POST", "/api/v1/ingest", {**self._auth, "Content-Type": "application/json", **headers}, body
        )

    def _read(self, c: Choice) -> Request:
        routes = [*self._reads, *((p, WEB_QUERY) for p in WEB_PATHS)]
        template, params = routes[c.where % len(routes)]
        rng = random.Random(c.value * 104729 + c.extra)

        def text_value() -> str:
            v = VALUES[rng.randrange(len(VALUES))]
            return v if isinstance(v, str) else json.dumps(v) if not isinstance(v, int) else str(v)

        path = template
        for name in ("job", "rank"):
            if "{" + name + "}" in path or "{" + name + ":path}" in path:
                v = text_value() if rng.random() < 0.7 else "healthy-job"
                path = path.replace("{" + name + ":path}", quote(v, safe="")).replace(
                    "{" + name + "}", quote(v, safe="")
                )
        query = {p: text_value() for p in params if rng.random() < 0.5}
        qs = "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
        return Request("GET", path + ("?" + qs if qs else ""), dict(self._auth))


def _put(obj: dict[str, Any], name: str, value: Any, extra: int) -> None:
    """Set a snapshot field, or one inside its groups / thread stacks / config for those."""
    if name == "groups" and extra % 3 and isinstance(obj.get("groups"), dict) and obj["groups"]:
        key = sorted(obj["groups"])[extra % len(obj["groups"])]
        if extra % 3 == 1:
            obj["groups"][key]["ranks"] = value if extra % 2 else [0, 1, value]
        else:
            obj["groups"][str(value)[:300]] = obj["groups"].pop(key)
    elif name == "thread_stacks" and extra % 2:
        obj["thread_stacks"] = [
            {"thread_name": value if extra % 4 == 1 else "t", "thread_id": value, "stk": None}
        ]
    elif name == "config" and extra % 2:
        obj["config"] = {"torch_version": value, "fr_buffer_size": value, "env": {"TORCH_X": value}}
    else:
        obj[name] = value


def _gzip_json(doc: Any) -> bytes:
    return gzip.compress(json.dumps(doc).encode(), compresslevel=1)


def _read_routes(openapi: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """(path template, query parameter names) of every GET operation of the OpenAPI schema."""
    out = []
    for path, ops in (openapi.get("paths") or {}).items():
        get = ops.get("get")
        if get is None:
            continue
        query = tuple(p["name"] for p in get.get("parameters") or [] if p.get("in") == "query")
        out.append((path, query))
    return out


def send(client: httpx.Client, req: Request, tally: Tally, last_addr: list[Any]) -> None:
    """Send one request on `client` (one keep-alive connection) and tally the answer; a changed
    local address means the server had closed the previous connection."""
    tally.tried += 1
    try:
        resp = client.request(req.method, req.path, content=req.body or None, headers=req.headers)
    except httpx.HTTPError as exc:
        tally.no_answer.append(f"{req.method} {req.path[:120]}: {type(exc).__name__}: {exc}")
        last_addr[0] = None
        return
    stream = resp.extensions.get("network_stream")
    addr = stream.get_extra_info("client_addr") if stream is not None else None
    if last_addr[0] is not None and addr != last_addr[0]:
        tally.dropped += 1
        tally.drops.append(f"connection dropped before {req.method} {req.path[:120]}")
    last_addr[0] = addr
    tally.by_status[resp.status_code] = tally.by_status.get(resp.status_code, 0) + 1
    if resp.status_code >= 500:
        tally.server_errors.append(f"{req.method} {req.path[:120]} -> {resp.status_code} {resp.text[:300]}")
    applied = resp.status_code == 200 or (resp.status_code == 422 and _json(resp).get("applied") is True)
    if applied:
        for job, n in req.healthy.items():
            tally.healthy[job] = tally.healthy.get(job, 0) + n


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        doc = resp.json()
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def entries_lost(expected: dict[str, int], stored: Callable[[Sequence[str]], dict[str, int]]) -> int:
    """Healthy entries the server said it applied but does not hold (`stored`: job -> entries)."""
    have = stored(list(expected))
    return sum(max(0, n - have.get(job, 0)) for job, n in expected.items())


def stored_entries(database_url: str, jobs: Sequence[str]) -> dict[str, int]:
    """Entries the database holds per job name."""
    db = connect(database_url)
    try:
        out = {}
        with db.read() as session:
            for name in jobs:
                j = store.get_job(session=session, name=name)
                out[name] = 0 if j is None else store.count_entries(session=session, job_id=j.id)
        return out
    finally:
        db.dispose()
