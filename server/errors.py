"""The server's exceptions; one handler in `flightdeck.server.app` maps them to HTTP responses.

    ServerError                      500  (base: anything the server refuses or cannot do)
     ├── AuthError                   401  missing, unknown or revoked collector token
     ├── ForbiddenError              403  the token may not write this batch (another host's ranks)
     ├── NotFoundError               404  no such job / resource
 ├── ConflictError               409  the resource exists already (a collector token's name)
     ├── PayloadTooLargeError        413  body (or its decompressed form) above max_request_bytes
     ├── UnsupportedEncodingError    415  a Content-Encoding other than gzip / identity
     ├── InvalidBatchError           422  not JSON, bad gzip, or not the wire format (message says why);
     │                                    with `refused`: the snapshots left out, one reason each
     ├── InvalidParameterError       422  a read's parameter the store cannot hold (message says which)
     ├── BusyError                   429  too many ingests in flight (Retry-After)
     └── UnavailableError            503  the database is locked or unreachable (Retry-After)

Routes raise these (or let the store's errors become them); `HTTPException` is for routes only.
`error_answer` gives the status, headers and JSON body of one. Anything else raised on any path
is answered by `InternalErrorMiddleware`: 500 with an `error_id`, logged once with that id.
"""

from __future__ import annotations

import json
import logging
import secrets
import traceback
from collections.abc import Callable
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)


class ServerError(Exception):
    """Base of the server's errors; `status_code` is the HTTP status the handler answers with."""

    status_code = 500
    #: Seconds for a Retry-After header, when the client should simply try again later.
    retry_after_s: float | None = None

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, extra: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s
        #: More fields of the JSON answer, beside `detail`.
        self.extra = extra or {}


class AuthError(ServerError):
    """Missing, unknown or revoked bearer token."""

    status_code = 401


class ForbiddenError(ServerError):
    """A valid token outside its scope: a batch for another host's ranks or another job."""

    status_code = 403


class NotFoundError(ServerError):
    """The job (or other resource) does not exist."""

    status_code = 404


class ConflictError(ServerError):
    """The resource to create exists already."""

    status_code = 409


class PayloadTooLargeError(ServerError):
    """The request body or its decompressed form exceeds the configured limit."""

    status_code = 413


class UnsupportedEncodingError(ServerError):
    """A Content-Encoding the server does not decode."""

    status_code = 415


class InvalidBatchError(ServerError):
    """The body is not a valid ingest batch; the message names the bad field."""

    status_code = 422


class InvalidParameterError(ServerError):
    """A query or path parameter outside what the store holds (a name with NUL, a huge int)."""

    status_code = 422


class BusyError(ServerError):
    """Backpressure: the bounded ingest concurrency is exhausted."""

    status_code = 429


class UnavailableError(ServerError):
    """The database is temporarily unusable (locked, restarting, unreachable)."""

    status_code = 503


def error_answer(exc: ServerError) -> tuple[int, dict[str, str], dict[str, Any]]:
    """Status, headers and JSON body of a `ServerError` (Retry-After for transient ones)."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return exc.status_code, headers, {"detail": exc.message, **exc.extra}


class InternalErrorMiddleware:
    """The outermost ASGI layer: an unexpected exception on any path becomes a 500 whose JSON
    body carries an `error_id`, logged once, on one line, with that id.

    Below it, Starlette's own error handling re-raises after its 500, and uvicorn then closes the
    connection: a collector with a keep-alive connection lost it on every 500. Answered here, the
    exception goes no further and the connection stays open. (An exception after the answer began
    cannot be answered any more; uvicorn closes that connection, as it must.)
    """

    def __init__(self, app: ASGIApp, on_error: Callable[[], None] | None = None) -> None:
        self.app = app
        self.on_error = on_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            error_id = secrets.token_hex(8)
            tb = traceback.extract_tb(exc.__traceback__)
            where = f"{tb[-1].filename}:{tb[-1].lineno} in {tb[-1].name}" if tb else "?"
            # One line per error (the id ties it to the answer); the traceback at debug level.
            # The path and the message may hold what a client sent: escaped, so neither a
            # newline nor an escape sequence reaches the log as such.
            log.error(
                "error_id=%s %s %s: %s: %s (at %s)",
                error_id,
                scope.get("method"),
                ascii(str(scope.get("path")))[1:-1],
                type(exc).__name__,
                ascii(str(exc)[:500])[1:-1],
                where,
            )
            log.debug("error_id=%s traceback", error_id, exc_info=exc)
            if self.on_error is not None:
                self.on_error()
            if started:
                raise
            body = json.dumps({"detail": "internal server error", "error_id": error_id}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
