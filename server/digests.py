"""`POST /api/v1/digest`: a collector's progress digests for its ranks (`flightdeck.digest`).

The collectors of large jobs send one every interval instead of their entries. The request is
authenticated with the collector tokens of ingest, checked value by value, folded into the jobs'
boards in memory (`LiveDiagnosis.take_digests`) and answered with the jobs whose entries the
collector is to ship now (`{"ranks": n, "detail": [{"job": ..., "attempt": ..., "spans": {group:
span}}]}`, `spans` only when the round is for a mismatch: those spans' entries are shipped too). No database
transaction and no worker thread: it is answered on the event loop, which is what keeps a digest
an order of magnitude cheaper than an ingest batch (`bench/loadgen --digests`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from fnmatch import fnmatchcase
from typing import Any

import orjson
from starlette.concurrency import run_in_threadpool

from flightdeck.digest import DigestError, DigestRequest, decode_digests
from flightdeck.server.errors import (
    ForbiddenError,
    InvalidBatchError,
    PayloadTooLargeError,
    UnsupportedEncodingError,
)
from flightdeck.server.ingest import Sender, gunzip_limited
from flightdeck.server.services import Services

DIGEST_PATH = "/api/v1/digest"
#: Largest digest body, compressed or not: a host's ranks are a few kB (8 ranks in 4 groups,
#: ~1 kB of JSON); the bound keeps what a request can make the server parse small.
MAX_DIGEST_BYTES = 4 * 1024 * 1024


def scope_refusal(request: DigestRequest, sender: Sender) -> str | None:
    """Why a scoped token may not send these digests (another host's, or another job's), or None."""
    scope = sender.scope
    if scope.host is not None and request.host != scope.host:
        return f"token {sender.name!r} is bound to host {scope.host!r}; these digests come from host {request.host!r}"
    if scope.jobs is not None:
        for b in request.blocks:
            if not any(fnmatchcase(b.job, p) for p in scope.jobs):
                return f"token {sender.name!r} may write jobs {', '.join(scope.jobs)}; a digest is of job {b.job!r}"
    return None


def take_digests(svc: Services, *, body: bytes, encoding: str | None, sender: Sender) -> dict[str, Any]:
    """Decode, check and fold one digest request; returns the answer. Raises ServerError subclasses."""
    enc = (encoding or "identity").strip().lower()
    try:
        if enc == "gzip":
            body = gunzip_limited(body, MAX_DIGEST_BYTES)
        elif enc != "identity":
            raise UnsupportedEncodingError(f"Content-Encoding {encoding!r} is not supported (use gzip)")
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise InvalidBatchError(f"body is not JSON: {exc}") from None
        try:
            request = decode_digests(doc)
        except DigestError as exc:
            raise InvalidBatchError(str(exc)) from None
    except PayloadTooLargeError:
        svc.metrics.digests.labels("rejected").inc()
        raise PayloadTooLargeError(f"digest body exceeds {MAX_DIGEST_BYTES} bytes") from None
    except (InvalidBatchError, UnsupportedEncodingError):
        svc.metrics.digests.labels("rejected").inc()
        raise
    refusal = scope_refusal(request, sender)
    if refusal is not None:
        svc.metrics.digests.labels("rejected").inc()
        raise ForbiddenError(refusal)
    detail = svc.live.take_digests(request)
    svc.metrics.digests.labels("accepted").inc()
    return {"ranks": request.ranks, "detail": [d.to_json() for d in detail]}


async def digest_request(
    svc: Services, headers: Mapping[str, str], chunks: AsyncIterator[bytes]
) -> dict[str, Any]:
    """Authenticate, read the body up to `MAX_DIGEST_BYTES` and take it; returns the JSON answer
    or raises a `ServerError`. `headers`: lower-case names."""
    authorization = headers.get("authorization")
    sender = svc.ingest.cached(authorization)
    if sender is None:
        sender = await run_in_threadpool(svc.ingest.authenticate, authorization)
    length = headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_DIGEST_BYTES:
        svc.metrics.digests.labels("rejected").inc()
        raise PayloadTooLargeError(f"body of {length} bytes exceeds {MAX_DIGEST_BYTES}")
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_DIGEST_BYTES:
            svc.metrics.digests.labels("rejected").inc()
            raise PayloadTooLargeError(f"body exceeds {MAX_DIGEST_BYTES} bytes")
        parts.append(chunk)
    # On the event loop: decoding and folding a host's digests is ~0.1 ms, less than a thread
    # hand-off, and touches no database.
    return take_digests(svc, body=b"".join(parts), encoding=headers.get("content-encoding"), sender=sender)
