"""`scheduler_extender.lockwait.LockQueues` on its own: the order of a node's queue, what a release
costs, the holder's expiry, a waiter told early. The loop's clock is a fake where time matters
(`clock`), so nothing here depends on how fast the machine is."""

from __future__ import annotations

import asyncio

import pytest

from scheduler_extender.lockwait import LockQueues

FAR = 10_000.0  # a deadline no test reaches


@pytest.fixture
def clock():
    """The running loop's time, frozen at 0 and moved by hand (timers fire only when it is moved)."""
    now = [0.0]

    def install() -> list[float]:
        running = asyncio.get_running_loop()
        running.time = lambda: now[0]  # type: ignore[method-assign]
        return now

    return install


async def take(queues: LockQueues, node: str, uid: str, deadline: float = FAR) -> None:
    """One bind that joins, gets its turn and takes the lock."""
    w = queues.join(node, uid)
    assert await queues.turn(w, deadline) is None
    queues.leave(w, got_lock=True)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_a_pod_that_gave_up_waiting_keeps_its_place_for_its_next_bind(clock) -> None:
    clock()
    q = LockQueues()
    await take(q, "n1", "holder")
    b = q.join("n1", "b")
    assert await q.turn(b, FAR) is None  # its first try finds the lock held
    q.retry_later(b)
    c = q.join("n1", "c")
    loop = asyncio.get_running_loop()
    # b's wait is over (its deadline passed): it fails now and keeps its ticket.
    assert await q.turn(b, loop.time()) == "timeout"
    q.leave(b, keep_place=True)
    d = q.join("n1", "d")
    order: list[str] = []

    async def bind(w):  # type: ignore[no-untyped-def]
        assert await q.turn(w, FAR) is None
        order.append(w.uid)
        q.leave(w, got_lock=True)

    tasks = [asyncio.create_task(bind(w)) for w in (c, d)]
    await settle()
    b2 = q.join("n1", "b")  # kube-scheduler retries b after its backoff: it goes before c and d
    tasks.append(asyncio.create_task(bind(b2)))
    await settle()
    for _ in range(3):
        q._notified("n1")  # the holder's lock is released (what `notify` hands to the loop)
        await settle()
    await asyncio.gather(*tasks)
    assert order == ["b", "c", "d"]
    assert q.waiting() == 0


async def test_a_release_wakes_only_the_head(clock) -> None:
    clock()
    q = LockQueues()
    await take(q, "n1", "holder")
    waiters = [q.join("n1", f"p{i}") for i in range(500)]
    assert await q.turn(waiters[0], FAR) is None  # the first try finds the lock held
    q.retry_later(waiters[0])
    tasks = [asyncio.create_task(q.turn(w, FAR)) for w in waiters]
    await settle()
    assert not any(w.event.is_set() for w in waiters)
    q._notified("n1")
    # One event set for 500 waiters: the cost of a release does not grow with the queue.
    assert [w.uid for w in waiters if w.event.is_set()] == ["p0"]
    await settle()
    assert tasks[0].done() and tasks[0].result() is None and not any(t.done() for t in tasks[1:])
    q._gone("p7")  # a deleted pod's waiter is found without walking the queues
    await settle()
    assert tasks[7].result() == "gone"
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_waiter_tries_again_when_the_holders_lock_expires(clock) -> None:
    now = clock()
    q = LockQueues()
    await take(q, "n1", "holder")
    w = q.join("n1", "w")
    assert await q.turn(w, FAR) is None  # its first try: held by a live pod, expiring in 30 s
    q.retry_later(w, expires_in_s=30.0)
    turn = asyncio.create_task(q.turn(w, FAR))
    now[0] = 29.0
    await settle()  # the loop runs its due timers: none yet
    assert not turn.done()
    now[0] = 30.1
    await settle()
    assert turn.done() and turn.result() is None  # no release came: the expiry woke it


async def test_a_waiter_that_cannot_be_served_in_time_is_told_at_once(clock) -> None:
    now = clock()
    q = LockQueues()
    await take(q, "n1", "p0")
    waiters = [q.join("n1", f"p{i}") for i in range(1, 12)]
    # Two handoffs 5 s apart: the node's pace is 5 s per bind.
    assert await q.turn(waiters[0], FAR) is None  # the first try finds the lock held
    q.retry_later(waiters[0])
    for i, t in enumerate((5.0, 10.0)):
        turn = asyncio.create_task(q.turn(waiters[i], FAR))
        await settle()
        now[0] = t
        q._notified("n1")  # the holder's release
        assert await turn is None
        q.leave(waiters[i], got_lock=True)
    assert q.pace_s("n1") == pytest.approx(5.0)
    # The holder p2 took the lock just now: p3 is next, after 5 s; each bind ahead adds 5 s.
    deadline = now[0] + 27.0
    assert await q.turn(waiters[10], deadline) == "hopeless"
    assert (waiters[10].ahead, waiters[10].expected_s) == (8, pytest.approx(45.0))
    ok = asyncio.create_task(q.turn(waiters[5], deadline))  # p6: 3 ahead, 20 s: it waits
    await settle()
    assert not ok.done()
    ok.cancel()
    await asyncio.gather(ok, return_exceptions=True)


async def test_a_pod_that_gives_up_twice_comes_back_at_its_place_again(clock) -> None:
    clock()
    q = LockQueues()
    await take(q, "n1", "holder")
    a = q.join("n1", "a")
    assert await q.turn(a, FAR) is None
    q.retry_later(a)
    b = q.join("n1", "b")
    loop = asyncio.get_running_loop()
    for _ in range(3):  # a left entry of the same ticket may still be in the queue when it comes back
        assert await q.turn(a, loop.time()) == "timeout"
        q.leave(a, keep_place=True)
        a = q.join("n1", "a")
        assert q.waiting("n1") == 2
    q._notified("n1")
    assert await q.turn(a, FAR) is None  # a, not b: it kept the older ticket
    q.leave(a, got_lock=True)
    b_turn = asyncio.create_task(q.turn(b, FAR))
    await settle()
    q._notified("n1")
    assert await b_turn is None
