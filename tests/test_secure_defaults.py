"""Secure by default: the shipped compose configuration leaves no read open, the admin token
manages collector tokens over HTTP, and placeholder secrets stop the server at start.

Every check runs a real `flightdeck server` process and talks to it over HTTP. The compose file is
resolved here (YAML plus `${VAR}` / `${VAR:?msg}` / `${VAR:-default}` interpolation from a test
.env), so the test needs no docker binary; the server gets exactly the `flightdeck` service's
environment, with the database pointed at the test PostgreSQL (compose's host `postgres` does not
exist here) and its data folder in a temporary one.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.routing import APIRoute
from prometheus_client import CollectorRegistry
from sqlalchemy.engine import make_url
from starlette.routing import Route

from flightdeck.launch.demo.ranks import free_port
from flightdeck.server.app import create_app
from flightdeck.server.settings import ServerSettings
from tests.support.compose import ENV_EXAMPLE, REPO, read_env_file, real_secrets, resolved_compose
from tests.support.server_process import ServerProcess

PROMETHEUS_CONFIG = REPO / "dashboards" / "prometheus" / "prometheus.yml"

#: The one route that answers without a token: the liveness probe (Docker's HEALTHCHECK, the load
#: balancer); it says only whether the database answers and its schema is this version's.
OPEN_ROUTES = {("GET", "/healthz")}


def base_env() -> dict[str, str]:
    """This interpreter's environment without any FLIGHTDECK_* variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}


def start_server(env: Mapping[str, str], log: Path) -> ServerProcess:
    """`flightdeck server` on a free 127.0.0.1 port with exactly `env` (plus ours), once it answers."""
    server = ServerProcess({**base_env(), **env}, log, "--log-level", "warning")
    server.start(timeout_s=90)
    return server


def app_routes(tmp_path: Path) -> list[tuple[str, str]]:
    """(method, path template) of every route of the app the compose settings build."""
    settings = ServerSettings(
        database_url=f"sqlite:///{tmp_path}/routes.db",
        migrate=True,
        require_read_token=True,
        read_token="r" * 32,
        web_token="w" * 32,
        admin_token="a" * 32,
    )
    app = create_app(settings, registry=CollectorRegistry(), start_workers=False)

    def walk(routes: list[Any]) -> Iterator[tuple[str, str]]:
        for route in routes:
            # An included router (FastAPI >= 0.165 keeps it whole; the app includes none with a prefix).
            included = getattr(route, "original_router", None)
            if included is not None:
                yield from walk(included.routes)
            elif isinstance(route, APIRoute | Route):
                for method in sorted(route.methods or ()):
                    if method != "HEAD":
                        yield method, route.path

    try:
        return list(walk(app.routes))
    finally:
        app.state.services.close()


def concrete(path: str) -> str:
    """A request path for a route template (one sample value per parameter)."""
    samples = {"job": "train-1", "rank": "0", "name": "htmx.min.js"}
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: samples.get(m.group(1), "x"), path)


@pytest.fixture
def compose_server(pg_database: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, str]]]:
    """A server started with the `flightdeck` service's environment of the resolved compose file."""
    secrets = real_secrets()
    env = dict(resolved_compose(secrets)["services"]["flightdeck"]["environment"])
    # Only where the database and the data folder are: compose's host `postgres` is not here.
    test_db = make_url(pg_database)
    shipped = make_url(env["FLIGHTDECK_SERVER_DATABASE_URL"])
    assert shipped.password == secrets["POSTGRES_PASSWORD"]
    env["FLIGHTDECK_SERVER_DATABASE_URL"] = shipped.set(
        host=test_db.host, port=test_db.port, database=test_db.database, username=test_db.username
    ).render_as_string(hide_password=False)
    env["FLIGHTDECK_SERVER_DATA_DIR"] = str(tmp_path / "data")
    server = start_server(env, tmp_path / "server.log")
    try:
        yield server, secrets
    finally:
        server.stop()


