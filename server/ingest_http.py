"""`POST /api/v1/ingest` over HTTP: reading the request, the answer, and a plain ASGI fast path.

Ingest and digests are the routes whose rate grows with the size of the jobs: at 2,048 ranks a
process answers over a hundred batches a second, at 16,384 ranks a thousand digests. FastAPI's
routing, dependency solving, middleware and response encoding around ingest were about a fifth of
the process's GIL time (py-spy). So `IngestEndpoint` answers these paths before the app's
middleware stack (`app.FlightdeckApp`), with the same function the documented FastAPI routes
(`routes.ingest`, `routes.digest`, which OpenAPI describes) call: the same checks in the same
order, the same JSON answers and errors.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Mapping
from functools import partial
from typing import Any

import anyio.to_thread
import orjson
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.types import Message, Receive, Scope, Send

from flightdeck.server.digests import DIGEST_PATH, digest_request
from flightdeck.server.errors import ServerError, error_answer
from flightdeck.server.services import Services
from flightdeck.wire import BATCH_AGE_HEADER

INGEST_PATH = "/api/v1/ingest"
_AGE_HEADER = BATCH_AGE_HEADER.lower()


async def ingest_request(
    svc: Services, headers: Mapping[str, str], chunks: AsyncIterator[bytes], started: float
) -> dict[str, Any]:
    """Authenticate, take an in-flight slot (waiting in the queue for one), read the body up to
    the limit and apply it in a worker thread; returns the JSON answer or raises a `ServerError`.
    `headers`: lower-case names."""
    authorization = headers.get("authorization")
    collector = svc.ingest.cached(authorization)
    if collector is None:
        collector = await run_in_threadpool(svc.ingest.authenticate, authorization)
    await svc.ingest.acquire()
    try:
        svc.ingest.check_length(headers.get("content-length"))
        limit = svc.settings.max_request_bytes
        parts: list[bytes] = []
        size = 0
        # Read in chunks and stop at the limit: a body without Content-Length cannot exhaust memory.
        async for chunk in chunks:
            size += len(chunk)
            if size > limit:
                raise svc.ingest.too_large()
            parts.append(chunk)
        # On the ingest's own threads, one per in-flight slot: on the shared pool (40 threads)
        # a group commit could hold every thread waiting for its write, and no batch was decoded
        # while the database worked.
        work = partial(
            svc.ingest.ingest,
            body=b"".join(parts),
            encoding=headers.get("content-encoding"),
            collector=collector,
            started=started,
            batch_age_ms=headers.get(_AGE_HEADER),
        )
        return await anyio.to_thread.run_sync(work, limiter=svc.ingest.threads)
    finally:
        svc.ingest.release()


class _Disconnected(Exception):
    """The client went away before its body arrived: nobody to answer."""


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Disconnected
        yield message.get("body", b"")
        if not message.get("more_body", False):
            return


class IngestEndpoint:
    """The ASGI app answering `POST /api/v1/ingest` and `POST /api/v1/digest`
    (`flightdeck.server.digests`): `serves` says which requests are its."""

    def __init__(self, services: Services) -> None:
        self.services = services

    @staticmethod
    def serves(scope: Scope) -> bool:
        """Whether the request is one of the two this endpoint answers."""
        return (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in (INGEST_PATH, DIGEST_PATH)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        started = time.perf_counter()
        # ASGI gives header names in lower case; a repeated header keeps its last value.
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        extra: dict[str, str] = {}
        try:
            if path == DIGEST_PATH:
                status, answer = 200, await digest_request(self.services, headers, _body(receive))
            else:
                status, answer = 200, await ingest_request(self.services, headers, _body(receive), started)
        except _Disconnected:
            return
        except ServerError as exc:
            status, extra, answer = error_answer(exc)
        except OperationalError:
            status, extra, answer = error_answer(self.services.db_unavailable())
        body = orjson.dumps(answer)
        start: Message = {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.lower().encode(), v.encode()) for k, v in extra.items()),
            ],
        }
        await send(start)
        await send({"type": "http.response.body", "body": body})
