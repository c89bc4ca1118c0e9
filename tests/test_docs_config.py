"""docs/configuration.md is what `python -m flightdeck.docs_config` writes from the settings
classes: a setting added, renamed or re-described without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

from flightdeck import docs_config
from flightdeck.collector.settings import CollectorSettings
from flightdeck.launch.up import UpSettings
from flightdeck.server.settings import ServerSettings

REPO = Path(__file__).resolve().parents[1]


def test_configuration_page_is_current() -> None:
    committed = (REPO / docs_config.DOC_PATH).read_text(encoding="utf-8")
    assert committed == docs_config.render(), (
        "docs/configuration.md is stale: run `python -m flightdeck.docs_config` and commit it"
    )


def test_every_setting_is_on_the_page() -> None:
    page = docs_config.render()
    for prefix, cls in (
        ("FLIGHTDECK_SERVER_", ServerSettings),
        ("FLIGHTDECK_COLLECTOR_", CollectorSettings),
        ("FLIGHTDECK_UP_", UpSettings),
    ):
        for name in cls.model_fields:
            assert f"`{prefix}{name.upper()}`" in page, f"{prefix}{name.upper()} missing"
    for env in ("FLIGHTDECK_AGENT_SPOOL_DIR", "FLIGHTDECK_AGENT_CHECKPOINT_DIR", "FLIGHTDECK_AGENT_JOB"):
        assert f"`{env}`" in page
    # Test-only variables are for maintainers (docs/dev/testing.md), not the user's reference.
    assert "FLIGHTDECK_TEST_" not in page
    assert "(no description)" not in page


def test_check_mode_reports_a_stale_file(tmp_path: Path) -> None:
    stale = tmp_path / "configuration.md"
    stale.write_text("# old\n", encoding="utf-8")
    assert docs_config.main(["--check", "--output", str(stale)]) == 1
    assert docs_config.main(["--output", str(stale)]) == 0
    assert docs_config.main(["--check", "--output", str(stale)]) == 0
