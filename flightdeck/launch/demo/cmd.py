"""`flightdeck demo`: a 4-rank real gloo job with an injected fault, diagnosed live by Flightdeck.

    flightdeck demo [--scenario stall|crash|mismatch|partition|busy] [--server URL [--token T]] [--exit]

Without `--server` it runs its own server (SQLite in a temporary directory, or `--data-dir`) on
127.0.0.1, with the hang threshold `--stall-after` (default 5 s, the server's default); a server
given with `--server` uses its own (FLIGHTDECK_SERVER_STALL_AFTER_S, default 5 s). The threshold is the
server's alone: the agents have none (they write their stack snapshot after a fixed 2 s). It always
runs its own collector(s), on spool directories of its own, so a system-wide collector is not
needed; they push every `--push-interval` (default: the collector's, 1 s), the agents snapshot
every `--interval` (default: the agent's, 1 s). The job's ranks run `flightdeck.launch.demo.worker` with the agent; rank 1 commits
the fault at `--fault-at-step`:

- stall:     rank 1 blocks in its data loader (a hung storage read; not SIGSTOP, which the partition
             uses); the others wait in all_reduce.
             Its agent keeps running, so it is seen alive but not entering the collective.
- crash:     rank 1 SIGKILLs itself.
- mismatch:  rank 1 all-gathers where the others all-reduce (another code path).
- partition: simulated, there is no link to cut on loopback: ranks 0-1 are "host-a" and ranks 2-3
             "host-b", each with its own spool and collector. The cut SIGSTOPs host-b's ranks and its
             collector (nothing flows either way, as in a partition) for `--partition-s` seconds,
             and at least until the finding is in; then SIGCONT brings the "link" back, host-b's
             data arrives and the job goes on.
- busy:      no fault: rank 1 saves a checkpoint for `--busy-s` seconds (computing and writing a
             file) while the others wait in a barrier, then the job goes on. The demo lists the
             findings opened meanwhile; a busy rank is slow_rank (a warning), not a hang, and
             should not page anyone. The job's group timeout is at least 3 x `--busy-s` (900 s
             for the default 90 s): the server's slow ceiling is half the group's timeout.

The demo prints the verdict, the time from fault to finding and the link to the incident page,
then serves until Ctrl-C (`--exit`: stops at once).

One module over 500 lines: the command's options, its scenario table and the run that starts,
faults and watches the job; the ranks' own code is `ranks.py`.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from flightdeck.launch.demo.ranks import JobSpec, free_port, start_rank, stop_all
from flightdeck.launch.demo.worker import busy_pg_timeout_s

SCENARIOS = ("stall", "crash", "mismatch", "partition", "busy")
WORLD_SIZE = 4
FAULT_RANK = 1
#: Ranks of each simulated host in the partition scenario; the cut isolates the last one.
PARTITION_HOSTS = {"host-a": (0, 1), "host-b": (2, 3)}
#: What rank 1 prints (worker.py) as it commits each fault: the fault's moment.
FAULT_MARKERS = {
    "stall": "stalling in load_batch",
    "crash": "crashing (SIGKILL)",
    "mismatch": "taking another code path",
    "busy": "busy in save_checkpoint",
}
#: Findings that are consequences or noise rather than the injected fault.
NOT_THE_FAULT = {"straggler", "missing_dump", "undecided"}
DEFAULT_PORT = 8470


class DemoError(RuntimeError):
    """The demo could not go on; the message says why (and where the logs are)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Declare the arguments of `flightdeck demo`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = __doc__
    parser.add_argument("--scenario", choices=SCENARIOS, default="stall", help="the fault (default stall)")
    parser.add_argument("--server", default=None, help="use this server (URL) instead of starting one")
    parser.add_argument("--token", default=None, help="collector token for --server")
    parser.add_argument("--data-dir", type=Path, default=None, help="own server's data (default: temporary)")
    parser.add_argument(
        "--port", type=int, default=None, help="own server's port (default 8470, or a free one if taken)"
    )
    parser.add_argument(
        "--stall-after", type=float, default=5.0, help="hang threshold of the own server (s, default 5)"
    )
    parser.add_argument(
        "--interval", type=float, default=None, help="agent snapshot interval (s; default the agent's, 1)"
    )
    parser.add_argument(
        "--push-interval",
        type=float,
        default=None,
        help="collector push interval (s; default the collector's, 1)",
    )
    parser.add_argument("--busy-s", type=float, default=90.0, help="busy: how long rank 1 saves (s)")
    parser.add_argument("--fault-at-step", type=int, default=10, help="training step of the fault")
    parser.add_argument("--partition-s", type=float, default=20.0, help="partition: least time cut off (s)")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="report a finding once unchanged this long (s)"
    )
    parser.add_argument("--timeout", type=float, default=180.0, help="give up waiting after this many s")
    parser.add_argument("--exit", action="store_true", help="stop after printing the verdict")


