"""Which allocator a real `flightdeck server` runs its objects on, as it reports it: CPython's own
(pymalloc) unless its user chose the C library's malloc with `PYTHONMALLOC=malloc` (an ended job's
memory then goes back to the system, for more CPU per entry: docs/performance.md, "Server
memory"), glibc's or jemalloc's preloaded in its place. `flightdeck_build_info`'s allocator label
comes from the interpreter's own count of pymalloc blocks and the libraries mapped into the
process, not from the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from bench.server_ingest import allocator_env, allocator_library
from tests.support.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[1]


def build_info_allocator(url: str) -> str:
    """The allocator label of the server's `flightdeck_build_info`."""
    text = httpx.get(f"{url}/metrics", timeout=10).raise_for_status().text
    found = re.search(r'^flightdeck_build_info\{[^}]*allocator="([a-z]+)"', text, flags=re.M)
    assert found is not None, text[:2000]
    return found.group(1)


@pytest.mark.parametrize("allocator", [None, "pymalloc", "malloc", "jemalloc", "mimalloc"])
def test_the_server_says_which_allocator_it_runs_on(tmp_path: Path, allocator: str | None) -> None:
    if allocator in ("jemalloc", "mimalloc") and allocator_library(allocator) is None:
        pytest.skip(f"{allocator} is not installed")
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONMALLOC", "LD_PRELOAD") and not k.startswith("FLIGHTDECK_")
    }
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["FLIGHTDECK_SERVER_DATA_DIR"] = str(tmp_path)
    if allocator is not None:
        env.update(allocator_env(allocator))
    label = allocator or "pymalloc"
    db = f"sqlite:///{tmp_path}/fd.db"
    with ServerProcess(env, tmp_path / "server.log", "--database-url", db) as server:
        server.start(timeout_s=60)
        assert build_info_allocator(server.url) == label
