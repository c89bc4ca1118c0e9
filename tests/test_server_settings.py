"""The server's settings: every field documented, defaults, environment, validation; the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from flightdeck.cli import main
from flightdeck.env_names import LegacyEnvWarning
from flightdeck.launch.demo.ranks import free_port
from flightdeck.server.settings import ServerSettings


def test_every_setting_has_a_description() -> None:
    undocumented = [n for n, f in ServerSettings.model_fields.items() if not (f.description or "").strip()]
    assert undocumented == []


def test_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ServerSettings.model_fields:
        monkeypatch.delenv(f"FLIGHTDECK_{name.upper()}", raising=False)
        monkeypatch.delenv(f"FLIGHTDECK_SERVER_{name.upper()}", raising=False)
    s = ServerSettings(data_dir=tmp_path)
    # stall_after 5 s (issue 19): busy ranks are told apart by their evidence, not by a long wait.
    assert (s.host, s.port, s.stall_after_s, s.slow_ceiling_s) == ("127.0.0.1", 8470, 5.0, None)
    assert s.effective_database_url == f"sqlite:///{tmp_path.resolve()}/flightdeck.db"
    assert s.webhook_urls == []


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLIGHTDECK_SERVER_PORT", "9999")
    monkeypatch.setenv(
        "FLIGHTDECK_SERVER_WEBHOOK_URLS", '["http://127.0.0.1:1/a", "https://example.invalid/b"]'
    )
    monkeypatch.setenv("FLIGHTDECK_SERVER_DATABASE_URL", "postgresql+psycopg://u@h/db")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LegacyEnvWarning)
        s = ServerSettings()
    assert s.port == 9999
    assert s.webhook_urls == ["http://127.0.0.1:1/a", "https://example.invalid/b"]
    assert s.effective_database_url == "postgresql+psycopg://u@h/db"


def _clear(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FLIGHTDECK_"):
            monkeypatch.delenv(name)


def test_old_names_are_read_with_a_warning_naming_the_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """`FLIGHTDECK_<SETTING>` (the name shared with the collector and agent) still works for one
    release, lists decoded as before, and says which name to use."""
    _clear(monkeypatch)
    monkeypatch.setenv("FLIGHTDECK_PORT", "9999")
    monkeypatch.setenv("FLIGHTDECK_WEBHOOK_URLS", '["http://127.0.0.1:1/a"]')
    monkeypatch.setenv("FLIGHTDECK_STALL_AFTER_S", "7")
    with pytest.warns(LegacyEnvWarning) as record:
        s = ServerSettings()
    assert (s.port, s.webhook_urls, s.stall_after_s) == (9999, ["http://127.0.0.1:1/a"], 7.0)
    said = sorted(str(w.message) for w in record)
    assert any("FLIGHTDECK_PORT is deprecated, set FLIGHTDECK_SERVER_PORT instead" in m for m in said), said
    assert any(
        "FLIGHTDECK_STALL_AFTER_S is deprecated, set FLIGHTDECK_SERVER_STALL_AFTER_S" in m for m in said
    )


def test_the_new_name_wins_when_both_are_set(monkeypatch: pytest.MonkeyPatch) -> None:
    _clear(monkeypatch)
    monkeypatch.setenv("FLIGHTDECK_SERVER_HOST", "0.0.0.0")
    monkeypatch.setenv("FLIGHTDECK_HOST", "gpu-node-3")  # the collector's host name, of old
    with pytest.warns(
        LegacyEnvWarning, match="FLIGHTDECK_HOST is ignored because FLIGHTDECK_SERVER_HOST is set"
    ):
        s = ServerSettings()
    assert s.host == "0.0.0.0"


def test_other_processes_names_are_not_server_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The collector's old FLIGHTDECK_SERVER_URL (its server's address) and the collector's and
    agent's new names change nothing in the server's settings, and warn about nothing."""
    _clear(monkeypatch)
    monkeypatch.setenv("FLIGHTDECK_SERVER_URL", "http://10.0.0.1:8470")
    monkeypatch.setenv("FLIGHTDECK_COLLECTOR_HOST", "gpu-node-3")
    monkeypatch.setenv("FLIGHTDECK_AGENT_INTERVAL_S", "3")
    with warnings.catch_warnings():
        warnings.simplefilter("error", LegacyEnvWarning)
        s = ServerSettings()
    assert s == ServerSettings.model_validate({})
    assert "url" not in ServerSettings.model_fields


@pytest.mark.slow
def test_a_server_started_with_an_old_name_says_so(tmp_path: Path) -> None:
    """A real `flightdeck server` given its port under the old name listens there and logs the
    deprecation (a log line: DeprecationWarnings are hidden by default)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env.update(FLIGHTDECK_PORT=str(port), FLIGHTDECK_SERVER_DATA_DIR=str(tmp_path))
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flightdeck", "server"], env=env, stdout=out, stderr=out
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(20)
    assert "FLIGHTDECK_PORT is deprecated, set FLIGHTDECK_SERVER_PORT instead" in log.read_text()


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