@dataclass
class Run:
    """What one demo run measured."""

    job: str
    url: str
    fault_s: float = 0.0
    finding_s: float = 0.0
    collective_s: float = 0.0
    findings: list[dict[str, Any]] = field(default_factory=list)
    link_back_s: float | None = None
    cut_off_data_s: float | None = None
    resolved_s: float | None = None
    #: busy: when rank 1 was done and when every rank had gone on training (epoch s)
    busy_done_s: float | None = None
    went_on_s: float | None = None
    #: busy: (first seen, epoch s; finding) of every finding opened meanwhile, oldest first
    busy_seen: list[tuple[float, dict[str, Any]]] = field(default_factory=list)


class Api:
    """The server's JSON API, read with the collector token when there is one."""

    def __init__(self, url: str, token: str | None) -> None:
        self.url = url
        self.token = token

    def get(self, path: str) -> Any:
        """GET `path` as JSON; None on 404 (the job is not there yet)."""
        import httpx

        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        try:
            r = httpx.get(self.url + path, headers=headers, timeout=10)
        except httpx.HTTPError as exc:
            raise DemoError(f"{self.url}{path}: {exc}") from None
        if r.status_code == 404:
            return None
        if r.status_code != 200:
            raise DemoError(f"{self.url}{path}: HTTP {r.status_code} {r.text[:200]}")
        return r.json()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """Run the scenario; 0 when the fault was diagnosed, 1 when not, 2 when it cannot run here."""
    if not _have_torch():
        print("flightdeck demo: the demo runs a real gloo job: pip install torch", file=sys.stderr)
        return 2
    from flightdeck.launch.local_stack import StackError

    signal.signal(signal.SIGTERM, _interrupt)
    demo = Demo(args)
    try:
        demo.start()
        demo.inject()
        if args.scenario == "busy":
            demo.watch_busy()
            print(busy_verdict(demo.result, args.busy_s), flush=True)
        else:
            demo.await_findings()
            print(verdict(demo.result), flush=True)
        if args.scenario == "partition":
            demo.heal()
        print(f"incident: {demo.result.url}", flush=True)
        if not args.exit:
            print("serving until Ctrl-C (the job keeps running; open the link)", flush=True)
            while True:
                demo.check_alive()
                time.sleep(1)
        return 0
    except KeyboardInterrupt:
        print("flightdeck demo: stopping", file=sys.stderr)
        return 0
    except (DemoError, StackError, OSError) as exc:
        print(f"flightdeck demo: {exc}\n(logs in {demo.work / 'logs'})", file=sys.stderr)
        demo.keep_logs = True
        return 1
    finally:
        demo.close()


