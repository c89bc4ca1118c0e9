"""`flightdeck server` runs its objects on glibc's malloc unless its user chose an allocator
(flightdeck/runtime_tuning.py, SERVER_ALLOCATOR): started as users start it (`python -m flightdeck
server`, the `flightdeck` console script), the process re-executes itself once, keeping its pid
and command line, with `PYTHONMALLOC=malloc`; an explicit `PYTHONMALLOC` is left alone. What the
running server reports (`flightdeck_build_info`'s allocator label) comes from the interpreter's
own count of pymalloc blocks, not from the environment."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

import httpx
import pytest

from tests.support.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[1]


def environ_of(pid: int) -> dict[str, str]:
    """The environment process `pid` runs with (after an exec: the new one)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def cmdline_of(pid: int) -> list[str]:
    """The command line of process `pid`."""
    return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]


def build_info_allocator(url: str) -> str:
    """The allocator label of the server's `flightdeck_build_info`."""
    text = httpx.get(f"{url}/metrics", timeout=10).raise_for_status().text
    found = re.search(r'^flightdeck_build_info\{[^}]*allocator="([a-z]+)"', text, flags=re.M)
    assert found is not None, text[:2000]
    return found.group(1)


def server_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This interpreter's environment without PYTHONMALLOC or FLIGHTDECK_* settings, this checkout
    first on the path (the console script's own folder would otherwise come first)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC" and not k.startswith("FLIGHTDECK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["FLIGHTDECK_SERVER_DATA_DIR"] = str(tmp_path)
    return {**env, **extra}


def console_script() -> list[str]:
    """The `flightdeck` console script installed beside this interpreter, run by it."""
    script = Path(sys.executable).parent / "flightdeck"
    if not script.exists():
        found = shutil.which("flightdeck")
        if found is None:
            pytest.skip("no flightdeck console script installed")
        script = Path(found)
    return [sys.executable, str(script)]


@pytest.mark.parametrize("how", ["module", "console script"])
def test_the_server_runs_on_malloc_by_default(
    tmp_path: Path, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if how == "console script":
        monkeypatch.setattr("tests.support.server_process.FLIGHTDECK", console_script())
    db = f"sqlite:///{tmp_path}/fd.db"
    with ServerProcess(server_env(tmp_path), tmp_path / "server.log", "--database-url", db) as server:
        server.start(timeout_s=60)
        # Re-executed in place: the same process (the pid the caller started), its arguments
        # kept, the allocator in its environment and in use.
        assert environ_of(server.pid).get("PYTHONMALLOC") == "malloc"
        assert cmdline_of(server.pid)[-3:] == ["server", "--database-url", db]
        assert build_info_allocator(server.url) == "malloc"


def test_an_explicit_pythonmalloc_is_kept(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/fd.db"
    env = server_env(tmp_path, PYTHONMALLOC="pymalloc")
    with ServerProcess(env, tmp_path / "server.log", "--database-url", db) as server:
        server.start(timeout_s=60)
        assert environ_of(server.pid).get("PYTHONMALLOC") == "pymalloc"
        assert build_info_allocator(server.url) == "pymalloc"
