"""docker-compose.yml as Docker Compose resolves it: `${VAR}`, `${VAR:-default}` and `${VAR:?error}`
interpolated from an environment, .env.example read, and secrets that pass the server's checks."""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
ENV_EXAMPLE = REPO / ".env.example"
_VAR = re.compile(r"\$\{(\w+)(?:(:?[?-])([^}]*))?\}")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """Compose's variable interpolation over a parsed YAML document (the forms the file uses)."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2), m.group(3)
        have = env.get(name)
        if op in (":?", "?") and (have is None or (op == ":?" and have == "")):
            raise ValueError(f"required variable {name} is missing a value: {arg}")
        if op in (":-", "-") and (have is None or (op == ":-" and have == "")):
            return arg
        return have or ""

    return _VAR.sub(one, value)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blank lines skipped)."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def resolved_compose(env: Mapping[str, str]) -> dict[str, Any]:
    """docker-compose.yml with `env`'s variables."""
    doc: dict[str, Any] = interpolate(yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8")), env)
    return doc


def real_secrets() -> dict[str, str]:
    """A test .env: .env.example's variables, each with a fresh random value."""
    return {k: f"test-{k.lower()}-{uuid.uuid4().hex}" for k in read_env_file(ENV_EXAMPLE)}