class Demo:
    """One demo run: its processes, its working directory (spools, logs) and what it measured."""

    def __init__(self, args: argparse.Namespace) -> None:
        from flightdeck.launch.local_stack import Child, LocalStack

        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="flightdeck-demo-"))
        self.keep_logs = False
        self.stack = LocalStack(log_dir=self.work / "logs")
        self.hosts = PARTITION_HOSTS if args.scenario == "partition" else {"local": tuple(range(WORLD_SIZE))}
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self.collectors: dict[str, Child] = {}
        self.api = Api("", None)
        self.job = f"demo-{args.scenario}-{uuid.uuid4().hex[:6]}"
        self.result = Run(job=self.job, url="")
        self.deadline = time.monotonic() + args.timeout + (args.busy_s if args.scenario == "busy" else 0.0)
        self.cut: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        """The server (unless --server), one collector per host, then the job's ranks."""
        url, token_files = self._server()
        self.result.url = f"{url}/jobs/{urllib.parse.quote(self.job)}"
        for h in self.hosts:
            # Made before the collectors start: a missing root is only found at the next full rescan.
            (self.work / f"spool-{h}").mkdir()
            self.collectors[h] = self.stack.start_collector(
                name=f"collector-{h}",
                server_url=url,
                spool_dirs=[self.work / f"spool-{h}"],
                state_dir=self.work / f"state-{h}",
                token_file=token_files[h],
                torch_dumps=False,
                host_name=h if len(self.hosts) > 1 else None,
                push_interval_s=self.args.push_interval,
            )
        spec = JobSpec(
            job=self.job,
            world_size=WORLD_SIZE,
            master_addr="127.0.0.1",
            master_port=free_port(),
            spool_dir=self.work / "spool-local",
            worker_args=_worker_args(self.args),
            interval_s=self.args.interval,
        )
        for h, members in self.hosts.items():
            for r in members:
                with open(self.work / "logs" / f"rank_{r}.log", "wb") as log:
                    self.ranks[r] = start_rank(spec, r, spool_dir=self.work / f"spool-{h}", log=log)
        logs = self.work / "logs"
        print(f"job {self.job}: {WORLD_SIZE} ranks over gloo, scenario {self.args.scenario} (logs in {logs})")

    def _server(self) -> tuple[str, dict[str, Path | None]]:
        """The server's URL and each host's collector token file; starts the server when needed."""
        from flightdeck.launch.local_stack import port_in_use, provision_token, sqlite_url

        args = self.args
        (self.work / "logs").mkdir()
        if args.server:
            url = str(args.server).rstrip("/")
            token_file = None
            if args.token:
                token_file = self.work / "token"
                token_file.write_text(args.token)
                os.chmod(token_file, 0o600)
            self.api = Api(url, args.token)
            return url, {h: token_file for h in self.hosts}
        data_dir = (args.data_dir or self.work / "data").resolve()
        port = args.port or (DEFAULT_PORT if not port_in_use("127.0.0.1", DEFAULT_PORT) else free_port())
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        token_files: dict[str, Path | None] = {}
        token = None
        for h in self.hosts:
            path = data_dir / f"demo-{h}.token"
            token = provision_token(sqlite_url(data_dir), path, name=f"demo-{h}")
            token_files[h] = path
        print(f"starting the server on 127.0.0.1:{port} (data in {data_dir})", flush=True)
        url = self.stack.start_server(data_dir=data_dir, port=port, stall_after_s=args.stall_after)
        self.api = Api(url, token)
        return url, token_files

    def check_alive(self) -> None:
        """Raise DemoError when the server or a collector died."""
        dead = self.stack.exited()
        if dead is not None:
            raise DemoError(f"the {dead.name} exited (code {dead.proc.returncode})\n{dead.log_tail()}")

    def inject(self) -> None:
        """Wait for rank 1's fault (or, for a partition, cut host-b off); note its time."""
        step = self.args.fault_at_step
        if self.args.scenario == "partition":
            b_ranks = PARTITION_HOSTS["host-b"]
            _wait_for(
                lambda: all(_log_has(self.work, r, f"step {step}\n") for r in self.ranks),
                self.deadline,
                "the ranks to reach the fault step",
                self.check_alive,
            )
            self.cut = [self.ranks[r] for r in b_ranks] + [self.collectors["host-b"].proc]
            for p in self.cut:
                p.send_signal(signal.SIGSTOP)
            self.result.fault_s = time.time()
            print(
                f"cut off host-b (ranks {_join(b_ranks)} and its collector: SIGSTOP at {self.result.fault_s:.3f})",
                flush=True,
            )
            return
        marker = FAULT_MARKERS[self.args.scenario]
        _wait_for(
            lambda: _log_has(self.work, FAULT_RANK, marker),
            self.deadline,
            f"rank {FAULT_RANK} to commit the fault",
            self.check_alive,
        )
        self.result.fault_s = time.time()
        print(f"rank {FAULT_RANK}: {marker} (at {self.result.fault_s:.3f})", flush=True)

    def await_findings(self) -> None:
        """Poll the job's report until its findings settle and one names the blocked collective.

        While the ranks' last snapshots trickle in, the diagnosis can change for a moment (a
        survivor whose final snapshot is late looks lost): the findings count once they stayed the
        same for `--settle` seconds; the times are to each one's first appearance.
        """
        first_seen: dict[tuple[Any, ...], float] = {}
        stable: list[Any] = [(), 0.0]  # the current findings' keys, since when
        path = f"/api/v1/jobs/{urllib.parse.quote(self.job)}"

        def settled() -> bool:
            self.check_alive()
            report = self.api.get(path) or {}
            fault = [f for f in report.get("findings", []) if f.get("kind") not in NOT_THE_FAULT]
            now = time.time()
            keys = tuple(_key(f) for f in fault)
            for k in keys:
                first_seen.setdefault(k, now)
            if keys != stable[0]:
                stable[:] = [keys, now]
            named = next((f for f in fault if f.get("collective_seq_id") is not None), None)
            if named is None or now - stable[1] < self.args.settle:
                return False
            self.result.findings = fault
            self.result.finding_s = first_seen[keys[0]]
            self.result.collective_s = first_seen[_key(named)]
            return True

        try:
            _wait_for(settled, self.deadline, "the finding", lambda: None, poll_s=0.2)
        except DemoError as exc:
            # Most often the collectors could not ship (a wrong --token): show what they said.
            tails = "\n".join(f"{c.name}:\n{c.log_tail(5)}" for c in self.collectors.values())
            raise DemoError(f"{exc}\n{tails}") from None

    def watch_busy(self) -> None:
        """Busy: record every finding opened (even briefly) until rank 1 is done, every rank has
        gone on two steps and `--settle` seconds more have passed."""
        r = self.result
        path = f"/api/v1/jobs/{urllib.parse.quote(self.job)}/findings"
        first_seen: dict[tuple[Any, ...], tuple[float, dict[str, Any]]] = {}
        on = f"step {self.args.fault_at_step + 2}\n"

        def done() -> bool:
            self.check_alive()
            now = time.time()
            for row in (self.api.get(path) or {}).get("findings", []):
                f = row["finding"]
                if f.get("kind") not in ("missing_dump", "undecided"):
                    first_seen.setdefault(_key(f), (now, f))
            if r.busy_done_s is None and _log_has(self.work, FAULT_RANK, "checkpoint saved"):
                r.busy_done_s = now
            if (
                r.went_on_s is None
                and r.busy_done_s is not None
                and all(_log_has(self.work, k, on) for k in self.ranks)
            ):
                r.went_on_s = now
            return r.went_on_s is not None and now - r.went_on_s >= self.args.settle

        _wait_for(
            done, self.deadline, "the busy rank to finish and the job to go on", lambda: None, poll_s=0.2
        )
        ordered = sorted(first_seen.values(), key=lambda v: v[0])
        r.findings = [f for _, f in ordered]
        r.finding_s = ordered[0][0] if ordered else 0.0
        r.busy_seen = ordered

    def heal(self) -> None:
        """Partition: bring host-b back after `--partition-s`, then wait for its data and the resolution."""
        r = self.result
        left = self.args.partition_s - (time.time() - r.fault_s)
        if left > 0:
            time.sleep(left)
        for p in reversed(self.cut):  # the collector first: it is ready when the ranks write again
            p.send_signal(signal.SIGCONT)
        back = r.link_back_s = time.time()
        print(f"link back after {back - r.fault_s:.1f} s (SIGCONT)", flush=True)
        b_ranks = PARTITION_HOSTS["host-b"]

        def b_arrived() -> bool:
            self.check_alive()
            return all(_sent_since(self.api, self.job, rank, back) for rank in b_ranks)

        _wait_for(b_arrived, self.deadline, "host-b's data after the link returned", lambda: None, 0.2)
        r.cut_off_data_s = time.time()
        print(
            f"host-b's data arrived {r.cut_off_data_s - back:.1f} s after the link returned "
            f"(collectives of ranks {_join(b_ranks)} started after it)",
            flush=True,
        )
        path = f"/api/v1/jobs/{urllib.parse.quote(self.job)}/findings"
        root = _key(r.findings[0])

        def resolved() -> bool:
            history = self.api.get(path) or {}
            return any(not f["open"] and _key(f["finding"]) == root for f in history.get("findings", []))

        try:
            _wait_for(
                resolved, min(self.deadline, time.monotonic() + 30), "the resolution", lambda: None, 0.5
            )
        except DemoError:
            print("finding not resolved yet (the job is moving again)")
            return
        r.resolved_s = time.time()
        print(f"finding resolved {r.resolved_s - back:.1f} s after the link returned", flush=True)

    def close(self) -> None:
        """Stop the ranks, collectors and server; remove the working directory unless logs are kept."""
        stop_all(self.ranks.values())
        self.stack.stop()
        if not self.keep_logs:
            shutil.rmtree(self.work, ignore_errors=True)


