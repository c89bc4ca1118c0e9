"""The runbook as the server serves it (`GET /runbook`): every alert's default runbook_url opens there.

The shipped rules' `runbook_url`s are `<Flightdeck URL>/runbook#<anchor>`; a real `flightdeck server`
process serves the page, and every anchor the rules name is a heading id on it. The renderer escapes
what the Markdown holds.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from flightdeck.dashboards.defaults import DEFAULT_RUNBOOK_URL
from flightdeck.launch.demo.ranks import free_port
from flightdeck.web.runbook import anchor, to_html

REPO = Path(__file__).resolve().parents[1]
RULES = REPO / "dashboards" / "alerts" / "flightdeck.rules.yml"


def _runbook_urls() -> list[str]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r["annotations"]["runbook_url"] for g in doc["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.slow
def test_every_runbook_url_opens_a_section_of_the_served_page(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLIGHTDECK_")}
    env["FLIGHTDECK_SERVER_DATA_DIR"] = str(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flightdeck", "server", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        with urllib.request.urlopen(f"{base}/runbook", timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/html")
            page = r.read().decode()
    finally:
        proc.terminate()
        proc.wait(30)
    ids = set(re.findall(r'<h[1-4] id="([^"]+)"', page))
    urls = _runbook_urls()
    assert len(urls) >= 15
    for url in urls:
        served, _, frag = url.partition("#")
        assert served == DEFAULT_RUNBOOK_URL == "http://127.0.0.1:8470/runbook"
        assert frag in ids, f"{url}: no heading with id {frag!r} on the served runbook"


def test_markdown_is_rendered_escaped_with_github_anchors() -> None:
    md = (
        "## FlightdeckCollectiveHang\n\nRun `kill -9 <pid>` **now** & see [docs](https://x.test/a?b=1&c=2).\n\n"
        "1. first <b>\n2. second\n\n```sh\necho '<script>'\n```\n\n## Job states and the end of a job\n"
        "- [a path](docs/alerting.md)\n"
    )
    out = to_html(md)
    assert '<h2 id="flightdeckcollectivehang">FlightdeckCollectiveHang</h2>' in out
    assert "<code>kill -9 &lt;pid&gt;</code>" in out and "<strong>now</strong> &amp; see" in out
    assert '<a href="https://x.test/a?b=1&amp;c=2">docs</a>' in out
    assert "<ol><li>first &lt;b&gt;</li><li>second</li></ol>" in out
    assert "<pre><code>echo &#x27;&lt;script&gt;&#x27;</code></pre>" in out
    assert 'id="job-states-and-the-end-of-a-job"' in out
    assert "a path (<code>docs/alerting.md</code>)" in out  # not a link: the server does not serve it
    assert anchor("Slow rank findings (no alert)") == "slow-rank-findings-no-alert"
