"""Test helper: a multi-host cluster on one machine, built from network namespaces.

    root namespace:  bridge fdbr<pid> 10.213.X.1/24 — `flightdeck server` listens there
                     (Prometheus on 127.0.0.1 scrapes it at that address)
    host i:          namespace fd-h<i>-<pid>, hostname fd-h<i>-<pid> (its own UTS namespace for
                     the ranks), eth0 10.213.X.(10+i)/24 whose peer fdv<i>x<pid> is a bridge port;
                     runs ranks of one gloo job (agent in-process, spooling to the host's own spool)
                     and its own `flightdeck collector`, pushing to the server over the bridge.

`shipped_defaults=True` sets no threshold or interval anywhere: the server, the collectors and the
agents run with their defaults (for the benchmarks); otherwise `stall_after_s` goes to the server
(the agents have no threshold), agents snapshot every 1 s and collectors push every 0.5 s (for the
tests).

A partition is `ip link set fdv<i>x<pid> down` in the root namespace: the host keeps running but
reaches neither the other hosts nor the server. Names carry the owning process id, so parallel
runs do not clash and leftovers of a crashed run (owner gone) are removed at the next start. The
subnet X is one no interface uses yet. Needs root and iproute2 (`netns_unavailable()` says why
not); every command and wait is bounded; `stop()` undoes everything, also after a failure.

One module past 500 lines on purpose: the cluster, its hosts and jobs, and the faults injected
into it share the namespace names, the bounded commands and the cleanup.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from flightdeck.launch.demo.ranks import JobSpec, free_port, start_rank, stop_all
from flightdeck.launch.demo.worker import busy_pg_timeout_s
from tests.support.cli import create_token
from tests.support.ops_stack import Delivery, WebhookReceiver
from tests.support.server_process import ServerProcess

#: Namespaces, bridges and root-side veths this module creates; the number is the owner's pid.
_NS_RE = re.compile(r"^fd-h\d+-(\d+)$")
_LINK_RE = re.compile(r"^fd(?:br|v\d+x)(\d+)$")
#: Variables of the caller that must not reach the collectors (they configure agents and tests).
_OWN_PREFIX = "FLIGHTDECK_"


class ClusterError(RuntimeError):
    """A cluster component did not start, or an awaited event did not happen in time."""


def _run(
    cmd: Sequence[str], *, check: bool = True, timeout: float = 20.0
) -> subprocess.CompletedProcess[str]:
    """Run a short command (iproute2 mostly), bounded in time."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise ClusterError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def netns_unavailable() -> str | None:
    """Why a namespace cluster cannot be built here (not root, no iproute2, no netns), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root (ip netns, veth pairs, a bridge)"
    if shutil.which("ip") is None or shutil.which("unshare") is None or shutil.which("hostname") is None:
        return "needs iproute2 (`ip`) and util-linux (`unshare`, `hostname`)"
    probe = f"fd-h99-{os.getpid()}"
    try:
        made = _run(["ip", "netns", "add", probe], check=False)
        if made.returncode != 0:
            return f"`ip netns add` fails: {made.stderr.strip()}"
        _run(["ip", "netns", "del", probe], check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`ip netns` unusable: {exc}"
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_inside(namespace: str) -> None:
    """SIGKILL every process in the namespace, by pid (deleting a namespace does not end them)."""
    for pid in _run(["ip", "netns", "pids", namespace], check=False).stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)


def cleanup_leftovers() -> list[str]:
    """Remove namespaces and links of earlier runs whose owner process is gone; returns their names.

    Processes still running inside such a namespace (ranks, collectors of a crashed run) are killed
    by pid first: deleting a namespace does not end them.
    """
    removed: list[str] = []
    for line in _run(["ip", "netns", "list"], check=False).stdout.splitlines():
        name = line.split()[0] if line.strip() else ""
        m = _NS_RE.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        _kill_inside(name)
        _run(["ip", "netns", "del", name], check=False)
        removed.append(name)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = _LINK_RE.match(name)
        if m is None or _alive(int(m.group(1))):
            continue
        _run(["ip", "link", "del", name], check=False)
        removed.append(name)
    return removed


def _free_subnet() -> str:
    """`10.213.X` for an X that no interface address uses (7 first)."""
    used = set(re.findall(r"inet 10\.213\.(\d+)\.", _run(["ip", "-4", "-o", "addr"], check=False).stdout))
    for x in [7, *range(8, 255)]:
        if str(x) not in used:
            return f"10.213.{x}"
    raise ClusterError("no free 10.213.X.0/24 subnet")


def _get(url: str, timeout: float = 3.0) -> tuple[int, bytes]:
    """GET `url`; (status, body), status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return error.code, b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Poll `predicate` until it returns something truthy (returned); ClusterError after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