def _join(ranks: tuple[int, ...]) -> str:
    return ", ".join(map(str, ranks))


def _have_torch() -> bool:
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # a broken or half-installed torch
        return False


def _worker_args(args: argparse.Namespace) -> list[str]:
    fault = "none" if args.scenario == "partition" else args.scenario
    # 900 s: gloo must not abort a demo that serves its stalled job until Ctrl-C. Busy: at least
    # 3 x the busy time, since the server calls a rank still busy after half the group's timeout
    # (its default slow ceiling) hung -- with 120 s a 90 s save would page at 60 s.
    timeout = max(900.0, busy_pg_timeout_s(args.busy_s)) if fault == "busy" else 900.0
    return [
        "--steps", "100000",
        "--fault", fault,
        "--fault-rank", str(FAULT_RANK),
        "--fault-at-step", str(args.fault_at_step),
        "--pg-timeout-s", f"{timeout:g}",
        "--busy-s", str(args.busy_s),
    ]  # fmt: skip


def _log_has(work: Path, rank: int, text: str) -> bool:
    try:
        return text in (work / "logs" / f"rank_{rank}.log").read_text(errors="replace")
    except OSError:
        return False


def _sent_since(api: Api, job: str, rank: int, since_s: float) -> bool:
    """Whether the server holds an entry `rank` created after `since_s` (so shipped after it)."""
    query = urllib.parse.urlencode({"rank_from": rank, "rank_to": rank, "limit": 10_000})
    timeline = api.get(f"/api/v1/jobs/{urllib.parse.quote(job)}/timeline?{query}") or {}
    since_ns = since_s * 1e9
    return any((e.get("time_created_ns") or 0) > since_ns for e in timeline.get("entries", []))


