"""docs/runbook.md names only what ships: compose services, systemd units, `flightdeck` commands,
metrics, settings, and one section per alert rule, each rule's runbook_url pointing at its section.

The runbook is read at 3 a.m.; a command that names a service or unit that does not exist costs
minutes nobody has then.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

from flightdeck.cli import COMMANDS
from flightdeck.server.settings import ServerSettings

REPO = Path(__file__).resolve().parents[1]
RUNBOOK = (REPO / "docs" / "runbook.md").read_text(encoding="utf-8")
RULES = REPO / "dashboards" / "alerts" / "flightdeck.rules.yml"
COMPOSE = REPO / "docker-compose.yml"
METRICS_DOC = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")

#: Every inline code span of the runbook.
SPANS = re.findall(r"`([^`\n]+)`", RUNBOOK)


def _commands(tool: str) -> list[list[str]]:
    """The code spans that are commands of `tool`, split like a shell would."""
    out = []
    for span in SPANS:
        if span.startswith(tool + " "):
            out.append(shlex.split(span.split("|", 1)[0]))
    return out


def _shipped_units() -> set[str]:
    return {p.stem for p in REPO.rglob("*.service") if ".venv" not in p.parts}


def test_docker_compose_commands_name_shipped_services() -> None:
    services = set(yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))["services"])
    commands = _commands("docker")
    assert commands, "the runbook has no docker compose command to check"
    for argv in commands:
        assert argv[:2] == ["docker", "compose"], argv
        named = [a for a in argv[3:] if not a.startswith("-") and not a.isdigit()]
        assert named and set(named) <= services, f"{shlex.join(argv)}: compose has {sorted(services)}"


def test_systemd_commands_name_shipped_units() -> None:
    units = _shipped_units()
    checked = 0
    for tool in ("systemctl", "journalctl"):
        for argv in _commands(tool):
            names = [a for a in argv[1:] if a.startswith("flightdeck")]
            assert names and set(names) <= units, f"{shlex.join(argv)}: shipped units {sorted(units)}"
            checked += 1
    assert checked


def test_flightdeck_commands_exist() -> None:
    commands = _commands("flightdeck")
    assert commands
    for argv in commands:
        assert argv[1] in COMMANDS, f"{shlex.join(argv)}: no such subcommand"


def test_metrics_named_are_documented() -> None:
    documented = set(re.findall(r"^\|\s*`([a-z_:][a-z0-9_:]*)`\s*\|", METRICS_DOC, flags=re.M))
    named = {
        m.group(0)
        for span in SPANS
        if not span.startswith(("&", "*"))  # YAML anchors of the rule file, not metrics
        for m in re.finditer(r"\bflightdeck_[a-z0-9_]+", span)
    }
    named |= {"up"} & {s.split("{")[0] for s in SPANS}
    assert named - {"up"}, "the runbook names no metric"
    assert named - {"up"} <= documented, sorted(named - {"up"} - documented)


def test_server_settings_named_exist() -> None:
    fields = {f"FLIGHTDECK_SERVER_{name.upper()}" for name in ServerSettings.model_fields}
    named = {s for s in SPANS if re.fullmatch(r"FLIGHTDECK_[A-Z0-9_]+", s)}
    # FLIGHTDECK_AGENT_CHECKPOINT_DIR is the in-job agent's; the rest are the server's.
    assert named - {"FLIGHTDECK_AGENT_CHECKPOINT_DIR"} <= fields, sorted(named - fields)


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def test_every_alert_has_a_runbook_section_its_url_points_at() -> None:
    headings = {h.strip() for h in re.findall(r"^## (.+)$", RUNBOOK, flags=re.M)}
    for rule in _rules():
        assert rule["alert"] in headings, f"no runbook section for {rule['alert']}"
        url = rule["annotations"]["runbook_url"]
        assert url.endswith("#" + rule["alert"].lower()), url