@dataclass
class Host:
    """One namespace "host": its address, links, spool and collector."""

    index: int
    name: str
    ip: str
    veth_root: str
    spool_dir: Path
    state_dir: Path
    collector: subprocess.Popen[bytes] | None = None

    def prefix(self) -> list[str]:
        """Command prefix that runs a program on this host, under the host's own hostname."""
        # unshare --uts: a hostname of its own, so the agent records this host, as on a real node;
        # `exec` keeps the program's pid the one Popen returns (for SIGSTOP/SIGKILL from outside).
        return [
            "ip", "netns", "exec", self.name,
            "unshare", "--uts", "--", "sh", "-c", 'hostname "$0" && exec "$@"', self.name,
        ]  # fmt: skip


@dataclass
class Job:
    """A running job on the cluster: its ranks, where each runs, and each rank's log."""

    spec: JobSpec
    procs: dict[int, subprocess.Popen[bytes]]
    hosts: dict[int, Host]
    logs: dict[int, Path]
    _files: list[IO[bytes]] = field(default_factory=list)

    def log_text(self, rank: int) -> str:
        """Everything the rank printed so far."""
        return self.logs[rank].read_text(encoding="utf-8", errors="replace")

    def wait_for_line(self, rank: int, text: str, timeout: float) -> float:
        """Wait until the rank printed a line holding `text`; returns time.monotonic() then."""

        def seen() -> bool:
            proc = self.procs[rank]
            if text in self.log_text(rank):
                return True
            if proc.poll() is not None:
                raise ClusterError(f"rank {rank} exited ({proc.returncode}):\n{self.log_text(rank)[-2000:]}")
            return False

        wait_for(seen, timeout, f"rank {rank} to print {text!r}", interval=0.02)
        return time.monotonic()

    def spool(self, rank: int) -> Path:
        """The directory the rank's agent writes its snapshots to (attempt 0)."""
        return self.hosts[rank].spool_dir / self.spec.job / "0"

    def stop(self) -> None:
        """Kill every rank (SIGCONT first, for a stopped one) and close the logs."""
        stop_all(self.procs.values())
        for f in self._files:
            f.close()


