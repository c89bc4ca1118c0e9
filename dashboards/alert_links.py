"""The alert rules' links: absolute `incident_url` and `runbook_url` from one pair of base URLs.

The shipped rule file (dashboards/alerts/flightdeck.rules.yml) and its promtool tests are the
rendering of the defaults (`DEFAULT_FLIGHTDECK_URL`, `DEFAULT_RUNBOOK_URL`): every incident link
starts with the first, every runbook link with the second. `render` swaps them for a site's own,
so the two URLs are set in one place (`flightdeck dashboards alerts --flightdeck-url ...
--runbook-url ...`) and the rules stay what promtool tested. Prometheus' own `--web.external-url`
is Prometheus' address, not Flightdeck's, so it cannot be the base of these links.
"""

from __future__ import annotations

from pathlib import Path

from flightdeck.dashboards.defaults import ALERTS_DIR, DEFAULT_FLIGHTDECK_URL, DEFAULT_RUNBOOK_URL

#: the files rendered, relative to the alerts directory.
RULE_FILES = ("flightdeck.rules.yml", "flightdeck.rules.test.yml")


def _base(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"not an absolute http(s) URL: {url!r}")
    return url.rstrip("/")


def render(text: str, *, flightdeck_url: str, runbook_url: str) -> str:
    """`text` (a shipped rule or rule-test file) with the default bases replaced by these."""
    out = text.replace(DEFAULT_RUNBOOK_URL + "#", _base(runbook_url) + "#")
    return out.replace(f'"{DEFAULT_FLIGHTDECK_URL}/', f'"{_base(flightdeck_url)}/')


def write(out: Path, *, flightdeck_url: str, runbook_url: str) -> list[Path]:
    """Render the shipped rule file and its tests into `out`; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in RULE_FILES:
        text = (ALERTS_DIR / name).read_text(encoding="utf-8")
        path = out / name
        path.write_text(
            render(text, flightdeck_url=flightdeck_url, runbook_url=runbook_url), encoding="utf-8"
        )
        written.append(path)
    return written
