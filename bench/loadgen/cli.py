"""Load generator: N simulated ranks on H simulated hosts push to real `flightdeck server` processes.

The command line (`python -m bench.loadgen --help`) and the servers it spawns on a fresh database;
the package's docstring (bench/loadgen/__init__.py) says what the generator does."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from bench.loadgen.job import FAULT_KINDS, Fault, parse_fault, plan_faults
from bench.loadgen.run import drive
from flightdeck.collector.daemon import GROUPS_RESEND_S


@contextmanager
def spawned(args: argparse.Namespace) -> Iterator[tuple[list[str], str, list[int], str]]:
    """Fresh database + token + `args.servers` server processes; yields (urls, token, pids, db url)."""
    from bench.server_ingest import make_token, scratch_pg_database, start_server

    env = {
        "FLIGHTDECK_SERVER_STALL_AFTER_S": str(args.stall_after),
    }
    if args.inflight is not None:
        env["FLIGHTDECK_SERVER_MAX_INFLIGHT_INGESTS"] = str(args.inflight)
    if args.servers > 1 or args.cluster:
        env["FLIGHTDECK_SERVER_CLUSTER"] = "true"
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as scratch:
        if args.spawn == "sqlite":
            url = f"sqlite:///{tmp}/loadgen.db"
        else:
            url = scratch.enter_context(scratch_pg_database("flightdeck_scale"))
        servers = []
        try:
            token = make_token(url)
            for _ in range(args.servers):
                servers.append(start_server(url, env))
            yield [s.url for s in servers], token, [s.pid for s in servers], url
        finally:
            for server in servers:
                server.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(prog="python -m bench.loadgen", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--spawn", choices=["sqlite", "postgresql"], help="start servers on a fresh database")
    ap.add_argument("--servers", type=int, default=1, help="server processes to spawn (--spawn)")
    ap.add_argument(
        "--cluster",
        action="store_true",
        help="--spawn: run the servers in cluster mode even when there is one (what cluster mode "
        "costs apart from splitting the requests)",
    )
    ap.add_argument("--url", action="append", default=[], help="server base URL (repeat: round-robin)")
    ap.add_argument("--token", default=os.environ.get("FLIGHTDECK_TOKEN", ""), help="collector token")
    ap.add_argument("--server-pid", type=int, action="append", default=[], help="measure this pid")
    ap.add_argument("--database-url", default="", help="for the database size and backends (with --url)")
    ap.add_argument("--job", default="", help="job name (default: a fresh one)")
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--hosts", type=int, default=32)
    ap.add_argument("--groups", type=int, default=3, help="kinds of process groups (>= 1)")
    ap.add_argument("--rate", type=float, default=10.0, help="collectives per second per rank")
    ap.add_argument("--interval", type=float, default=2.0, help="snapshot interval (s)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    ap.add_argument("--drain-s", type=float, default=60.0, help="wait this long for queued batches")
    ap.add_argument("--window-s", type=float, default=30.0, help="report figures per window this long")
    ap.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="FAULT",
        help="KIND@SECONDS[:rank=R][:for=S], repeat for several (KIND: hang or mismatch; rank 5 "
        "unless given; for=S: the fault's collective completes S s later and the job goes on, "
        "default for ever); or hang, mismatch or none with --fault-at and --fault-rank "
        "(default: hang at 2/3 of the duration)",
    )
    ap.add_argument(
        "--kill-owner-at",
        type=float,
        default=None,
        help="SIGKILL the server that diagnoses the job this many seconds in (--spawn, --servers >= 2) "
        "and report how long until another one diagnoses it",
    )
    ap.add_argument("--fault-at", type=float, default=None, help="seconds in (default: 2/3 of duration)")
    ap.add_argument("--fault-rank", type=int, default=5)
    ap.add_argument(
        "--stall-after", type=float, default=5.0, help="the servers' FLIGHTDECK_SERVER_STALL_AFTER_S"
    )
    ap.add_argument(
        "--inflight", type=int, help="FLIGHTDECK_SERVER_MAX_INFLIGHT_INGESTS (--spawn; default: the server's)"
    )
    ap.add_argument(
        "--digests",
        action="store_true",
        help="hosts speak the progress-digest protocol of large jobs: a POST /api/v1/digest per "
        "host and interval, and an ingest batch (the interval's changed entries and the open ones) "
        "only when the answer asks for the job's entries",
    )
    ap.add_argument(
        "--drop-completions",
        action="store_true",
        help="--digests: do not add to a batch the server asks for the completion of the entries an "
        "earlier batch carried open whose completion fell in a snapshot that was not shipped (the "
        "collector adds them: without them the server holds such entries open for ever)",
    )
    ap.add_argument(
        "--groups-resend-s",
        type=float,
        default=GROUPS_RESEND_S,
        help="ship a rank's groups when new and again after this long, as the collector does "
        "(0: in every snapshot, as collectors before this change did)",
    )
    args = ap.parse_args(argv)
    if args.ranks % args.hosts:
        ap.error("--ranks must be a multiple of --hosts")
    if args.fault_at is None:
        args.fault_at = args.duration * 2 / 3
    faults: list[Fault] = []
    old = [x for x in args.fault if "@" not in x] or ([] if args.fault else ["hang"])
    if len(old) > 1 or (old and len(args.fault) > 1):
        ap.error("give one --fault KIND (with --fault-at, --fault-rank), or KIND@SECONDS forms")
    for x in old:
        if x not in (*FAULT_KINDS, "none"):
            ap.error(f"--fault {x!r}: expected hang, mismatch, none or KIND@SECONDS[:rank=R][:for=S]")
        if x != "none":
            faults.append(Fault(x, args.fault_at, args.fault_rank))
    for x in args.fault:
        if "@" in x:
            try:
                faults.append(parse_fault(x))
            except ValueError as exc:
                ap.error(f"--fault: {exc}")
    try:
        plan_faults([dataclasses.replace(f) for f in faults], 0, args.rate, args.groups, args.ranks)
    except ValueError as exc:
        ap.error(f"--fault: {exc}")
    args.faults = faults
    if args.drop_completions and not args.digests:
        ap.error("--drop-completions goes with --digests")
    if args.window_s <= 0:
        ap.error("--window-s must be positive")
    if args.kill_owner_at is not None and (not args.spawn or args.servers < 2):
        ap.error("--kill-owner-at needs --spawn and --servers >= 2")
    if args.cluster and args.spawn != "postgresql":
        ap.error("--cluster needs --spawn postgresql")
    if not args.spawn and not args.url:
        ap.error("give --spawn or --url")
    for u in args.url:
        if not u.startswith(("http://127.0.0.1", "http://localhost")):
            ap.error("the load generator only talks to 127.0.0.1")
    return args


def main(argv: list[str] | None = None) -> None:
    """Run once and print the figures as JSON."""
    args = parse_args(argv)
    if args.spawn:
        with spawned(args) as (urls, token, pids, url):
            out = asyncio.run(drive(args, urls, token, pids, url))
            out["db"] = args.spawn
            out["cluster"] = args.servers > 1 or args.cluster
    else:
        out = asyncio.run(drive(args, args.url, args.token, args.server_pid, args.database_url))
    print(json.dumps(out))
