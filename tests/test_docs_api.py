"""docs/api.md names every path of the server's OpenAPI spec: a route added without a word for its
users fails here."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from flightdeck.server.app import create_app
from flightdeck.server.settings import ServerSettings

REPO = Path(__file__).resolve().parents[1]


def test_api_page_names_every_route(tmp_path: Path) -> None:
    settings = ServerSettings(data_dir=tmp_path, migrate=True)
    app = create_app(settings, registry=CollectorRegistry(), start_workers=False)
    try:
        paths = set(app.openapi()["paths"])
    finally:
        app.state.services.close()
    assert {"/api/v1/ingest", "/api/v1/jobs/{job}", "/healthz"} <= paths
    page = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    missing = sorted(p for p in paths if p not in page)
    assert not missing, f"docs/api.md does not mention {missing}"
