"""A recording ingest endpoint for the collector tests (a real HTTP server on 127.0.0.1).

`Recorder` answers `POST /api/v1/ingest` like the server will: gunzips and parses the body,
remembers batches by `batch_id` and answers `{"duplicate": true}` for one it already has. A test can
script the next answers (503 with Retry-After, 429, 4xx), make it process a batch and then drop the
connection without answering (a lost response), slow it down, and stop and restart it on the same
port (a server that is down for a while).
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from flightdeck.wire import decode_batch
from tests.support.waiting import wait_until


@dataclass(slots=True)
class Scripted:
    """One scripted answer: HTTP status and headers, or `drop` (record, then close without answering)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    drop: bool = False


class Recorder:
    """The recording endpoint; `url` is its base URL. Thread-safe; use as a context manager."""

    def __init__(self, port: int = 0) -> None:
        self._lock = threading.Lock()
        #: Every batch document accepted (first copy of each batch_id), in arrival order.
        self.batches: dict[str, dict[str, Any]] = {}
        #: Every request as (batch_id or None, status answered or -1 for dropped, headers).
        self.requests: list[tuple[str | None, int, dict[str, str]]] = []
        self.script: list[Scripted] = []
        self.delay_s = 0.0
        self.on_request: Callable[[], None] | None = None
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.port = port
        self.start()

    @property
    def url(self) -> str:
        """Base URL (the collector's server_url)."""
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen (again) on the same port."""
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                recorder._handle(self)

        ThreadingHTTPServer.allow_reuse_address = True
        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="recorder", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening (connections are refused until `start`)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            assert self._thread is not None
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        raw = h.rfile.read(length)
        headers = {k.lower(): v for k, v in h.headers.items()}
        if self.on_request is not None:
            self.on_request()
        if self.delay_s:
            time.sleep(self.delay_s)
        with self._lock:
            scripted = self.script.pop(0) if self.script else Scripted()
        doc: dict[str, Any] | None = None
        try:
            body = gzip.decompress(raw) if headers.get("content-encoding") == "gzip" else raw
            doc = json.loads(body)
        except (OSError, ValueError):
            scripted = Scripted(400, body={"detail": "body is not gzip'd JSON"})
        batch_id = doc.get("batch_id") if isinstance(doc, dict) else None
        answer: dict[str, Any] = scripted.body or {}
        if scripted.status == 200 and doc is not None:
            with self._lock:
                if batch_id in self.batches:
                    answer = {"duplicate": True}
                else:
                    self.batches[str(batch_id)] = doc
                    answer = {"accepted": True}
        with self._lock:
            self.requests.append((batch_id, -1 if scripted.drop else scripted.status, headers))
        if scripted.drop:
            # Processed, but the answer is lost: the client sees the connection die.
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        data = json.dumps(answer).encode()
        try:
            h.send_response(scripted.status)
            for k, v in scripted.headers.items():
                h.send_header(k, v)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        except OSError:  # the client went away (killed mid-request): the batch is recorded anyway
            h.close_connection = True

    # --- views for assertions -------------------------------------------------------------------

    def docs(self) -> list[dict[str, Any]]:
        """Accepted batch documents (each batch_id once), in arrival order."""
        with self._lock:
            return list(self.batches.values())

    def entry_rows(self) -> list[tuple[str, int, int, int, str, bool, bool]]:
        """(job, attempt, rank, record_id, state, retired, has_frames) of every accepted entry."""
        return [
            (s.job, s.attempt, s.rank, e.record_id, e.state, e.retired, bool(e.frames))
            for d in self.docs()
            for s in decode_batch(d).snapshots
            for e in s.entries
        ]

    def nixl(self) -> list[dict[str, Any]]:
        """Accepted NIXL wire samples."""
        return [n for d in self.docs() for n in d["nixl"]]


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    """Poll until `cond()` holds; fail the test after `timeout_s`."""
    wait_until(cond, timeout_s, what, poll_s=0.02)
