"""docker/constraints.txt locks the server image: every package the server extra needs,
transitively, is pinned to one exact version that the extra's own bounds allow."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO / "docker" / "constraints.txt"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"not an exact pin: {line!r}"
            pins[_canonical(name)] = version
    return pins


def _server_extra() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["server"]]]


def test_every_direct_dependency_is_pinned_within_its_bounds() -> None:
    pins = _pins()
    for req in _server_extra():
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _canonical(req.name)
        assert name in pins, f"{req} is not pinned in docker/constraints.txt"
        assert req.specifier.contains(Version(pins[name]), prereleases=True), (
            f"{name}=={pins[name]} breaks {req}"
        )


def test_the_pins_are_closed_under_their_dependencies() -> None:
    """Each pinned package's own requirements (and those of the extras asked for, as psycopg[binary])
    are pinned too, as the installed metadata of this environment states them: nothing the image
    installs is left to float. Run docker/lock_constraints.py to regenerate."""
    pins = _pins()
    wanted_extras: dict[str, set[str]] = {}
    for req in _server_extra():
        wanted_extras.setdefault(_canonical(req.name), set()).update(req.extras)
    missing = []
    for name in pins:
        dist = metadata.distribution(name)
        extras = wanted_extras.get(name, set()) or {""}
        for raw in dist.requires or []:
            sub = Requirement(raw)
            if sub.marker is not None and not any(sub.marker.evaluate({"extra": e}) for e in extras):
                continue
            if _canonical(sub.name) not in pins:
                missing.append(f"{sub.name} (needed by {name})")
    assert missing == []
