"""Admission of ingest requests: a bounded number in flight, a bounded queue of waiting ones.

A request in flight holds a worker thread while it is decoded and waits for its group commit.
When all slots are taken, answering 429 at once made a process that was briefly behind answer
more 429s than batches (4,096 ranks: ~340 refusals a second against 230 batches), each one
costing a request's parsing and an answer on both ends, and delaying the batch by Retry-After.
So a request first waits here, on the event loop and without a thread, its body still unread in
the socket, until a slot frees up; only when `max_queued` already wait, or the wait passes
`timeout_s`, is it refused. Waiters are served in arrival order.

Thread-safe: `release` may be called from any thread; `acquire` is awaited on an event loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass


class Refused(Exception):
    """No slot: the queue is full or the wait timed out."""


@dataclass(eq=False, slots=True)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]
    #: Set (under the lock) when a released slot was handed to this waiter.
    granted: bool = False


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Admission:
    """`slots` requests in flight at once; up to `max_queued` more wait up to `timeout_s`."""

    def __init__(self, slots: int, *, max_queued: int, timeout_s: float) -> None:
        self._lock = threading.Lock()
        self._free = slots
        self._max_queued = max_queued
        self._timeout_s = timeout_s
        self._waiters: deque[_Waiter] = deque()

    @property
    def queued(self) -> int:
        """Requests waiting for a slot now."""
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting for one in arrival order; raises `Refused`."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            if len(self._waiters) >= self._max_queued:
                raise Refused("queue full")
            w = _Waiter(loop, loop.create_future())
            self._waiters.append(w)
        try:
            await asyncio.wait_for(w.future, self._timeout_s)
        except BaseException as exc:  # a timeout, or the request cancelled
            with self._lock:
                granted = w.granted
                if not granted:
                    self._waiters.remove(w)
            if isinstance(exc, TimeoutError):
                if granted:
                    return  # the slot came with the timeout: keep it
                raise Refused("timed out waiting for a slot") from None
            if granted:
                self.release()
            raise

    def release(self) -> None:
        """Give a slot back: to the longest waiting request, or to the pool."""
        with self._lock:
            if not self._waiters:
                self._free += 1
                return
            w = self._waiters.popleft()
            w.granted = True
        w.loop.call_soon_threadsafe(_wake, w.future)
