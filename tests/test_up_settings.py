"""`flightdeck up`'s settings and its collector-token provisioning (real SQLite, no processes)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from flightdeck.cli import main
from flightdeck.launch.local_stack import port_in_use, provision_token, sqlite_url
from flightdeck.launch.up import UpSettings, banner


def test_every_setting_has_a_description() -> None:
    undocumented = [n for n, f in UpSettings.model_fields.items() if not (f.description or "").strip()]
    assert undocumented == []


def test_defaults_follow_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    s = UpSettings()
    assert (s.port, s.data_dir, s.spool_dir) == (
        8470,
        tmp_path / ".local/share/flightdeck",
        tmp_path / ".cache/flightdeck/spool",
    )
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    monkeypatch.setenv("FLIGHTDECK_UP_PORT", "8123")
    s = UpSettings()
    assert (s.port, s.spool_dir) == (8123, tmp_path / "c/flightdeck/spool")


def test_invalid_port_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["up", "--port", "70000"]) == 2
    assert "invalid settings" in capsys.readouterr().err


def test_banner_gives_the_job_settings(tmp_path: Path) -> None:
    text = banner("http://127.0.0.1:8470", tmp_path / "spool", tmp_path / "data")
    assert f"export FLIGHTDECK_AGENT_SPOOL_DIR={tmp_path / 'spool'}" in text
    assert "export FLIGHTDECK_AGENT_JOB=" in text  # plain torchrun names jobs by UUID otherwise
    assert "python -m flightdeck.agent train.py" in text
    assert "torchrun --nproc-per-node N -m flightdeck.agent train.py" in text


def test_banner_names_what_the_collector_watches(tmp_path: Path) -> None:
    """The spool and PyTorch's dump paths are named; a spool this shell sets elsewhere is flagged."""
    spool = tmp_path / "spool"
    prefixes = ["/tmp/nccl_trace_rank_"]
    text = banner("http://x", spool, tmp_path / "data", torch_prefixes=prefixes, env={})
    assert f"    spool  {spool}   (the agents' snapshots" in text
    assert "    torch  /tmp/nccl_trace_rank_<rank>   (PyTorch's own dump files)" in text
    assert "Note:" not in text
    elsewhere = {"FLIGHTDECK_AGENT_SPOOL_DIR": str(tmp_path / "other")}
    text = banner("http://x", spool, tmp_path / "data", torch_prefixes=prefixes, env=elsewhere)
    assert f"Note: this shell has FLIGHTDECK_AGENT_SPOOL_DIR={tmp_path / 'other'}: jobs started" in text
    same = {"FLIGHTDECK_AGENT_SPOOL_DIR": str(spool)}
    assert "Note:" not in banner("http://x", spool, tmp_path / "data", env=same)


def test_token_is_created_once_kept_private_and_replaced_when_revoked(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path)
    token_file = tmp_path / "collector.token"
    first = provision_token(url, token_file)
    assert token_file.stat().st_mode & 0o777 == 0o600
    assert provision_token(url, token_file) == first  # a restart reuses it

    from flightdeck.server import store
    from flightdeck.server.db import connect

    db = connect(url)
    try:
        with db.write() as session, session.begin():
            assert store.revoke_token(session=session, name="local", now_ns=time.time_ns())
        second = provision_token(url, token_file)
        assert second != first
        with db.write() as session, session.begin():
            tokens = {t.name: t.revoked_at_ns is None for t in store.list_tokens(session=session)}
        assert tokens == {"local": False, "local-2": True}
    finally:
        db.dispose()


def test_port_in_use() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use("127.0.0.1", s.getsockname()[1])


@pytest.mark.slow
def test_token_command_uses_the_database_of_flightdeck_up(tmp_path: Path) -> None:
    """With no database configured, `flightdeck token` opens up's SQLite file, not a new one in
    the current folder."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env["XDG_DATA_HOME"] = str(tmp_path / "xdg")
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "flightdeck", "token", "list"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "xdg" / "flightdeck" / "flightdeck.db").is_file()
    assert list(cwd.iterdir()) == []
