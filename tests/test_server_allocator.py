"""Which allocator a real `flightdeck server` runs its objects on, as it reports it: CPython's own
(pymalloc) unless its user chose glibc's malloc with `PYTHONMALLOC=malloc` (an ended job's memory
then goes back to the system, for more CPU per entry: docs/performance.md, "Server memory").
`flightdeck_build_info`'s allocator label comes from the interpreter's own count of pymalloc
blocks, not from the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

import httpx
import pytest

from tests.support.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[1]


def build_info_allocator(url: str) -> str:
    """The allocator label of the server's `flightdeck_build_info`."""
    text = httpx.get(f"{url}/metrics", timeout=10).raise_for_status().text
    found = re.search(r'^flightdeck_build_info\{[^}]*allocator="([a-z]+)"', text, flags=re.M)
    assert found is not None, text[:2000]
    return found.group(1)


@pytest.mark.parametrize(("pythonmalloc", "label"), [(None, "pymalloc"), ("malloc", "malloc")])
def test_the_server_says_which_allocator_it_runs_on(
    tmp_path: Path, pythonmalloc: str | None, label: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONMALLOC" and not k.startswith("FLIGHTDECK_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env["FLIGHTDECK_SERVER_DATA_DIR"] = str(tmp_path)
    if pythonmalloc is not None:
        env["PYTHONMALLOC"] = pythonmalloc
    db = f"sqlite:///{tmp_path}/fd.db"
    with ServerProcess(env, tmp_path / "server.log", "--database-url", db) as server:
        server.start(timeout_s=60)
        assert build_info_allocator(server.url) == label
