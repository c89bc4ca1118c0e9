"""The reader processes of `flightdeck analyze`: `read_all` runs one function over many items in
forked processes, the calling process among them.

With as many processes as cores and the calling one idle (a process pool), the caller still had
to receive and keep every result while the pool's processes used all the cores; here it reads a
share of the items itself, and its own results are never pickled. The items are handed out from
a shared counter, a few at a time, so whoever is free takes the next ones and no process waits
long at the end. A worker sends its results in chunks over a pipe; the caller looks for them
after each item it reads itself, so a worker waits at most about one item for its chunk to be
taken.
"""

from __future__ import annotations

import mmap
import os
import pickle
import select
import signal
import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

#: Items a worker reads before sending their results: a chunk's message is ~0.5 MB of
#: 2,000-entry summaries, so the buffers it goes through stay small and are reused (a larger
#: chunk's were fresh memory, a page fault per 4 KB on both sides), and the last chunk is short.
CHUNK = 8
_HEADER = struct.Struct("<Q")
_INDEX = struct.Struct("q")


class _Counter:
    """The next item to hand out, shared by forked processes: one int64 in shared memory, its
    lock a token byte in a pipe (whoever reads the byte holds the lock and writes it back).
    Neither needs `multiprocessing` (its imports and process start-up were ~50 ms of the
    command's serial time)."""

    def __init__(self, total: int) -> None:
        self._next = mmap.mmap(-1, _INDEX.size)  # anonymous, MAP_SHARED: one value after fork
        self._lock_r, self._lock_w = os.pipe()
        os.write(self._lock_w, b"\0")
        self._total = total

    def take(self, most: int) -> tuple[int, int]:
        """The next items to read, at most `most`, as (start, stop); start == stop once all
        are handed out."""
        os.read(self._lock_r, 1)  # blocks while another process holds the token
        try:
            (start,) = _INDEX.unpack_from(self._next)
            stop = min(start + most, self._total)
            _INDEX.pack_into(self._next, 0, stop)
        finally:
            os.write(self._lock_w, b"\0")
        return start, stop

    def close(self) -> None:
        """Release the pipe and the shared memory (in the process that calls it)."""
        os.close(self._lock_r)
        os.close(self._lock_w)
        self._next.close()


def _send(fd: int, msg: object) -> None:
    data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view) :]


def _serve(
    fd: int, counter: _Counter, items: Sequence[T], work: Callable[[T], R]
) -> None:  # pragma: no cover - runs in the forked worker (coverage does not follow os.fork)
    """A worker's loop: take items, send (start, True, results) per chunk; on an exception
    (start, False, the exception). The pipe's end (EOF) says it is done."""
    start = -1
    try:
        while True:
            start, stop = counter.take(CHUNK)
            if start == stop:
                break
            _send(fd, (start, True, [work(items[i]) for i in range(start, stop)]))
    except BaseException as exc:  # handed to the caller, which raises it
        try:
            _send(fd, (start, False, exc))
        except Exception:  # an exception that does not pickle: its text then
            _send(fd, (start, False, RuntimeError(f"{type(exc).__name__}: {exc}")))
    finally:
        os.close(fd)


class _Inbox:
    """One worker's pipe, read into a buffer that is reused from message to message."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray(1 << 20)

    def fileno(self) -> int:
        return self.fd

    def _read(self, n: int) -> memoryview | None:
        """The next `n` bytes (a view of the buffer, valid until the next read), None at EOF."""
        if len(self._buf) < n:
            self._buf = bytearray(max(n, 2 * len(self._buf)))
        view = memoryview(self._buf)[:n]
        got = 0
        while got < n:
            k = os.readv(self.fd, [view[got:]])
            if k == 0:
                return None
            got += k
        return view

    def receive(self) -> Any:
        """The next message, or None when the worker is done (or died)."""
        head = self._read(_HEADER.size)
        if head is None:
            return None
        (n,) = _HEADER.unpack(head)
        body = self._read(n)
        # Our own forked worker wrote it (results of `work`), not the untrusted input.
        return None if body is None else pickle.loads(body)  # noqa: S301


def read_all(
    items: Sequence[T],
    work: Callable[[T], R],
    *,
    processes: int,
    on_result: Callable[[int, R], None],
) -> None:
    """Call `work` on every item, in `processes` processes (this one and `processes - 1` forked
    workers), and `on_result(index, result)` here for each, in the order results come.

    An exception `work` raises in a worker is raised here; the items of a worker that dies
    without a word (killed) are read here.
    """
    n = len(items)
    if processes <= 1 or n == 0:
        for i, item in enumerate(items):
            on_result(i, work(item))
        return
    # fork: workers inherit the imported modules and the items, so start-up costs milliseconds.
    counter = _Counter(n)
    done = bytearray(n)
    live: list[_Inbox] = []
    pids: dict[_Inbox, int] = {}
    try:
        for _ in range(processes - 1):
            recv, send = os.pipe()
            pid = _fork_worker(send, counter, items, work)
            os.close(send)
            inbox = _Inbox(recv)
            live.append(inbox)
            pids[inbox] = pid

        def receive(timeout: float | None) -> None:
            ready, _, _ = select.select(live, [], [], timeout)
            for inbox in ready:
                msg = inbox.receive()
                if msg is None:  # done, or died: what it took and did not send is read below
                    live.remove(inbox)
                    os.close(inbox.fd)
                    continue
                start, ok, payload = msg
                if not ok:
                    raise payload
                for i, res in enumerate(payload, start):
                    done[i] = 1
                    on_result(i, res)

        while True:
            start, stop = counter.take(1)
            if start == stop:
                break
            done[start] = 1
            on_result(start, work(items[start]))
            if live:
                receive(0)
        while live:
            receive(None)
        for i in range(n):
            if not done[i]:
                on_result(i, work(items[i]))
    finally:
        for inbox in live:  # still running (an exception here): stopped
            os.close(inbox.fd)
            os.kill(pids[inbox], signal.SIGKILL)
        for pid in pids.values():
            os.waitpid(pid, 0)
        counter.close()


def _fork_worker(fd: int, counter: _Counter, items: Sequence[T], work: Callable[[T], R]) -> int:
    """Fork a worker that runs `_serve` and exits; returns its pid (in this process)."""
    pid = os.fork()
    if pid:
        return pid
    code = 1  # pragma: no cover - the forked worker (coverage does not follow os.fork)
    try:  # pragma: no cover
        _serve(fd, counter, items, work)
        code = 0
    finally:  # pragma: no cover - never back into the caller's stack, its buffers not flushed
        os._exit(code)


def default_processes() -> int:
    """One reader process per core, at most 8."""
    return min(os.cpu_count() or 1, 8)