def test_compose_turns_every_guard_on() -> None:
    """The shipped service environment closes reads and pages, sets the admin token, and
    Prometheus scrapes with the read token it is handed as a secret."""
    secrets = real_secrets()
    doc = resolved_compose(secrets)
    env = doc["services"]["flightdeck"]["environment"]
    assert env["FLIGHTDECK_SERVER_REQUIRE_READ_TOKEN"] == "true"
    assert env["FLIGHTDECK_SERVER_READ_TOKEN"] == secrets["FLIGHTDECK_READ_TOKEN"]
    assert env["FLIGHTDECK_SERVER_WEB_TOKEN"] == secrets["FLIGHTDECK_WEB_TOKEN"]
    assert env["FLIGHTDECK_SERVER_ADMIN_TOKEN"] == secrets["FLIGHTDECK_ADMIN_TOKEN"]
    assert env.get("FLIGHTDECK_SERVER_ALLOW_UNAUTHENTICATED_INGEST", "false") == "false"
    # Only the server's own names: an old shared FLIGHTDECK_* name would warn at every start.
    assert all(k.startswith("FLIGHTDECK_SERVER_") for k in env if k.startswith("FLIGHTDECK_"))
    assert doc["secrets"]["flightdeck_read_token"] == {"environment": "FLIGHTDECK_READ_TOKEN"}
    assert "flightdeck_read_token" in doc["services"]["prometheus"]["secrets"]
    scrape = yaml.safe_load(PROMETHEUS_CONFIG.read_text(encoding="utf-8"))["scrape_configs"]
    (job,) = [j for j in scrape if j["job_name"] == "flightdeck"]
    assert job["authorization"] == {
        "type": "Bearer",
        "credentials_file": "/run/secrets/flightdeck_read_token",
    }


@pytest.mark.slow
def test_no_unauthenticated_read_in_the_shipped_compose_config(
    compose_server: tuple[ServerProcess, dict[str, str]], tmp_path: Path
) -> None:
    """Every route of the app, asked without a token (and with a wrong one), answers 401 or 403;
    the only exception is /healthz. The shipped tokens do open what each is for."""
    server, secrets = compose_server
    routes = app_routes(tmp_path)
    assert ("GET", "/metrics") in routes and ("GET", "/api/v1/jobs") in routes and ("GET", "/") in routes
    open_answers = []
    with httpx.Client(base_url=server.url, timeout=10) as client:
        for method, template in routes:
            for headers in ({}, {"Authorization": "Bearer not-a-token-0123456789"}):
                r = client.request(method, concrete(template), headers=headers)
                if (method, template) in OPEN_ROUTES:
                    assert r.status_code == 200
                elif r.status_code not in (401, 403):
                    open_answers.append((method, template, headers, r.status_code))
        assert open_answers == []
        # The OpenAPI schema and docs are not served while reads are closed.
        for path in ("/docs", "/redoc", "/openapi.json"):
            assert client.get(path).status_code in (401, 403, 404)
        read = {"Authorization": f"Bearer {secrets['FLIGHTDECK_READ_TOKEN']}"}
        metrics = client.get("/metrics", headers=read)
        assert metrics.status_code == 200 and "flightdeck_build_info" in metrics.text
        assert client.get("/api/v1/jobs", headers=read).status_code == 200
        assert client.get("/", headers=read).status_code == 401  # the read token is not the web token
        assert client.get("/", auth=("anyone", secrets["FLIGHTDECK_WEB_TOKEN"])).status_code == 200
        admin = {"Authorization": f"Bearer {secrets['FLIGHTDECK_ADMIN_TOKEN']}"}
        assert client.get("/api/v1/admin/tokens", headers=admin).json() == []
        assert client.get("/api/v1/admin/tokens", headers=read).status_code == 403


