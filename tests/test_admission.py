"""Admission of ingest requests (server/admission.py): slots, a FIFO queue, its bound and timeout."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

from flightdeck.server.admission import Admission, Refused


async def one_waiting(adm: Admission) -> asyncio.Task[None]:
    """Take the only slot of `adm` and start a request that waits for it in the queue."""
    await adm.acquire()
    waiting = asyncio.create_task(adm.acquire())
    while adm.queued < 1:
        await asyncio.sleep(0)
    return waiting


async def took_free_slot(adm: Admission) -> bool:
    """Whether a new request finds a slot without waiting (it then holds it); one that would wait
    is cancelled, which takes it out of the queue."""
    request = asyncio.ensure_future(adm.acquire())
    await asyncio.sleep(0)  # the request's first step: it takes a free slot or joins the queue
    if request.done():
        request.result()
        return True
    request.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await request
    return False


def test_waiters_get_released_slots_in_arrival_order() -> None:
    async def main() -> list[int]:
        adm = Admission(1, max_queued=10, timeout_s=5)
        await adm.acquire()
        order: list[int] = []

        async def request(i: int) -> None:
            await adm.acquire()
            order.append(i)
            await asyncio.sleep(0)
            adm.release()

        tasks = [asyncio.create_task(request(i)) for i in range(4)]
        while adm.queued < 4:
            await asyncio.sleep(0)
        assert not await took_free_slot(adm)  # waiters come first
        adm.release()
        await asyncio.gather(*tasks)
        assert adm.queued == 0 and await took_free_slot(adm)  # the slot is back in the pool
        return order

    assert asyncio.run(main()) == [0, 1, 2, 3]


def test_a_full_queue_and_a_long_wait_are_refused() -> None:
    async def main() -> None:
        adm = Admission(1, max_queued=1, timeout_s=0.05)
        waiting = await one_waiting(adm)
        with pytest.raises(Refused, match="queue full"):
            await adm.acquire()
        with pytest.raises(Refused, match="timed out"):
            await waiting
        assert adm.queued == 0
        adm.release()
        assert await took_free_slot(adm)

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_loses_no_slot() -> None:
    async def main() -> None:
        adm = Admission(1, max_queued=5, timeout_s=5)
        waiting = await one_waiting(adm)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert adm.queued == 0
        adm.release()
        assert await took_free_slot(adm)

    asyncio.run(main())


def test_release_from_another_thread_wakes_the_waiter() -> None:
    async def main() -> None:
        adm = Admission(1, max_queued=5, timeout_s=5)
        waiting = await one_waiting(adm)
        t = threading.Thread(target=adm.release)  # a worker thread finishing its request
        t.start()
        await asyncio.wait_for(waiting, 5)
        t.join()
        assert not await took_free_slot(adm) and adm.queued == 0  # the waiter holds the slot

    asyncio.run(main())
