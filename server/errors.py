"""The server's exceptions; one handler in `flightdeck.server.app` maps them to HTTP responses.

    ServerError                      500  (base: anything the server refuses or cannot do)
     ├── AuthError                   401  missing, unknown or revoked collector token
     ├── ForbiddenError              403  the token may not write this batch (another host's ranks)
     ├── NotFoundError               404  no such job / resource
     ├── PayloadTooLargeError        413  body (or its decompressed form) above max_request_bytes
     ├── UnsupportedEncodingError    415  a Content-Encoding other than gzip / identity
     ├── InvalidBatchError           422  not JSON, bad gzip, or not the wire format (message says why)
     ├── BusyError                   429  too many ingests in flight (Retry-After)
     └── UnavailableError            503  the database is locked or unreachable (Retry-After)

Routes raise these (or let the store's errors become them); `HTTPException` is for routes only.
`error_answer` gives the status, headers and JSON body of one.
"""

from __future__ import annotations


class ServerError(Exception):
    """Base of the server's errors; `status_code` is the HTTP status the handler answers with."""

    status_code = 500
    #: Seconds for a Retry-After header, when the client should simply try again later.
    retry_after_s: float | None = None

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retry_after_s is not None:
            self.retry_after_s = retry_after_s


class AuthError(ServerError):
    """Missing, unknown or revoked bearer token."""

    status_code = 401


class ForbiddenError(ServerError):
    """A valid token outside its scope: a batch for another host's ranks or another job."""

    status_code = 403


class NotFoundError(ServerError):
    """The job (or other resource) does not exist."""

    status_code = 404


class PayloadTooLargeError(ServerError):
    """The request body or its decompressed form exceeds the configured limit."""

    status_code = 413


class UnsupportedEncodingError(ServerError):
    """A Content-Encoding the server does not decode."""

    status_code = 415


class InvalidBatchError(ServerError):
    """The body is not a valid ingest batch; the message names the bad field."""

    status_code = 422


class BusyError(ServerError):
    """Backpressure: the bounded ingest concurrency is exhausted."""

    status_code = 429


class UnavailableError(ServerError):
    """The database is temporarily unusable (locked, restarting, unreachable)."""

    status_code = 503


def error_answer(exc: ServerError) -> tuple[int, dict[str, str], dict[str, str]]:
    """Status, headers and JSON body of a `ServerError` (Retry-After for transient ones)."""
    headers = {}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(max(1, round(exc.retry_after_s)))
    return exc.status_code, headers, {"detail": exc.message}
