"""Test helper: the real alert path on 127.0.0.1, started and torn down inside a test.

    target /metrics → Prometheus (scrape + rule evaluation every 1 s)
                    → Alertmanager (group_wait 0 s, group_interval 1 s, repeat 1 h)
                    → WebhookReceiver (an http.server thread recording each POST and its arrival time)

`OpsStack(..., shipped=True)` runs the configuration docker-compose.yml ships instead
(dashboards/prometheus, dashboards/alerts, dashboards/alertmanager): the same intervals, rule
groups, routes and `group_wait`; `render_shipped()` rewrites only the addresses (the compose service
names) to 127.0.0.1 ports, and the receivers' URLs to the local webhook, keeping their paths
(`/flightdeck/critical` pages, `/flightdeck/warning` is the ticket queue).

Everything binds to 127.0.0.1 on free ports, lives in a temporary directory, and every wait has a
deadline. Binaries: `prometheus` and `prometheus-alertmanager` (Debian's packages `prometheus`
and `prometheus-alertmanager`); `alertmanager` (upstream name) is accepted too.

`fake_hang_target()` serves a Prometheus exposition the test controls; swap it for the real
`flightdeck server` by building a `HangTarget` with its address and a callable that makes it open a
hang finding.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from flightdeck.launch.demo.ranks import free_port

#: binaries tried for each component, first found wins.
PROMETHEUS_BINARIES = ("prometheus",)
ALERTMANAGER_BINARIES = ("prometheus-alertmanager", "alertmanager")

REPO = Path(__file__).resolve().parents[2]
#: What docker-compose.yml mounts into the Prometheus and Alertmanager containers.
SHIPPED_PROMETHEUS = REPO / "dashboards" / "prometheus" / "prometheus.yml"
#: The read token Prometheus scrapes with in `render_shipped` (a server may set it as its read_token).
READ_TOKEN = "ops-stack-read-token-0123456789"
SHIPPED_RULES_DIR = REPO / "dashboards" / "alerts"
SHIPPED_ALERTMANAGER = REPO / "dashboards" / "alertmanager" / "alertmanager.yml"
#: The webhook paths of the shipped receivers: critical alerts page, warnings make tickets.
PAGE_PATH = "/flightdeck/critical"
TICKET_PATH = "/flightdeck/warning"


class StackError(RuntimeError):
    """A component did not start, or an awaited event did not happen before its deadline."""


def find_binary(names: Sequence[str]) -> str | None:
    """The first of `names` on PATH, or None."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def _get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    """GET `url` (127.0.0.1 only); returns (status, body), status 0 when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as error:
        return error.code, b""
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05) -> None:
    """Poll `predicate` until it is true; raise StackError naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise StackError(f"timed out after {timeout:.0f} s waiting for {what}")


# --- webhook receiver -------------------------------------------------------------------------


@dataclass(frozen=True)
class Delivery:
    """One POST the webhook received: arrival time (time.monotonic()) and the decoded payload."""

    received_at: float
    payload: dict[str, Any]
    #: the request path (which receiver of the Alertmanager config posted it).
    path: str = "/alerts"

    def alerts(self, status: str = "firing") -> list[dict[str, Any]]:
        """The payload's alerts with the given status."""
        return [alert for alert in self.payload.get("alerts", []) if alert.get("status") == status]


class WebhookReceiver:
    """An Alertmanager webhook endpoint on 127.0.0.1 that records every POST with its arrival time."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        self._cond = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received_at = time.monotonic()
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                self.send_response(200)
                self.end_headers()
                with receiver._cond:
                    receiver.deliveries.append(Delivery(received_at, json.loads(body), self.path))
                    receiver._cond.notify_all()

            def log_message(self, format: str, *args: Any) -> None:
                """Silence the per-request log line."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook", daemon=True)

    @property
    def url(self) -> str:
        """The URL Alertmanager posts to."""
        return f"http://127.0.0.1:{self._server.server_address[1]}/alerts"

    @property
    def address(self) -> str:
        """`127.0.0.1:port` of the receiver (any path is accepted and recorded)."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> None:
        """Serve in a background thread."""
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and join the thread."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def wait_for(self, predicate: Callable[[Delivery], bool], timeout: float) -> Delivery:
        """The first delivery (past or future) matching `predicate`; StackError after `timeout` s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for delivery in self.deliveries:
                    if predicate(delivery):
                        return delivery
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StackError(
                        f"no matching webhook delivery within {timeout:.0f} s: {self.deliveries}"
                    )
                self._cond.wait(left)


