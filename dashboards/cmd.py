"""`flightdeck dashboards build`: write the Grafana dashboards as JSON (or check them for drift);
`flightdeck dashboards alerts`: write the alert rules with a site's incident and runbook links."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flightdeck.dashboards.defaults import ALERTS_DIR, BUILD_DIR, DEFAULT_FLIGHTDECK_URL


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `dashboards` arguments to `parser`."""
    parser.add_argument(
        "action",
        choices=["build", "alerts"],
        help="build: render every dashboard to JSON; alerts: render the alert rules (and their "
        "promtool tests) with --flightdeck-url and --runbook-url as the links' bases",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"output directory (default: {BUILD_DIR} for build; for alerts, required: the shipped "
        f"{ALERTS_DIR} is the rendering of the defaults)",
    )
    parser.add_argument(
        "--flightdeck-url",
        default=DEFAULT_FLIGHTDECK_URL,
        help="where the Flightdeck UI answers: the base of every incident link, in the dashboards "
        f"and the alert rules (default: {DEFAULT_FLIGHTDECK_URL})",
    )
    parser.add_argument(
        "--runbook-url",
        default=None,
        help="where the runbook is published: the base of every alert's runbook_url (default: "
        "the runbook the Flightdeck server serves, <--flightdeck-url>/runbook)",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files in --out are out of date"
    )


def run(args: argparse.Namespace) -> int:
    """Build (or check) the dashboards, or render the alert rules; returns the exit code."""
    if args.action == "alerts":
        return _alerts(args)
    if args.out is None:
        args.out = BUILD_DIR
    try:
        from flightdeck.dashboards.build import drift, write
    except ModuleNotFoundError as exc:
        if exc.name is None or not exc.name.startswith("grafana_foundation_sdk"):
            raise
        print(
            "flightdeck dashboards: the Grafana SDK is not installed; "
            "install the extra: pip install 'torch-flightdeck[dashboards]'",
            file=sys.stderr,
        )
        return 2

    if args.check:
        stale = drift(args.out, args.flightdeck_url)
        for name in stale:
            print(f"out of date: {args.out / name}", file=sys.stderr)
        if stale:
            print("run `flightdeck dashboards build` and commit the result", file=sys.stderr)
        return 1 if stale else 0
    for path in write(args.out, args.flightdeck_url):
        print(path)
    return 0


def _alerts(args: argparse.Namespace) -> int:
    from flightdeck.dashboards.alert_links import write

    if args.out is None:
        print("flightdeck dashboards alerts: --out DIR is required", file=sys.stderr)
        return 2
    try:
        runbook_url = args.runbook_url or args.flightdeck_url.rstrip("/") + "/runbook"
        paths = write(args.out, flightdeck_url=args.flightdeck_url, runbook_url=runbook_url)
    except ValueError as exc:
        print(f"flightdeck dashboards alerts: {exc}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run as `python -m flightdeck.dashboards [build] [options]` (the action defaults to build)."""
    parser = argparse.ArgumentParser(prog="python -m flightdeck.dashboards", description=__doc__)
    configure(parser)
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0].startswith("-"):
        args_list.insert(0, "build")
    return run(parser.parse_args(args_list))
