"""`flightdeck dashboards build`: write the Grafana dashboards as JSON (or check them for drift)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flightdeck.dashboards.defaults import BUILD_DIR, DEFAULT_FLIGHTDECK_URL


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `dashboards` arguments to `parser`."""
    parser.add_argument("action", choices=["build"], help="build: render every dashboard to JSON")
    parser.add_argument(
        "--out", type=Path, default=BUILD_DIR, help=f"output directory (default: {BUILD_DIR})"
    )
    parser.add_argument(
        "--flightdeck-url",
        default=DEFAULT_FLIGHTDECK_URL,
        help="default of the dashboards' flightdeck_url variable, the base of every incident link "
        f"(default: {DEFAULT_FLIGHTDECK_URL})",
    )
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if the files in --out are out of date"
    )


def run(args: argparse.Namespace) -> int:
    """Build (or check) the dashboards; returns the exit code."""
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


def main(argv: list[str] | None = None) -> int:
    """Run as `python -m flightdeck.dashboards [build] [options]` (the action defaults to build)."""
    parser = argparse.ArgumentParser(prog="python -m flightdeck.dashboards", description=__doc__)
    configure(parser)
    args_list = list(sys.argv[1:] if argv is None else argv)
    if not args_list or args_list[0].startswith("-"):
        args_list.insert(0, "build")
    return run(parser.parse_args(args_list))
