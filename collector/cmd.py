"""`flightdeck collector`: the per-node daemon (see `flightdeck.collector.daemon`).

    flightdeck collector [--config FILE]             run until SIGTERM / SIGINT
    flightdeck collector --config FILE --check       validate settings and paths, print what is watched
    flightdeck collector --config FILE --once        read and ship everything once, then exit
    flightdeck collector --requeue-dead-letters      put refused batches back in the queue, then exit

Exit codes: 0 fine; 1 `--once` left batches queued; 2 unusable configuration; 3 unusable state_dir
(read-only, not a directory, or its queue database unreadable: one line on stderr says which);
4 `--once` stopped because the server rejected the token (401/403: one line says the server's reason).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import TextIO

from flightdeck.collector.settings import CollectorSettings, SettingsError
from flightdeck.runtime_tuning import COLLECTOR_DAEMON, tune
from flightdeck.spool import LAYOUT

log = logging.getLogger("flightdeck.collector")

EXIT_OK, EXIT_QUEUED, EXIT_CONFIG, EXIT_STATE, EXIT_TOKEN = 0, 1, 2, 3, 4


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the collector's options to its subcommand parser."""
    parser.add_argument(
        "--config", type=Path, help="TOML settings file (FLIGHTDECK_COLLECTOR_* variables win over it)"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument(
        "--check", action="store_true", help="validate the settings and paths, print them, exit"
    )
    mode.add_argument("--once", action="store_true", help="read and push everything once, then exit")
    mode.add_argument(
        "--requeue-dead-letters",
        action="store_true",
        help="move the batches the server refused back into the queue, then exit",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")


def check(settings: CollectorSettings, out: TextIO) -> list[str]:
    """Print what the collector would do; returns the problems that make the settings unusable."""
    problems: list[str] = []
    notes: list[str] = []
    if not settings.server_url:
        problems.append("server_url is not set")
    try:
        if settings.resolve_token() is None:
            notes.append("no token: batches are sent without Authorization")
    except SettingsError as exc:
        problems.append(str(exc))
    state = Path(os.path.expanduser(settings.state_dir))
    try:
        state.mkdir(parents=True, exist_ok=True)
        if not os.access(state, os.W_OK | os.X_OK):
            problems.append(f"state_dir {state} is not writable")
    except OSError as exc:
        problems.append(f"state_dir {state} cannot be created: {exc.strerror}")
    print(f"server:     {settings.server_url or '-'}", file=out)
    print(f"host:       {settings.host_name}", file=out)
    print(
        f"state_dir:  {state}  (queue {state / 'queue.sqlite3'}, quarantine {state / 'quarantine'})", file=out
    )
    how = f"polling every {settings.poll_interval_s}s" if settings.polling else "inotify"
    print(f"watching:   ({how}, rescan every {settings.rescan_interval_s}s)", file=out)
    for d in settings.spool_dirs:
        p = Path(os.path.expanduser(d))
        print(f"  spool  {p}/{LAYOUT}  {_exists(p)}", file=out)
        if p.exists() and not os.access(p, os.R_OK | os.W_OK | os.X_OK):
            problems.append(f"spool dir {p} is not readable and writable (bad files are moved out)")
    for prefix in settings.torch_dump_prefixes:
        p = Path(os.path.expanduser(prefix))
        print(f"  torch  {p}<rank>  {_exists(p.parent)}  job={settings.torch_job}", file=out)
    for name, nd in (("nixl ring", settings.nixl_telemetry_dir), ("nixl mp", settings.nixl_multiproc_dir)):
        if nd is None:
            continue
        p = Path(os.path.expanduser(nd))
        print(f"  {name:9s} {p}  {_exists(p)}", file=out)
        if name == "nixl ring" and p.exists() and not os.access(p, os.R_OK | os.W_OK | os.X_OK):
            problems.append(f"nixl_telemetry_dir {p}: ring files are consumed, which needs write access")
    listen = settings.metrics_listen
    print(f"metrics:    {'http://' + listen + '/metrics' if listen else 'off'}", file=out)
    if settings.spool_dirs:
        spools = ", ".join(str(Path(os.path.expanduser(d))) for d in settings.spool_dirs)
        notes.append(
            f"the agents must write to a spool watched here ({spools}): "
            f"FLIGHTDECK_AGENT_SPOOL_DIR={Path(os.path.expanduser(settings.spool_dirs[0]))} in the jobs"
        )
    for n in notes:
        print(f"note: {n}", file=out)
    for p_ in problems:
        print(f"error: {p_}", file=out)
    return problems


def _exists(p: Path) -> str:
    return "(exists)" if p.is_dir() else "(missing: picked up when it appears)"


def run(args: argparse.Namespace) -> int:
    """Run the subcommand; returns the exit code."""
    level = getattr(logging, str(args.log_level).upper(), logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: a line per push, every couple of seconds. Ours say what matters.
    logging.getLogger("httpx").setLevel(max(level, logging.WARNING))
    try:
        settings = CollectorSettings.load(args.config)
    except SettingsError as exc:
        print(f"flightdeck collector: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.check:
        return EXIT_CONFIG if check(settings, sys.stdout) else EXIT_OK
    if args.requeue_dead_letters:
        from flightdeck.collector.daemon import StateDirError, open_queue

        try:
            q = open_queue(Path(os.path.abspath(os.path.expanduser(settings.state_dir))), settings)
        except StateDirError as exc:
            print(f"flightdeck collector: {exc}", file=sys.stderr)
            return EXIT_STATE
        try:
            print(f"requeued {q.requeue_dead_letters()} batches")
        finally:
            q.close()
        return EXIT_OK
    return _serve(settings, once=args.once)


def _serve(settings: CollectorSettings, *, once: bool) -> int:
    import httpx
    from prometheus_client import CollectorRegistry

    from flightdeck.collector.daemon import Collector, StateDirError

    try:
        settings.ingest_url  # noqa: B018 - raises SettingsError when server_url is unset
    except SettingsError as exc:
        print(f"flightdeck collector: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    client = httpx.Client(timeout=settings.request_timeout_s)
    try:
        collector = Collector(settings, client=client, registry=CollectorRegistry())
    except SettingsError as exc:
        client.close()
        print(f"flightdeck collector: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except StateDirError as exc:
        client.close()
        print(f"flightdeck collector: {exc}", file=sys.stderr)
        return EXIT_STATE
    tune(COLLECTOR_DAEMON)  # the GC for this workload (flightdeck/runtime_tuning.py)
    try:
        if once:
            if collector.once():
                return EXIT_OK
            rejection = collector.pusher.token_rejection
            if rejection is None:
                return EXIT_QUEUED
            status, message = rejection
            print(
                f"flightdeck collector: the server at {settings.server_url} rejected the token "
                f"(HTTP {status}: {message}); nothing more was sent and the batches stay queued. "
                "Check token / token_file (FLIGHTDECK_COLLECTOR_TOKEN_FILE), or make a token with "
                f"`flightdeck token create NAME --host {settings.host_name}` on the server.",
                file=sys.stderr,
            )
            return EXIT_TOKEN
        stopping = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only set an event here: the main loop does the flushing, outside the handler.
            log.info("signal %d: stopping (final flush, %.0fs to push)", signum, settings.shutdown_grace_s)
            stopping.set()
            collector.stop_event.set()

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        collector.start()
        log.info("collector started on %s, pushing to %s", settings.host_name, settings.ingest_url)
        collector.run()
        return EXIT_OK
    finally:
        collector.close(drain_s=0 if once else None)
        client.close()
