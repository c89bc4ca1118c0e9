"""The command line without optional extras: help works, and a missing extra is named, not a traceback."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: Runs the CLI in a fresh interpreter in which the Grafana SDK cannot be imported, as on a host
#: installed without the `dashboards` extra.
_WITHOUT_SDK = textwrap.dedent(
    """
    import sys
    from importlib.abc import MetaPathFinder

    class _Absent(MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "grafana_foundation_sdk":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Absent())
    from flightdeck.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _WITHOUT_SDK, *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.slow
def test_dashboards_help_needs_no_grafana_sdk() -> None:
    done = _cli("dashboards", "--help")
    assert done.returncode == 0, done.stderr
    assert "--flightdeck-url" in done.stdout


@pytest.mark.slow
def test_dashboards_build_without_the_sdk_names_the_extra(tmp_path: object) -> None:
    done = _cli("dashboards", "build", "--out", str(tmp_path))
    assert done.returncode == 2
    assert "torch-flightdeck[dashboards]" in done.stderr
    assert "Traceback" not in done.stderr
