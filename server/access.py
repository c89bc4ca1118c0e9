"""Who may read and who may administer: the bearer checks of the read API, /metrics and the
admin API (ingest checks its collector tokens itself, in `IngestService.authenticate`).

    reads (require_read_token on)   a collector's token, read_token or admin_token
    admin API                       admin_token only; unset: the admin API is off (403)

Static secrets are compared in constant time; a wrong one is 403, a missing one 401.
"""

from __future__ import annotations

import hmac

from flightdeck.server.errors import AuthError, ForbiddenError
from flightdeck.server.ingest import IngestService
from flightdeck.server.settings import ServerSettings


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header; None when it is not one."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _same(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def check_read(settings: ServerSettings, ingest: IngestService, authorization: str | None) -> None:
    """Raise AuthError unless reads are open or `authorization` carries a token that may read.
    Blocking (it may ask the database about a collector token): call it in a worker thread."""
    if not settings.require_read_token:
        return
    token = bearer(authorization)
    if token is None:
        # Not `ingest.authenticate`: with allow_unauthenticated_ingest it lets a missing token in.
        raise AuthError("this server requires a bearer token for reads")
    for static in (settings.read_token, settings.admin_token):
        if static is not None and _same(token, static):
            return
    ingest.authenticate(authorization)


def check_admin(settings: ServerSettings, authorization: str | None) -> None:
    """Raise unless `authorization` carries the admin token (ForbiddenError when the admin API is
    off or the token is wrong, AuthError when none is given)."""
    if settings.admin_token is None:
        raise ForbiddenError("the admin API is off: set FLIGHTDECK_SERVER_ADMIN_TOKEN on the server")
    token = bearer(authorization)
    if token is None:
        raise AuthError("the admin API needs 'Authorization: Bearer <admin token>'")
    if not _same(token, settings.admin_token):
        raise ForbiddenError("not the admin token")
