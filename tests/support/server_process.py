"""A real `flightdeck server` process for the tests and benchmarks that need one: on a free port
of 127.0.0.1 (or another local address), started (again, on the same port and settings) and
stopped, paused and resumed by signals. The tests and the benchmarks build their servers on it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Self

from flightdeck.launch.demo.ranks import free_port
from tests.support.cli import FLIGHTDECK
from tests.support.waiting import wait_until


class ServerProcess:
    """`flightdeck server [args]` with the settings in `env` (its address and port added), its
    output appended to `log` (a path, opened at each start, or a file the caller holds open; None:
    this process's own output). `host` is the address it binds to and is reached at (a bridge's,
    for servers that namespaced hosts reach)."""

    def __init__(
        self, env: Mapping[str, str], log: Path | IO[bytes] | None, *args: str, host: str = "127.0.0.1"
    ) -> None:
        self.host = host
        self.port = free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.env = {**env, "FLIGHTDECK_SERVER_HOST": host, "FLIGHTDECK_SERVER_PORT": str(self.port)}
        self.log = log
        self.args = args
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float = 60.0) -> None:
        """Start (or restart) the process and wait until /healthz answers; an AssertionError, the
        process killed, when it exits or does not answer within `timeout_s`."""
        with open(self.log, "ab") if isinstance(self.log, Path) else contextlib.nullcontext(self.log) as out:
            self.proc = subprocess.Popen(
                [*FLIGHTDECK, "server", *self.args],
                env=self.env,
                stdout=out,
                stderr=None if out is None else subprocess.STDOUT,
            )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                said = self.log.read_text()[-2000:] if isinstance(self.log, Path) else ""
                raise AssertionError(f"server exited with {proc.returncode}: {said}")
            return self.healthy()

        try:
            wait_until(up, timeout_s, "the server to answer /healthz")
        except AssertionError:
            self.kill()
            raise

    @property
    def pid(self) -> int:
        """The process id of the running (last started) process."""
        assert self.proc is not None, "the server was not started"
        return self.proc.pid

    def healthy(self) -> bool:
        """Whether /healthz answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def pause(self) -> None:
        """SIGSTOP: connections are accepted by the kernel, nothing is answered."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after `pause`."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the process (a server that dies)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """Terminate the process (SIGCONT first, in case it is paused; SIGKILL after 30 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 20.0) -> None:
    """Terminate each process still running, then wait for each (killed if it outlives `timeout_s`)."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
