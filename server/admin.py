"""The admin API: collector tokens over HTTP, authenticated by the admin token.

    POST   /api/v1/admin/tokens          {"name", "host" | "any_host": true, "jobs": [...]}  -> 201
    GET    /api/v1/admin/tokens          every token (never the secret)
    DELETE /api/v1/admin/tokens/{name}   revoke                                             -> 204

The same operations as `flightdeck token create|list|revoke`, for a control plane whose database
is out of reach (a container). A created token is in the answer once; only its hash is stored.
"""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, model_validator
from sqlalchemy.exc import IntegrityError

from flightdeck.limits import MAX_HOST, name_problem
from flightdeck.server import store
from flightdeck.server.access import check_admin
from flightdeck.server.errors import ConflictError, NotFoundError
from flightdeck.server.ingest import hash_token, new_token
from flightdeck.server.models import CollectorToken
from flightdeck.server.services import Services
from flightdeck.server.token_scope import TokenScope

NS = 1_000_000_000
#: Longest collector name, host name and job pattern accepted (the host column's width).
MAX_NAME_CHARS = MAX_HOST

router = APIRouter(prefix="/api/v1/admin", tags=["admin"])


async def _services(request: Request) -> Services:
    svc: Services = request.app.state.services
    return svc


async def admin_auth(request: Request, svc: Annotated[Services, Depends(_services)]) -> None:
    """Refuse requests without the admin token."""
    check_admin(svc.settings, request.headers.get("authorization"))


AdminServices = Annotated[Services, Depends(_services)]
NameParam = Annotated[str, Path(min_length=1, max_length=MAX_NAME_CHARS)]


class TokenRequest(BaseModel):
    """A collector token to create: scoped to a host (and optionally job patterns), or any host."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS, description="Collector name.")
    host: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description="The host the collector reports; the token may write only its ranks.",
    )
    any_host: bool = Field(default=False, description="An unscoped token (any host's ranks).")
    jobs: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]] | None = Field(
        default=None, max_length=100, description="Shell-style job name patterns (default: any job)."
    )

    @model_validator(mode="after")
    def _one_scope(self) -> TokenRequest:
        if (self.host is None) == (not self.any_host):
            raise ValueError("give either host (the collector's host name) or any_host: true")
        names = [("name", self.name), ("host", self.host), *(("jobs", j) for j in self.jobs or [])]
        for what, value in names:
            why = None if value is None else name_problem(value, MAX_HOST)
            if why is not None:
                raise ValueError(f"{what}: {why}")
        return self


def _token_json(t: CollectorToken) -> dict[str, Any]:
    return {
        "name": t.name,
        "active": t.revoked_at_ns is None,
        "host": t.host,
        "jobs": None if t.job_patterns is None else list(t.job_patterns),
        "scope": TokenScope.of(t.host, t.job_patterns).describe(),
        "created_at_s": round(t.created_at_ns / NS, 3),
        "revoked_at_s": None if t.revoked_at_ns is None else round(t.revoked_at_ns / NS, 3),
        "last_push_s": None if t.last_push_ns is None else round(t.last_push_ns / NS, 3),
    }


@router.post("/tokens", status_code=201, dependencies=[Depends(admin_auth)])
def create_token(svc: AdminServices, body: TokenRequest) -> dict[str, Any]:
    """Create a collector token; the answer holds it (`token`), the only time it is shown."""
    token = new_token()
    try:
        with svc.db.write() as session, session.begin():
            row = store.create_token(
                session=session,
                name=body.name,
                token_hash=hash_token(token),
                now_ns=time.time_ns(),
                host=body.host,
                job_patterns=body.jobs,
            )
            answer = _token_json(row)
    except IntegrityError:
        raise ConflictError(f"a collector named {body.name!r} exists already") from None
    return {**answer, "token": token}


@router.get("/tokens", dependencies=[Depends(admin_auth)])
def list_tokens(svc: AdminServices) -> list[dict[str, Any]]:
    """Every collector token, active and revoked, by name (hashes and secrets never)."""
    with svc.db.read() as session:
        return [_token_json(t) for t in store.list_tokens(session=session)]


@router.delete("/tokens/{name}", status_code=204, dependencies=[Depends(admin_auth)])
async def revoke_token(svc: AdminServices, name: NameParam) -> Response:
    """Revoke a collector's token (refused within the server's auth_cache_s)."""

    def revoke() -> bool:
        with svc.db.write() as session, session.begin():
            return store.revoke_token(session=session, name=name, now_ns=time.time_ns())

    if not await run_in_threadpool(revoke):
        raise NotFoundError(f"no active token for {name!r}")
    return Response(status_code=204)