@pytest.mark.slow
def test_admin_token_manages_collector_tokens_over_http(tmp_path: Path) -> None:
    """Create, use, list and revoke a collector token through the admin API of a real server."""
    admin_token = "admin-" + uuid.uuid4().hex
    env = {
        "FLIGHTDECK_SERVER_DATA_DIR": str(tmp_path / "data"),
        "FLIGHTDECK_SERVER_ADMIN_TOKEN": admin_token,
        "FLIGHTDECK_SERVER_REQUIRE_READ_TOKEN": "true",
        # Revocation is seen on the next request (no cached verdict), so the test need not wait.
        "FLIGHTDECK_SERVER_AUTH_CACHE_S": "0",
    }
    server = start_server(env, tmp_path / "server.log")
    admin = {"Authorization": f"Bearer {admin_token}"}
    try:
        with httpx.Client(base_url=server.url, timeout=10) as client:
            tokens = "/api/v1/admin/tokens"
            assert client.get(tokens).status_code == 401
            assert client.get(tokens, headers={"Authorization": "Bearer " + "x" * 40}).status_code == 403
            assert client.post(tokens, json={"name": "node-7", "host": "node-7"}).status_code == 401
            # Scope is required: a host, or an explicit any_host.
            assert client.post(tokens, headers=admin, json={"name": "node-7"}).status_code == 422
            bad = client.post(tokens, headers=admin, json={"name": "n\x00", "host": "node-7"})
            assert bad.status_code == 422 and "control character" in bad.text
            made = client.post(
                tokens, headers=admin, json={"name": "node-7", "host": "node-7", "jobs": ["train-*"]}
            )
            assert made.status_code == 201, made.text
            body = made.json()
            token = body.pop("token")
            assert token.startswith("fdk_")
            assert body["name"] == "node-7" and body["scope"] == "host node-7, jobs train-*"
            again = client.post(tokens, headers=admin, json={"name": "node-7", "any_host": True})
            assert again.status_code == 409
            collector = {"Authorization": f"Bearer {token}"}
            assert client.get("/api/v1/jobs", headers=collector).status_code == 200
            listing = client.get(tokens, headers=admin).json()
            assert [(t["name"], t["active"]) for t in listing] == [("node-7", True)]
            assert token not in client.get(tokens, headers=admin).text
            assert client.delete(f"{tokens}/node-7", headers=collector).status_code == 403
            assert client.delete(f"{tokens}/node-7", headers=admin).status_code == 204
            assert client.delete(f"{tokens}/node-7", headers=admin).status_code == 404
            assert client.get("/api/v1/jobs", headers=collector).status_code == 401
            assert [t["active"] for t in client.get(tokens, headers=admin).json()] == [False]
    finally:
        server.stop()


@pytest.mark.slow
def test_admin_api_is_off_without_an_admin_token(tmp_path: Path) -> None:
    """No admin token configured: the admin API refuses everyone (403), with the reason."""
    server = start_server({"FLIGHTDECK_SERVER_DATA_DIR": str(tmp_path / "data")}, tmp_path / "server.log")
    try:
        r = httpx.get(f"{server.url}/api/v1/admin/tokens", headers={"Authorization": "Bearer " + "x" * 40})
        assert r.status_code == 403 and "FLIGHTDECK_SERVER_ADMIN_TOKEN" in r.text
    finally:
        server.stop()


def _start_and_fail(env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "flightdeck", "server", "--port", str(free_port())]
    return subprocess.run(command, env={**base_env(), **env}, capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_placeholder_secrets_of_env_example_are_refused_at_start(tmp_path: Path) -> None:
    """The server started with .env.example as it ships refuses to start: exit code 2 and one
    line per placeholder, naming the variable and never printing the value."""
    env = dict(resolved_compose(read_env_file(ENV_EXAMPLE))["services"]["flightdeck"]["environment"])
    env["FLIGHTDECK_SERVER_DATA_DIR"] = str(tmp_path / "data")
    result = _start_and_fail(env)
    assert result.returncode == 2, result.stderr
    for name in ("ADMIN_TOKEN", "READ_TOKEN", "WEB_TOKEN", "DATABASE_URL"):
        assert f"refusing to start: FLIGHTDECK_SERVER_{name}" in result.stderr
    assert "placeholder" in result.stderr
    assert "change-me" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "value,reason",
    [
        ("", "is empty"),
        ("short-secret", "is shorter than 16"),
        ("CHANGE-ME-please-0123", "is the placeholder"),
    ],
)
def test_unusable_secrets_are_refused_at_start(tmp_path: Path, value: str, reason: str) -> None:
    """An empty, short or placeholder admin token stops the server with the reason."""
    env = {"FLIGHTDECK_SERVER_DATA_DIR": str(tmp_path), "FLIGHTDECK_SERVER_ADMIN_TOKEN": value}
    result = _start_and_fail(env)
    assert result.returncode == 2
    assert f"FLIGHTDECK_SERVER_ADMIN_TOKEN (admin_token): {reason}" in result.stderr
    assert not value or value not in result.stderr
