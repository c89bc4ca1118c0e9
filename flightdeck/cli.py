"""The `flightdeck` command: one entry point, subcommands loaded lazily.

Each subcommand lives in its own module exposing `configure(parser)` and `run(args) -> int`, so
`flightdeck analyze` never imports the server stack and the collector host never needs FastAPI.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS: dict[str, tuple[str, str]] = {
    "analyze": ("flightdeck.analyze_cmd", "diagnose a job from its flight-recorder dumps (offline)"),
    "collector": (
        "flightdeck.collector.cmd",
        "per-node daemon: ship flight-recorder snapshots and NIXL telemetry "
        "(`flightdeck collector install --help`: set a host up under systemd)",
    ),
    "demo": (
        "flightdeck.launch.demo.cmd",
        "run a small real gloo job with an injected fault and watch Flightdeck diagnose it",
    ),
    "dashboards": ("flightdeck.dashboards.cmd", "build the Grafana dashboards as JSON (dashboards/build/)"),
    "migrate": ("flightdeck.server.migrate_cmd", "bring the server's database schema up to this version"),
    "server": ("flightdeck.server.cmd", "run the control plane: ingest, live diagnosis, API, /metrics"),
    "token": ("flightdeck.server.token_cmd", "create, revoke or list collector tokens"),
    "up": (
        "flightdeck.launch.up",
        "the server (SQLite) and a local collector on this machine, in one command",
    ),
}


def build_parser(argv: Sequence[str]) -> argparse.ArgumentParser:
    """Build the parser; only the chosen subcommand's module is imported."""
    from flightdeck import __version__

    parser = argparse.ArgumentParser(prog="flightdeck", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"flightdeck {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).configure(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the `flightdeck` command line; returns the process exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:2] == ["collector", "install"]:
        # A one-off setup step, not a mode of the daemon: it has its own options.
        from flightdeck.collector.install import main as install_main

        return install_main(args_list[2:])
    args = build_parser(args_list).parse_args(args_list)
    # Run as the program itself, not called by a test or another program: a command may then end
    # the process once its output is written, without freeing what it holds (`analyze`).
    args.as_program = argv is None
    module = importlib.import_module(COMMANDS[args.command][0])
    code: int = module.run(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