def _wait_for(
    cond: Callable[[], bool], deadline: float, what: str, check: Callable[[], None], poll_s: float = 0.05
) -> None:
    while not cond():
        check()
        if time.monotonic() > deadline:
            raise DemoError(f"gave up waiting for {what}")
        time.sleep(poll_s)


def _key(f: Mapping[str, Any]) -> tuple[Any, ...]:
    return (f.get("kind"), tuple(f.get("culprit_ranks") or ()), f.get("process_group"), f.get("op"))


def _culprits(f: Mapping[str, Any]) -> str:
    culprits = f.get("culprits") or []
    if culprits:
        return ", ".join(f"rank {c.get('rank')} on {c.get('host')} pid {c.get('pid')}" for c in culprits)
    return ", ".join(f"rank {r}" for r in f.get("culprit_ranks") or []) or "-"


def _collective(f: Mapping[str, Any]) -> str:
    desc = f.get("process_group_desc")
    elapsed = f.get("elapsed_s")
    return (
        f"group {f.get('process_group')}{f' ({desc})' if desc else ''}, seq id {f.get('collective_seq_id')}, "
        f"op {f.get('op')}, elapsed {f'{elapsed:.1f} s' if isinstance(elapsed, (int, float)) else '-'}"
    )


def busy_verdict(result: Run, busy_s: float) -> str:
    """What happened while rank 1 was busy: each finding opened, when, and the count of hangs."""
    waited = ", ".join(str(r) for r in range(WORLD_SIZE) if r != FAULT_RANK)
    done = result.busy_done_s - result.fault_s if result.busy_done_s else busy_s
    lines = [
        f"busy: rank {FAULT_RANK} saved a checkpoint for {done:.1f} s while ranks {waited} waited in a "
        "barrier; the job went on",
    ]
    hangs = [f for f in result.findings if f.get("kind") == "hang"]
    if result.busy_seen:
        lines.append("findings while busy:")
        for seen, f in result.busy_seen:
            lines.append(
                f"  {f.get('kind')} after {seen - result.fault_s:.1f} s: {_culprits(f)}; {f.get('detail', '')}"
            )
    else:
        lines.append("findings while busy: none")
    lines.append(f"hang findings: {len(hangs)}")
    return "\n".join(lines)


def verdict(result: Run) -> str:
    """The findings (root cause first) in a few lines, with the time from fault to finding."""
    lines = [f"verdict: {str(result.findings[0].get('kind', '?')).upper()}"]
    for i, f in enumerate(result.findings, 1):
        waiting = ", ".join(map(str, f.get("waiting_ranks") or []))
        lines.append(f"  {i}. {f.get('kind')}: {_culprits(f)}" + (f"; waiting: {waiting}" if waiting else ""))
        if f.get("collective_seq_id") is not None:
            lines.append(f"     {_collective(f)}")
        lines.append(f"     {f.get('detail', '')}")
    culprit_ranks = sorted({r for f in result.findings for r in f.get("culprit_ranks") or []})
    named = next(f for f in result.findings if f.get("collective_seq_id") is not None)
    fault_at = time.strftime("%H:%M:%S", time.localtime(result.fault_s))
    lines += [
        f"culprit ranks: {', '.join(map(str, culprit_ranks))}",
        f"blocked collective: {_collective(named)}",
        f"fault -> finding: {result.finding_s - result.fault_s:.1f} s"
        f" (blocked collective named after {result.collective_s - result.fault_s:.1f} s; fault at {fault_at})",
    ]
    return "\n".join(lines)
