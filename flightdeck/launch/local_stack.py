"""A server and its collectors on this machine, as child processes (`flightdeck up`, `flightdeck demo`).

Children run `python -m flightdeck server|collector` in their own session, so a Ctrl-C at the
terminal reaches only the parent, which then stops them in order (collectors first, so that their
last flush still finds the server). On Linux each child also gets SIGTERM when the parent dies,
even by SIGKILL, so nothing is left behind.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

#: Name of the token `flightdeck up` provisions for its collector (a suffix is added when taken).
LOCAL_COLLECTOR = "local"
_PR_SET_PDEATHSIG = 1


class StackError(RuntimeError):
    """A child could not be started or did not become ready; the message says which and why."""


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on (or holds) `host:port` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As uvicorn binds: a port left in TIME_WAIT by a stopped server is free, a listener is not.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def sqlite_url(data_dir: Path) -> str:
    """The SQLAlchemy URL of the SQLite database under `data_dir` (as `flightdeck server` names it)."""
    return f"sqlite:///{(data_dir / 'flightdeck.db').resolve()}"


def provision_token(database_url: str, token_file: Path, name: str = LOCAL_COLLECTOR) -> str:
    """The collector token kept in `token_file`, created (hashed in the store) when missing or revoked.

    The plaintext exists only in `token_file` (mode 0600); the database keeps its SHA-256 as for
    `flightdeck token create`. When the name is taken by a token whose plaintext is lost, the new
    one gets a numbered name; the old one is left alone (revoke it with `flightdeck token revoke`).
    """
    from sqlalchemy.exc import IntegrityError

    from flightdeck.server import store
    from flightdeck.server.db import connect, migrate
    from flightdeck.server.ingest import hash_token, new_token

    db = connect(database_url)
    try:
        migrate(db)
        with db.write() as session, session.begin():
            try:
                kept = token_file.read_text().strip()
            except FileNotFoundError:
                kept = ""
            if kept and store.active_token(session=session, token_hash=hash_token(kept)) is not None:
                return kept
            taken = {t.name for t in store.list_tokens(session=session)}
            candidates = [name, *(f"{name}-{n}" for n in range(2, len(taken) + 3))]
            chosen = next(c for c in candidates if c not in taken)
            token = new_token()
            try:
                store.create_token(
                    session=session, name=chosen, token_hash=hash_token(token), now_ns=time.time_ns()
                )
            except IntegrityError:  # another process took the name meanwhile
                raise StackError(f"collector token name {chosen!r} was taken concurrently; retry") from None
        token_file.parent.mkdir(parents=True, exist_ok=True)
        # Write with 0600 from the start: the token must never be readable by others, even briefly.
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        return token
    finally:
        db.dispose()


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the parent exits (Linux; a no-op elsewhere)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


@dataclass
class Child:
    """One child process of the stack."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path | None = None

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of the child's log file (empty when it logs to the terminal)."""
        if self.log_path is None:
            return ""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class LocalStack:
    """A `flightdeck server` and any number of `flightdeck collector` processes on 127.0.0.1."""

    def __init__(self, *, log_dir: Path | None = None) -> None:
        """`log_dir`: where each child's output goes (`<name>.log`); None: the parent's terminal."""
        self.log_dir = log_dir
        self.children: list[Child] = []
        self.server_url: str | None = None

    def _spawn(self, name: str, args: Sequence[str], env: Mapping[str, str]) -> Child:
        log: IO[bytes] | None = None
        log_path = None
        if self.log_dir is not None:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            log_path = self.log_dir / f"{name}.log"
            log = open(log_path, "ab")  # noqa: SIM115 - the child holds it; closed below
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "flightdeck", *args],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        finally:
            if log is not None:
                log.close()
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def start_server(
        self,
        *,
        data_dir: Path,
        port: int,
        stall_after_s: float | None = None,
        log_level: str = "warning",
        ready_timeout_s: float = 60.0,
    ) -> str:
        """Start `flightdeck server` on 127.0.0.1:`port` with SQLite under `data_dir`; wait for /healthz.

        Returns the base URL. Raises StackError when the port is taken or the server dies or does
        not answer within `ready_timeout_s`.
        """
        if port_in_use("127.0.0.1", port):
            raise StackError(
                f"port {port} on 127.0.0.1 is in use (another `flightdeck up`?); choose another with --port"
            )
        data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "FLIGHTDECK_SERVER_DATA_DIR": str(data_dir)}
        if stall_after_s is not None:
            env["FLIGHTDECK_SERVER_STALL_AFTER_S"] = str(stall_after_s)
        # Its own embedded database: always brought up to this version.
        args = ["server", "--host", "127.0.0.1", "--port", str(port), "--database-url", sqlite_url(data_dir)]
        args.append("--migrate")
        child = self._spawn("server", [*args, "--log-level", log_level], env)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + ready_timeout_s
        while not _healthy(url):
            if child.proc.poll() is not None:
                raise StackError(f"the server exited with code {child.proc.returncode}\n{child.log_tail()}")
            if time.monotonic() > deadline:
                raise StackError(f"the server did not answer {url}/healthz within {ready_timeout_s:.0f} s")
            time.sleep(0.2)
        self.server_url = url
        return url

    def start_collector(
        self,
        *,
        name: str,
        server_url: str,
        spool_dirs: Sequence[Path],
        state_dir: Path,
        token_file: Path | None = None,
        torch_dumps: bool = True,
        host_name: str | None = None,
        push_interval_s: float | None = None,
        log_level: str = "info",
    ) -> Child:
        """Start `flightdeck collector` pushing to `server_url`, watching `spool_dirs`.

        `torch_dumps`: also watch PyTorch's own dump paths (the collector's default); `host_name`:
        the host it reports (default: this machine's name).
        """
        # The token comes from token_file; a token in the caller's environment would clash with it.
        unset = {"FLIGHTDECK_COLLECTOR_TOKEN", "FLIGHTDECK_TOKEN"}
        # The old shared FLIGHTDECK_HOST (read for one release) was also the server's bind address:
        # a shell that set it for a server must not rename this collector's host.
        unset.add("FLIGHTDECK_HOST")
        env = {k: v for k, v in os.environ.items() if k not in unset}
        env.update(
            FLIGHTDECK_COLLECTOR_SERVER_URL=server_url,
            FLIGHTDECK_COLLECTOR_SPOOL_DIRS=json.dumps([str(p) for p in spool_dirs]),
            FLIGHTDECK_COLLECTOR_STATE_DIR=str(state_dir),
            # Port 0: several collectors (and a system-wide one) must not fight over 9478.
            FLIGHTDECK_COLLECTOR_METRICS_LISTEN="127.0.0.1:0",
        )
        if token_file is not None:
            env["FLIGHTDECK_COLLECTOR_TOKEN_FILE"] = str(token_file)
        if not torch_dumps:
            env["FLIGHTDECK_COLLECTOR_TORCH_DUMP_PREFIXES"] = "[]"
        if host_name is not None:
            env["FLIGHTDECK_COLLECTOR_HOST"] = host_name
        if push_interval_s is not None:
            env["FLIGHTDECK_COLLECTOR_PUSH_INTERVAL_S"] = str(push_interval_s)
        return self._spawn(name, ["collector", "--log-level", log_level], env)

    def exited(self) -> Child | None:
        """The first child that is no longer running, if any."""
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM the collectors, then the server (SIGCONT first: one may be stopped); SIGKILL laggards."""
        collectors = [c for c in self.children if c.name != "server"]
        servers = [c for c in self.children if c.name == "server"]
        for batch in (collectors, servers):
            for c in batch:
                if c.proc.poll() is None:
                    for sig in (signal.SIGCONT, signal.SIGTERM):
                        try:
                            c.proc.send_signal(sig)
                        except ProcessLookupError:
                            break
            deadline = time.monotonic() + timeout_s
            for c in batch:
                try:
                    c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    c.proc.kill()
                    c.proc.wait(timeout=5)


def _healthy(url: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{url}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
