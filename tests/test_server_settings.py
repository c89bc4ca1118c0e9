"""The server's settings: every field documented, defaults, environment, validation; the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from flightdeck.cli import main
from flightdeck.server.settings import ServerSettings


def test_every_setting_has_a_description() -> None:
    undocumented = [n for n, f in ServerSettings.model_fields.items() if not (f.description or "").strip()]
    assert undocumented == []


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ServerSettings.model_fields:
        monkeypatch.delenv(f"FLIGHTDECK_{name.upper()}", raising=False)
    s = ServerSettings(data_dir=tmp_path)
    # stall_after 5 s (issue 19): busy ranks are told apart by their evidence, not by a long wait.
    assert (s.host, s.port, s.stall_after_s, s.slow_ceiling_s) == ("127.0.0.1", 8470, 5.0, None)
    assert s.effective_database_url == f"sqlite:///{tmp_path.resolve()}/flightdeck.db"
    assert s.webhook_urls == []


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_PORT", "9999")
    monkeypatch.setenv("FLIGHTDECK_WEBHOOK_URLS", '["http://127.0.0.1:1/a", "https://example.invalid/b"]')
    monkeypatch.setenv("FLIGHTDECK_DATABASE_URL", "postgresql+psycopg://u@h/db")
    s = ServerSettings()
    assert s.port == 9999
    assert s.webhook_urls == ["http://127.0.0.1:1/a", "https://example.invalid/b"]
    assert s.effective_database_url == "postgresql+psycopg://u@h/db"


@pytest.mark.parametrize(
    "field,value",
    [("stall_after_s", 0.5), ("port", 0), ("max_inflight_ingests", 0), ("webhook_urls", ["ftp://x"])],
)
def test_invalid_values_are_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError):
        ServerSettings(**{field: value})  # type: ignore[arg-type]


def test_token_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path}/tokens.db"
    # Scoped to a host unless asked for an unscoped one (which the listing flags).
    assert main(["token", "--database-url", url, "create", "node-7"]) == 2
    assert "--host HOST" in capsys.readouterr().err
    assert main(["token", "--database-url", url, "create", "node-7", "--host", "node-7"]) == 0
    token = capsys.readouterr().out.strip()
    assert token.startswith("fdk_") and len(token) > 40
    assert main(["token", "--database-url", url, "create", "node-7", "--host", "node-7"]) == 1
    assert main(["token", "--database-url", url, "create", "shared", "--any-host", "--jobs", "train-*"]) == 0
    assert main(["token", "--database-url", url, "create", "legacy", "--any-host"]) == 0
    capsys.readouterr()
    assert main(["token", "--database-url", url, "list"]) == 0
    listing = capsys.readouterr().out
    assert "node-7\tactive" in listing and token not in listing
    lines = {ln.split("\t")[0]: ln.split("\t")[-1] for ln in listing.splitlines()}
    assert lines == {
        "legacy": "UNSCOPED (any host, any job)",
        "node-7": "host node-7, any job",
        "shared": "any host, jobs train-*",
    }
    assert main(["token", "--database-url", url, "revoke", "node-7"]) == 0
    assert main(["token", "--database-url", url, "revoke", "node-7"]) == 1
    main(["token", "--database-url", url, "list"])
    assert "node-7\trevoked" in capsys.readouterr().out
    assert token.encode() not in (tmp_path / "tokens.db").read_bytes()  # only the hash is stored


def test_migrations_match_the_models(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from flightdeck.server.db import connect, migrate
    from flightdeck.server.models import Base

    db = connect(f"sqlite:///{tmp_path}/m.db")
    try:
        migrate(db)
        migrate(db)  # idempotent
        with db.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
    finally:
        db.dispose()
