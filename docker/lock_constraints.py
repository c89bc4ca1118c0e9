"""Write docker/constraints.txt: the exact version, as installed here, of every package the server
image installs (the `server` extra of torch-flightdeck and everything it needs, transitively).

    .venv/bin/python docker/lock_constraints.py     # after upgrading the environment

The Dockerfile installs with `pip install -c docker/constraints.txt`, so an image built later gets
these versions, not whatever is newest that day. Markers are evaluated for this interpreter: run it
on Linux with the image's Python minor version (3.11). `tests/test_image_lock.py` checks the file
is complete.
"""

from __future__ import annotations

import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "docker" / "constraints.txt"
EXTRA = "server"


def canonical(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def server_requirements() -> list[Requirement]:
    """The requirements of the server extra (and the base dependencies) from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [
        Requirement(r) for r in [*project.get("dependencies", []), *project["optional-dependencies"][EXTRA]]
    ]


def closure(roots: list[Requirement]) -> dict[str, str]:
    """`{canonical name: installed version}` of `roots` and what they need, transitively (each
    requirement's extras followed; markers evaluated here)."""
    found: dict[str, str] = {}
    todo = [(r, frozenset(r.extras)) for r in roots if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        req, extras = todo.pop()
        name = canonical(req.name)
        dist = metadata.distribution(req.name)
        first = name not in found
        found[name] = dist.version
        for raw in dist.requires or []:
            sub = Requirement(raw)
            wanted = sub.marker is None or any(
                sub.marker.evaluate({"extra": e}) for e in (extras or frozenset({""}))
            )
            if wanted and (first or extras):
                todo.append((sub, frozenset(sub.extras)))
    return found


def render(pins: dict[str, str]) -> str:
    """The constraints file's text."""
    head = [
        "# Exact versions of the server image's Python packages (the server extra's dependency",
        "# closure), written by docker/lock_constraints.py; the Dockerfile installs with -c.",
        f"# Python {sys.version_info.major}.{sys.version_info.minor}, {sys.platform}.",
    ]
    return "\n".join([*head, *(f"{n}=={v}" for n, v in sorted(pins.items()))]) + "\n"


if __name__ == "__main__":
    CONSTRAINTS.write_text(render(closure(server_requirements())), encoding="utf-8")
    print(f"wrote {CONSTRAINTS}")