@dataclass
class NetnsCluster:
    """Server in the root namespace, `hosts` namespace hosts each with a collector.

    `start()` builds it, `stop()` tears it down (idempotent, safe after a partial start).
    """

    workdir: Path
    hosts_n: int = 2
    stall_after_s: float = 10.0
    #: True: no threshold or interval is set anywhere (server, collectors, agents use their defaults)
    shipped_defaults: bool = False
    start_timeout_s: float = 60.0
    owner: int = field(default_factory=os.getpid)
    hosts: list[Host] = field(default_factory=list)
    server: ServerProcess | None = None
    subnet: str = ""
    port: int = 0
    token: str = ""
    _links: list[str] = field(default_factory=list)
    _namespaces: list[str] = field(default_factory=list)
    _jobs: list[Job] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        """Name of the bridge in the root namespace."""
        return f"fdbr{self.owner}"

    @property
    def bridge_ip(self) -> str:
        """The root namespace's address on the bridge (the server's)."""
        return f"{self.subnet}.1"

    @property
    def server_url(self) -> str:
        """Base URL of the server, as the hosts (and the root namespace) reach it."""
        return f"http://{self.bridge_ip}:{self.port}"

    # --- build and tear down ------------------------------------------------------------------

    def start(self) -> NetnsCluster:
        """Network, server, token, one collector per host; returns once the server answers."""
        cleanup_leftovers()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.subnet = _free_subnet()
        self._network()
        self._start_server()
        for host in self.hosts:
            self._start_collector(host)
        return self

    def _network(self) -> None:
        ip = ["ip"]
        _run([*ip, "link", "add", self.bridge, "type", "bridge"])
        self._links.append(self.bridge)
        _run([*ip, "addr", "add", f"{self.bridge_ip}/24", "dev", self.bridge])
        _run([*ip, "link", "set", self.bridge, "up"])
        for i in range(self.hosts_n):
            name = f"fd-h{i}-{self.owner}"
            veth, peer = f"fdv{i}x{self.owner}", f"fdp{i}x{self.owner}"
            _run([*ip, "netns", "add", name])
            self._namespaces.append(name)
            _run([*ip, "link", "add", veth, "type", "veth", "peer", "name", peer])
            self._links.append(veth)
            _run([*ip, "link", "set", peer, "netns", name])
            _run([*ip, "-n", name, "link", "set", peer, "name", "eth0"])
            _run([*ip, "-n", name, "addr", "add", f"{self.subnet}.{10 + i}/24", "dev", "eth0"])
            _run([*ip, "-n", name, "link", "set", "eth0", "up"])
            _run([*ip, "-n", name, "link", "set", "lo", "up"])
            _run([*ip, "link", "set", veth, "master", self.bridge])
            _run([*ip, "link", "set", veth, "up"])
            root = self.workdir / name
            self.hosts.append(
                Host(i, name, f"{self.subnet}.{10 + i}", veth, root / "spool", root / "collector-state")
            )

    def _clean_env(self) -> dict[str, str]:
        return {k: v for k, v in os.environ.items() if not k.startswith(_OWN_PREFIX)}

    def _start_server(self) -> None:
        data = self.workdir / "server-data"
        data.mkdir(exist_ok=True)
        env = {**self._clean_env(), "FLIGHTDECK_SERVER_DATA_DIR": str(data)}
        if not self.shipped_defaults:
            env["FLIGHTDECK_SERVER_STALL_AFTER_S"] = str(self.stall_after_s)
        self.server = ServerProcess(env, self.workdir / "server.log", host=self.bridge_ip)
        self.port = self.server.port
        # The token goes into the server's database: same environment as the server.
        self.token = create_token(self.server.env, "netns-collectors")
        self.server.start(self.start_timeout_s)

    def _start_collector(self, host: Host) -> None:
        host.spool_dir.mkdir(parents=True, exist_ok=True)
        host.state_dir.mkdir(parents=True, exist_ok=True)
        token_file = host.state_dir.parent / "token"
        token_file.write_text(self.token, encoding="utf-8")
        token_file.chmod(0o600)
        env = {
            **self._clean_env(),
            "FLIGHTDECK_COLLECTOR_SERVER_URL": self.server_url,
            "FLIGHTDECK_COLLECTOR_TOKEN_FILE": str(token_file),
            "FLIGHTDECK_COLLECTOR_SPOOL_DIRS": json.dumps([str(host.spool_dir)]),
            "FLIGHTDECK_COLLECTOR_STATE_DIR": str(host.state_dir),
            "FLIGHTDECK_COLLECTOR_TORCH_DUMP_PREFIXES": "[]",
            "FLIGHTDECK_COLLECTOR_METRICS_LISTEN": "",
            "FLIGHTDECK_COLLECTOR_HOST": host.name,
        }
        if not self.shipped_defaults:
            # Push often and retry soon: a partition heals in seconds here, not minutes.
            env |= {
                "FLIGHTDECK_COLLECTOR_PUSH_INTERVAL_S": "0.5",
                "FLIGHTDECK_COLLECTOR_RETRY_BACKOFF_S": "0.2",
                "FLIGHTDECK_COLLECTOR_RETRY_BACKOFF_MAX_S": "1.0",
                "FLIGHTDECK_COLLECTOR_REQUEST_TIMEOUT_S": "2.0",
                "FLIGHTDECK_COLLECTOR_PUSH_DEADLINE_S": "5.0",
            }
        log = (self.workdir / f"collector-{host.name}.log").open("wb")
        host.collector = subprocess.Popen(
            ["ip", "netns", "exec", host.name, sys.executable, "-m", "flightdeck", "collector"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def stop(self) -> None:
        """Kill jobs and collectors, stop the server, delete links and namespaces (idempotent)."""
        for job in self._jobs:
            job.stop()
        self._jobs.clear()
        collectors = [h.collector for h in self.hosts if h.collector is not None]
        for proc in collectors:
            if proc.poll() is None:
                proc.terminate()
        for proc in collectors:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if self.server is not None:
            self.server.stop()
        self.server = None
        for h in self.hosts:
            h.collector = None
        for name in self._namespaces:
            # Anything left inside (a child a rank forked) would keep running after the namespace goes.
            _kill_inside(name)
        for link in reversed(self._links):
            _run(["ip", "link", "del", link], check=False)
        for name in self._namespaces:
            _run(["ip", "netns", "del", name], check=False)
        self._links.clear()
        self._namespaces.clear()

    def __enter__(self) -> NetnsCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tail(self, name: str, lines: int = 40) -> str:
        """The last lines of a log file in the work directory (server.log, collector-<host>.log)."""
        path = self.workdir / name
        text = path.read_text(encoding="utf-8", errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # --- jobs and faults ----------------------------------------------------------------------

    def start_job(
        self,
        job: str,
        worker_args: Sequence[str] = (),
        *,
        ranks_per_host: int = 2,
        interval_s: float | None = 1.0,
        extra_env: Mapping[str, str] | None = None,
    ) -> Job:
        """Start one gloo job over every host, `ranks_per_host` consecutive ranks on each (with
        `shipped_defaults`, the agents' own interval)."""
        world = ranks_per_host * len(self.hosts)
        spec = JobSpec(
            job=job,
            world_size=world,
            master_addr=self.hosts[0].ip,
            master_port=free_port(),
            spool_dir=self.hosts[0].spool_dir,
            worker_args=tuple(worker_args),
            interval_s=None if self.shipped_defaults else interval_s,
            extra_env={"GLOO_SOCKET_IFNAME": "eth0", **(extra_env or {})},
        )
        logs_dir = self.workdir / "jobs" / job
        logs_dir.mkdir(parents=True, exist_ok=True)
        out = Job(spec, {}, {}, {})
        self._jobs.append(out)
        for rank in range(world):
            host = self.hosts[rank // ranks_per_host]
            log_path = logs_dir / f"rank{rank}.log"
            f = log_path.open("wb")
            out._files.append(f)
            out.hosts[rank], out.logs[rank] = host, log_path
            out.procs[rank] = start_rank(
                spec,
                rank,
                local_rank=rank % ranks_per_host,
                spool_dir=host.spool_dir,
                prefix=host.prefix(),
                log=f,
            )
        return out

    def end_job(self, job: Job) -> None:
        """Stop a job's ranks."""
        job.stop()
        if job in self._jobs:
            self._jobs.remove(job)

    def set_link(self, host: Host, up: bool) -> None:
        """Cut (`up=False`) or restore the host's only link, at the bridge side."""
        _run(["ip", "link", "set", host.veth_root, "up" if up else "down"])

    # --- the server's view --------------------------------------------------------------------

    def api(self, path: str) -> Any:
        """GET a JSON path of the server (None when it is not there yet)."""
        status, body = _get(self.server_url + path)
        return json.loads(body) if status == 200 else None

    def page(self, path: str) -> str | None:
        """GET an HTML page of the server (None unless 200)."""
        status, body = _get(self.server_url + path)
        return body.decode("utf-8", errors="replace") if status == 200 else None


# --- faults ---------------------------------------------------------------------------------------

#: The faults of the acceptance (issue #7), each committed by rank FAULT_RANK on host 1.
FAULTS = ("partition", "stall", "crash", "mismatch")
#: Not a fault: rank FAULT_RANK saves a checkpoint (computes and writes) for BUSY_S seconds while
#: the others wait in a barrier, then the job goes on. Nothing should page. Its job's group timeout
#: is `busy_pg_timeout_s` (600 s for 90 s or 3 minutes): the server's default slow ceiling is half
#: the group's timeout, past which the busy rank would be reported hung (and gloo aborts at it).
BUSY = "busy"
BUSY_S = 90.0
#: The rank that commits (or suffers) the fault: the second rank of host 1.
FAULT_RANK = 3
#: The step at which it does (a few seconds into training; startup takes ~15 s on 2 cores).
FAULT_STEP = 25
#: The finding kind and the Prometheus alert each fault must raise.
EXPECTED = {
    "partition": ("hang", "FlightdeckCollectiveHang"),
    "stall": ("hang", "FlightdeckCollectiveHang"),
    "crash": ("hang", "FlightdeckCollectiveHang"),
    "mismatch": ("collective_type_mismatch", "FlightdeckCollectiveMismatch"),
}


@dataclass
class FaultRun:
    """One fault on a fresh job: when it was injected, and what the server and the webhook said when."""

    fault: str
    job: Job
    #: time.monotonic() of the injection (for crash/mismatch: when the rank announced it).
    injected_at: float
    #: the first open finding of the expected kind (the API row's `finding`), and when it was seen.
    finding: dict[str, Any] = field(default_factory=dict)
    finding_at: float = 0.0
    #: the firing alert for the job, and its arrival at the webhook.
    alert: dict[str, Any] = field(default_factory=dict)
    alert_at: float = 0.0

    @property
    def finding_s(self) -> float:
        """Seconds from injection to the finding in the API."""
        return self.finding_at - self.injected_at

    @property
    def alert_s(self) -> float:
        """Seconds from injection to the alert at the webhook."""
        return self.alert_at - self.injected_at


def inject_fault(
    cluster: NetnsCluster, fault: str, job_name: str, *, timeout_s: float = 120.0, busy_s: float = BUSY_S
) -> FaultRun:
    """Start a job over the cluster and commit `fault` (or `busy`) on rank FAULT_RANK mid-run."""
    if fault not in (*FAULTS, BUSY):
        raise ValueError(f"fault must be one of {(*FAULTS, BUSY)}, got {fault!r}")
    timeout = busy_pg_timeout_s(busy_s) if fault == BUSY else 600.0
    args = ["--steps", "5000", "--pg-timeout-s", f"{timeout:g}"]
    if fault in ("crash", "mismatch", BUSY):
        args += ["--fault", fault, "--fault-rank", str(FAULT_RANK), "--fault-at-step", str(FAULT_STEP)]
    if fault == BUSY:
        args += ["--busy-s", str(busy_s)]
    job = cluster.start_job(job_name, args)
    rank = FAULT_RANK
    if fault == BUSY:
        at = job.wait_for_line(rank, "busy in save_checkpoint", timeout_s)
    elif fault == "crash":
        at = job.wait_for_line(rank, "crashing (SIGKILL)", timeout_s)
    elif fault == "mismatch":
        at = job.wait_for_line(rank, "taking another code path", timeout_s)
    else:
        job.wait_for_line(rank, f"step {FAULT_STEP}\n", timeout_s)
        at = time.monotonic()
        if fault == "partition":
            cluster.set_link(job.hosts[rank], up=False)
        else:
            os.kill(job.procs[rank].pid, signal.SIGSTOP)
    return FaultRun(fault, job, at)


def await_finding(cluster: NetnsCluster, run: FaultRun, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait for the first open finding of the fault's expected kind in the JSON API; records it."""
    kind = EXPECTED[run.fault][0]
    path = f"/api/v1/jobs/{run.job.spec.job}/findings"

    def found() -> dict[str, Any] | None:
        doc = cluster.api(path) or {}
        for row in doc.get("findings", []):
            if row["open"] and row["finding"]["kind"] == kind:
                return dict(row["finding"])
        return None

    finding: dict[str, Any] = wait_for(found, timeout_s, f"a {kind} finding of {run.fault}", interval=0.1)
    run.finding, run.finding_at = finding, time.monotonic()
    return finding


def await_alert(webhook: WebhookReceiver, run: FaultRun, *, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait for the fault's alert for this job at the webhook; records it and its arrival time."""
    name, job = EXPECTED[run.fault][1], run.job.spec.job

    def match(d: Delivery) -> bool:
        return any(a["labels"].get("alertname") == name and a["labels"].get("job") == job for a in d.alerts())

    delivery = webhook.wait_for(match, timeout_s)
    (alert,) = [
        a for a in delivery.alerts() if a["labels"]["alertname"] == name and a["labels"]["job"] == job
    ]
    run.alert, run.alert_at = dict(alert), delivery.received_at
    return run.alert
