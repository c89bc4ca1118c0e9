"""The application factory: `create_app(settings, clock=..., registry=..., http_client=...)`.

Everything that varies is injected, so tests run the real app in-process against a real database
with a fake clock, a fresh metrics registry and a webhook client of their choosing. The database
is opened (retried while unreachable) and its schema checked or migrated in `create_app`
(`flightdeck.server.services.build_services`); the background workers (diagnosis, webhooks,
retention) run while the app's lifespan does.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler, request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import DBAPIError, OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from flightdeck import __version__
from flightdeck.runtime_tuning import SERVER, tuned
from flightdeck.server.admin import router as admin_router
from flightdeck.server.errors import InternalErrorMiddleware, ServerError, UnavailableError, error_answer
from flightdeck.server.idle_restart import IdleRestart
from flightdeck.server.ingest_http import IngestEndpoint
from flightdeck.server.page_data import StoreData
from flightdeck.server.routes import router
from flightdeck.server.services import build_services
from flightdeck.server.settings import ServerSettings
from flightdeck.web.routes import SecurityHeadersMiddleware, WebSettings, error_page, make_router

log = logging.getLogger(__name__)

#: Paths that are not dashboard pages: the JSON API, operations and the OpenAPI docs keep their own
#: headers (the docs UI needs inline script, which the dashboard's CSP forbids).
NON_WEB_PREFIXES = ("/api/", "/metrics", "/healthz", "/docs", "/redoc", "/openapi.json")


class WebHeadersMiddleware:
    """`SecurityHeadersMiddleware` on the dashboard's paths only (every path but `NON_WEB_PREFIXES`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.secured = SecurityHeadersMiddleware(app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not str(scope.get("path", "")).startswith(NON_WEB_PREFIXES):
            await self.secured(scope, receive, send)
        else:
            await self.app(scope, receive, send)


class FlightdeckApp(FastAPI):
    """The FastAPI app, with ingest and digests answered ahead of its middleware stack
    (`fast_path`: `IngestEndpoint`, within `InternalErrorMiddleware`): Starlette's and FastAPI's
    own layers (error pages, telemetry, body limits) and ours would wrap each of the thousand
    digests a second of a 16,384-rank job, whose own work is ~0.1 ms, for nothing they use."""

    fast_path: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.fast_path is not None and IngestEndpoint.serves(scope):
            await self.fast_path(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def create_app(
    settings: ServerSettings,
    *,
    clock: Callable[[], int] = time.time_ns,
    registry: CollectorRegistry | None = None,
    http_client: httpx.Client | None = None,
    start_workers: bool = True,
    report: Callable[[str], None] = log.warning,
    idle_restart: IdleRestart | None = None,
) -> FlightdeckApp:
    """The Flightdeck server as an ASGI app; `app.state.services` holds its components.

    `start_workers=False` leaves the diagnosis, webhook and retention threads off, so a test can
    drive them step by step (`services.live.step(force=True)`). `report` gets one line per failed
    attempt to reach the database at start. `idle_restart`: told when the server has started
    and whenever the diagnosis worker holds no job (`flightdeck server` restarts in place).
    """
    services = build_services(
        settings, clock=clock, registry=registry, http_client=http_client, report=report
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        with tuned(SERVER):  # the GC and the GIL switch interval, while the app runs
            if start_workers:
                services.start()
            if idle_restart is not None:
                idle_restart.at_rest()
                services.live.on_idle = idle_restart.idle
            try:
                yield
            finally:
                services.close()

    app = FlightdeckApp(
        title="Flightdeck",
        version=__version__,
        description="Live hang and mismatch detection for PyTorch distributed jobs.",
        lifespan=lifespan,
        # Closed reads close the docs too: the schema would be the one unauthenticated read.
        docs_url=None if settings.require_read_token else "/docs",
        redoc_url=None if settings.require_read_token else "/redoc",
        openapi_url=None if settings.require_read_token else "/openapi.json",
    )
    app.state.services = services

    async def handle(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ServerError)
        status, headers, body = error_answer(exc)
        return JSONResponse(body, status_code=status, headers=headers)

    async def handle_db(request: Request, exc: Exception) -> JSONResponse:
        lost_connection = isinstance(exc, OperationalError) and services.db.dialect != "sqlite"
        # (On PostgreSQL a missing table is never an OperationalError: see IngestService.)
        reason = None if lost_connection else await run_in_threadpool(services.schema_reason)
        if reason is not None:  # "no such table": the schema went away
            services.metrics.db_errors.inc()
            return await handle(request, UnavailableError(reason, retry_after_s=settings.retry_after_s))
        if not isinstance(exc, OperationalError):
            raise exc
        return await handle(request, services.db_unavailable())

    def wants_html(request: Request) -> bool:
        # The dashboard's pages (not the API, not ?format=json): a person reads the answer.
        path = request.url.path
        return not path.startswith(NON_WEB_PREFIXES) and request.query_params.get("format") != "json"

    async def handle_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if wants_html(request):
            return error_page(exc.status_code, str(exc.detail), headers=exc.headers)
        return await http_exception_handler(request, exc)

    async def handle_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        if wants_html(request):
            reasons = "; ".join(f"{e['loc'][-1]}: {e['msg']}" for e in exc.errors())
            return error_page(422, f"bad parameter: {reasons}")
        return await request_validation_exception_handler(request, exc)

    app.add_exception_handler(ServerError, handle)
    app.add_exception_handler(DBAPIError, handle_db)
    app.add_exception_handler(StarletteHTTPException, handle_http)
    app.add_exception_handler(RequestValidationError, handle_validation)
    app.include_router(router)
    app.include_router(admin_router)
    web = StoreData(db=services.db, live=services.live, clock=clock, job_idle_s=settings.job_idle_s)
    app.include_router(make_router(web, WebSettings(token=settings.web_token)))
    app.add_middleware(WebHeadersMiddleware)
    # Outermost: an unexpected error anywhere (ingest included) is a 500 with an id.
    app.add_middleware(InternalErrorMiddleware, on_error=services.metrics.server_errors.inc)
    app.fast_path = InternalErrorMiddleware(
        IngestEndpoint(services), on_error=services.metrics.server_errors.inc
    )
    return app