def pages(deliveries: Sequence[Delivery], job: str) -> list[Delivery]:
    """The deliveries to the shipped paging receiver (`PAGE_PATH`) with a firing alert for `job`."""
    return [
        d
        for d in deliveries
        if d.path == PAGE_PATH and any(a["labels"].get("job") == job for a in d.alerts("firing"))
    ]


# --- targets ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HangTarget:
    """Something Prometheus scrapes that can be made to report a hang of (`job`, `group`)."""

    #: `host:port` for Prometheus' static_configs.
    address: str
    #: the path of the exposition, normally /metrics.
    metrics_path: str
    #: makes the target export `flightdeck_job_hang_active{job, group} 1` from its next scrape on.
    trigger_hang: Callable[[], None]
    job: str = "j"
    group: str = "0"


@contextmanager
def fake_hang_target(job: str = "j", group: str = "0", culprits: int = 1) -> Iterator[HangTarget]:
    """A real HTTP exposition (prometheus_client) with the hang gauges at 0 until triggered."""
    from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

    registry = CollectorRegistry()
    hang = Gauge(
        "flightdeck_job_hang_active", "1 while a hang finding is open", ["job", "group"], registry=registry
    )
    culprit = Gauge("flightdeck_job_culprit_ranks", "culprit ranks", ["job", "group"], registry=registry)
    hang.labels(job=job, group=group).set(0)
    culprit.labels(job=job, group=group).set(0)

    def trigger() -> None:
        culprit.labels(job=job, group=group).set(culprits)
        hang.labels(job=job, group=group).set(1)

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Silence the per-request log line."""

    server: WSGIServer = make_server("127.0.0.1", 0, make_wsgi_app(registry), handler_class=QuietHandler)
    thread = threading.Thread(target=server.serve_forever, name="fake-target", daemon=True)
    thread.start()
    try:
        yield HangTarget(f"127.0.0.1:{server.server_port}", "/metrics", trigger, job, group)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


# --- Prometheus + Alertmanager ------------------------------------------------------------------


#: The compose service addresses of the shipped configs, by what stands behind them here.
_PROMETHEUS_SELF = "localhost:9090"
_ALERTMANAGER_SERVICE = "alertmanager:9093"


def _local_targets(targets: Sequence[str], mapping: dict[str, str]) -> list[str]:
    """`targets` with each compose address replaced; an address we do not know is an error."""
    unknown = [t for t in targets if t not in mapping]
    if unknown:
        raise StackError(f"the shipped config names addresses render_shipped() does not map: {unknown}")
    return [mapping[t] for t in targets]


def render_shipped(
    workdir: Path,
    *,
    flightdeck_targets: Sequence[str],
    prometheus_port: int,
    alertmanager_port: int,
    webhook_address: str,
) -> tuple[Path, Path, dict[str, Any], dict[str, Any]]:
    """Write the shipped Prometheus and Alertmanager configs into `workdir`, addresses made local.

    Layout as in the Prometheus container (`prometheus/prometheus.yml` beside `alerts/`), so the
    config's relative `rule_files` path is used unchanged. Only these change: the Flightdeck
    server's DNS discovery becomes a static list of `flightdeck_targets`; the Alertmanager and
    Prometheus self addresses become the local ports; each receiver URL's host:port becomes
    `webhook_address` (its path stays). Returns (prometheus.yml, alertmanager.yml, and both
    rendered documents).
    """
    import yaml

    mapping = {
        _PROMETHEUS_SELF: f"127.0.0.1:{prometheus_port}",
        _ALERTMANAGER_SERVICE: f"127.0.0.1:{alertmanager_port}",
    }
    prometheus: dict[str, Any] = copy.deepcopy(yaml.safe_load(SHIPPED_PROMETHEUS.read_text(encoding="utf-8")))
    for am in prometheus["alerting"]["alertmanagers"]:
        for static in am["static_configs"]:
            static["targets"] = _local_targets(static["targets"], mapping)
    for job in prometheus["scrape_configs"]:
        if job["job_name"] == "flightdeck":
            # DNS discovery of the compose replicas -> the servers this test or bench runs
            del job["dns_sd_configs"]
            job["static_configs"] = [{"targets": list(flightdeck_targets)}]
            # compose's secret mount -> a token file here (servers with open reads ignore it)
            if "authorization" in job:
                workdir.mkdir(parents=True, exist_ok=True)
                token_file = workdir / "flightdeck_read_token"
                token_file.write_text(READ_TOKEN + "\n", encoding="utf-8")
                job["authorization"]["credentials_file"] = str(token_file)
        else:
            for static in job["static_configs"]:
                static["targets"] = _local_targets(static["targets"], mapping)
    alertmanager: dict[str, Any] = copy.deepcopy(
        yaml.safe_load(SHIPPED_ALERTMANAGER.read_text(encoding="utf-8"))
    )
    for receiver in alertmanager["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            parts = urlsplit(hook["url"])
            hook["url"] = urlunsplit(("http", webhook_address, parts.path, parts.query, ""))
    prometheus_dir = workdir / "prometheus"
    prometheus_dir.mkdir(parents=True, exist_ok=True)
    shutil.copytree(SHIPPED_RULES_DIR, workdir / "alerts", dirs_exist_ok=True)
    prometheus_yml = prometheus_dir / "prometheus.yml"
    prometheus_yml.write_text(yaml.safe_dump(prometheus, sort_keys=False), encoding="utf-8")
    alertmanager_dir = workdir / "alertmanager"
    alertmanager_dir.mkdir(parents=True, exist_ok=True)
    alertmanager_yml = alertmanager_dir / "alertmanager.yml"
    alertmanager_yml.write_text(yaml.safe_dump(alertmanager, sort_keys=False), encoding="utf-8")
    return prometheus_yml, alertmanager_yml, prometheus, alertmanager


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class OpsStack:
    """Real Prometheus + Alertmanager + webhook receiver for `targets`, evaluating `rule_files`.

    `shipped=True`: the configuration docker-compose.yml ships (`render_shipped`), its own rule
    file (`rule_files` must then be empty). Use as a context manager; `start()` returns once both
    servers answer `/-/ready`.
    """

    rule_files: Sequence[Path]
    targets: Sequence[HangTarget]
    workdir: Path
    shipped: bool = False
    start_timeout: float = 30.0
    prometheus_port: int = field(default_factory=free_port)
    alertmanager_port: int = field(default_factory=free_port)
    webhook: WebhookReceiver = field(default_factory=WebhookReceiver)
    _processes: list[_Process] = field(default_factory=list)

    @property
    def prometheus_url(self) -> str:
        """Base URL of Prometheus."""
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        """Base URL of Alertmanager."""
        return f"http://127.0.0.1:{self.alertmanager_port}"

    def _write_configs(self) -> tuple[Path, Path]:
        """prometheus.yml and alertmanager.yml (JSON is valid YAML) in the work directory."""
        prometheus = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(path) for path in self.rule_files],
            "alerting": {
                "alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{self.alertmanager_port}"]}]}]
            },
            "scrape_configs": [
                {
                    "job_name": "flightdeck",
                    # the server's own `job` label (the training job) must win over the scrape job
                    "honor_labels": True,
                    "metrics_path": target.metrics_path,
                    "static_configs": [{"targets": [target.address]}],
                }
                for target in self.targets
            ],
        }
        alertmanager = {
            "route": {
                "receiver": "webhook",
                "group_by": ["alertname", "job", "group"],
                "group_wait": "0s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {"name": "webhook", "webhook_configs": [{"url": self.webhook.url, "send_resolved": True}]}
            ],
        }
        prometheus_yml = self.workdir / "prometheus.yml"
        alertmanager_yml = self.workdir / "alertmanager.yml"
        prometheus_yml.write_text(json.dumps(prometheus, indent=2), encoding="utf-8")
        alertmanager_yml.write_text(json.dumps(alertmanager, indent=2), encoding="utf-8")
        return prometheus_yml, alertmanager_yml

    def _spawn(self, name: str, command: list[str]) -> None:
        log = self.workdir / f"{name}.log"
        with log.open("wb") as out:
            popen = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=self.workdir)
        self._processes.append(_Process(name, popen, log))

    def _wait_ready(self, process: _Process, url: str) -> None:
        def ready() -> bool:
            if process.popen.poll() is not None:
                raise StackError(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
            return _get(url + "/-/ready")[0] == 200

        try:
            wait_until(ready, self.start_timeout, f"{process.name} at {url}")
        except StackError as error:
            raise StackError(f"{error}\n{process.tail()}") from None

    def start(self) -> OpsStack:
        """Start the webhook, Alertmanager and Prometheus; return when both servers are ready."""
        prometheus = find_binary(PROMETHEUS_BINARIES)
        alertmanager = find_binary(ALERTMANAGER_BINARIES)
        if prometheus is None or alertmanager is None:
            raise StackError("prometheus and prometheus-alertmanager must be installed")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.webhook.start()
        if self.shipped:
            if self.rule_files:
                raise StackError("shipped=True evaluates the shipped rule file; pass rule_files=[]")
            for target in self.targets:
                if target.metrics_path != "/metrics":
                    raise StackError(f"the shipped config scrapes /metrics, not {target.metrics_path}")
            prometheus_yml, alertmanager_yml, _, _ = render_shipped(
                self.workdir,
                flightdeck_targets=[t.address for t in self.targets],
                prometheus_port=self.prometheus_port,
                alertmanager_port=self.alertmanager_port,
                webhook_address=self.webhook.address,
            )
        else:
            prometheus_yml, alertmanager_yml = self._write_configs()
        self._spawn(
            "alertmanager",
            [
                alertmanager,
                f"--config.file={alertmanager_yml}",
                f"--storage.path={self.workdir / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{self.alertmanager_port}",
                "--cluster.listen-address=",  # empty: no gossip on 0.0.0.0:9094
                "--log.level=warn",
            ],
        )
        self._spawn(
            "prometheus",
            [
                prometheus,
                f"--config.file={prometheus_yml}",
                f"--storage.tsdb.path={self.workdir / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.prometheus_port}",
                "--log.level=warn",
            ],
        )
        self._wait_ready(self._processes[0], self.alertmanager_url)
        self._wait_ready(self._processes[1], self.prometheus_url)
        return self

    def stop(self) -> None:
        """Terminate the servers (kill after 10 s) and stop the webhook."""
        for process in reversed(self._processes):
            if process.popen.poll() is None:
                process.popen.terminate()
        for process in reversed(self._processes):
            try:
                process.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
        self._processes.clear()
        self.webhook.stop()

    def __enter__(self) -> OpsStack:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query against Prometheus; the result vector."""
        status, body = _get(self.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
        if status != 200:
            return []
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result

    def wait_for_targets_up(self, timeout: float = 30.0) -> None:
        """Return once every target has been scraped successfully (the first scrape takes ~5 s)."""

        def all_up() -> bool:
            status, body = _get(self.prometheus_url + "/api/v1/targets?state=active")
            if status != 200:
                return False
            active = json.loads(body)["data"]["activeTargets"]
            # the shipped config also scrapes Prometheus and Alertmanager themselves
            expected = len(self.targets) + (2 if self.shipped else 0)
            return len(active) == expected and all(t["health"] == "up" for t in active)

        wait_until(all_up, timeout, "every scrape target to be up", interval=0.1)

    def wait_for_alertmanager_discovered(self, timeout: float = 30.0) -> None:
        """Return once Prometheus knows the Alertmanager (discovered on the same ~5 s tick)."""

        def known() -> bool:
            status, body = _get(self.prometheus_url + "/api/v1/alertmanagers")
            return status == 200 and bool(json.loads(body)["data"]["activeAlertmanagers"])

        wait_until(known, timeout, "Prometheus to discover Alertmanager", interval=0.1)
