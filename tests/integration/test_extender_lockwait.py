"""Lock pipelining: a bind that finds the node lock held waits for it in the node's FIFO and takes it the
moment the device plugin releases it (woken by the node watch), in arrival order; a waiter whose pod is
deleted leaves the queue; a dead owner is taken over at once; after ``--bind-lock-wait`` it fails.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

import pytest

from hami import annotations as A
from kubefakes.apiserver import FakeApiServer
from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import (
    Scheduler,
    create_pod,
    dp_allocated,
    eventually,
    start_extender,
    wait_ready,
)


@pytest.fixture
async def extender(fake_apiserver: FakeApiServer):
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 4, count=10)))
    server = await start_extender(fake_apiserver, "--bind-lock-wait", "20s")
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def patient(fake_apiserver: FakeApiServer):
    """The extender with a 120 s --bind-lock-wait: a test that waits for a wake-up other than a release
    fails by its own bound (seconds), never because a slow machine ran out the bind's wait."""
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 4, count=10)))
    server = await start_extender(fake_apiserver, "--bind-lock-wait", "120s")
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


def lock_owner(api: FakeApiServer, node: str = "node1") -> str | None:
    value = (api.store.get("nodes", node)["metadata"].get("annotations") or {}).get(A.NODE_LOCK)
    return None if value is None else value.rsplit(",", 1)[-1]


async def filtered(api: FakeApiServer, sched: Scheduler, name: str) -> dict:
    pod = create_pod(api, gpu_pod(name, mem=1000, cores=10))
    result = await sched.filter(pod, ["node1"])
    assert result["Error"] == "" and Scheduler.chosen(result) == ["node1"], result
    return pod


async def test_waiting_binds_take_the_lock_in_arrival_order_when_it_is_released(
    fake_apiserver, extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pods = [await filtered(api, sched, f"p{i}") for i in range(4)]
    assert await sched.bind(pods[0], "node1") == {"Error": ""}
    done: list[str] = []

    async def bind(pod: dict) -> dict:
        result = await sched.bind(pod, "node1")
        done.append(pod["metadata"]["name"])
        return result

    tasks = []
    for i, pod in enumerate(pods[1:], start=1):
        tasks.append(asyncio.create_task(bind(pod)))
        await eventually(lambda i=i: extender.lock_queues.waiting("node1") == i, what=f"{i} waiting binds")
    for holder in range(3):
        # Nothing moves while the holder is being allocated ...
        await asyncio.sleep(0.1)
        assert lock_owner(api) == f"p{holder}" and len(done) == holder
        # ... and the next in line is bound as soon as the device plugin releases the lock.
        dp_allocated(api, pods[holder], "node1")
        await eventually(lambda holder=holder: len(done) == holder + 1, what=f"bind of p{holder + 1}")
        assert lock_owner(api) == f"p{holder + 1}"
    assert [t.result() for t in tasks] == [{"Error": ""}] * 3
    assert done == ["p1", "p2", "p3"]
    assert extender.lock_queues.waiting() == 0 and extender.lock_queues.handoffs == 3
    for pod in pods:
        assert api.store.get("pods", pod["metadata"]["name"], namespace="default")["spec"]["nodeName"] == "node1"


async def test_a_waiter_whose_pod_is_deleted_leaves_the_queue(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    first, second, third = [await filtered(api, sched, n) for n in ("first", "second", "third")]
    assert await sched.bind(first, "node1") == {"Error": ""}
    waiting_second = asyncio.create_task(sched.bind(second, "node1"))
    await eventually(lambda: extender.lock_queues.waiting("node1") == 1, what="second waiting")
    waiting_third = asyncio.create_task(sched.bind(third, "node1"))
    await eventually(lambda: extender.lock_queues.waiting("node1") == 2, what="third waiting")
    api.store.delete("pods", "second", namespace="default")
    result = await asyncio.wait_for(waiting_second, 5)
    assert result == {
        "Error": "binding pod default/second to node1 failed: the pod was deleted while waiting for the node lock"
    }
    assert extender.lock_queues.waiting("node1") == 1 and not waiting_third.done()
    dp_allocated(api, first, "node1")
    assert await asyncio.wait_for(waiting_third, 5) == {"Error": ""}
    assert lock_owner(api) == "third"


async def test_a_dead_owner_is_taken_over_as_soon_as_the_watch_sees_it_go(
    fake_apiserver, extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    first, second = await filtered(api, sched, "first"), await filtered(api, sched, "second")
    assert await sched.bind(first, "node1") == {"Error": ""}
    waiting = asyncio.create_task(sched.bind(second, "node1"))
    await eventually(lambda: extender.lock_queues.waiting("node1") == 1, what="second waiting")
    # The owner is deleted before its Allocate: nobody releases the lock, the waiter takes it over.
    api.store.delete("pods", "first", namespace="default")
    assert await asyncio.wait_for(waiting, 5) == {"Error": ""}
    assert lock_owner(api) == "second"


async def test_a_bind_arriving_while_others_wait_queues_behind_them(fake_apiserver, extender, session) -> None:
    # The lock is free at the moment the newcomer arrives only from the waiters' point of view: it
    # must not jump the queue. Checked by releasing once: exactly the first waiter gets it.
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    a, b, c = [await filtered(api, sched, n) for n in ("a", "b", "c")]
    assert await sched.bind(a, "node1") == {"Error": ""}
    tb = asyncio.create_task(sched.bind(b, "node1"))
    await eventually(lambda: extender.lock_queues.waiting("node1") == 1, what="b waiting")
    tc = asyncio.create_task(sched.bind(c, "node1"))
    await eventually(lambda: extender.lock_queues.waiting("node1") == 2, what="c waiting")
    dp_allocated(api, a, "node1")
    assert await asyncio.wait_for(tb, 5) == {"Error": ""}
    await asyncio.sleep(0.1)
    assert not tc.done() and lock_owner(api) == "b"
    dp_allocated(api, b, "node1")
    assert await asyncio.wait_for(tc, 5) == {"Error": ""}


def backdate_lock(api: FakeApiServer, node: str, age_s: float) -> None:
    """Rewrite `node`'s lock as taken `age_s` seconds ago (same owner): its expiry comes that much sooner."""
    value = api.store.get("nodes", node)["metadata"]["annotations"][A.NODE_LOCK]
    _, ns, name = value.split(",")
    when = datetime.now().astimezone() - timedelta(seconds=age_s)
    lock = A.encode_node_lock(A.NodeLock(time=when, namespace=ns, name=name))
    api.store.patch("nodes", node, {"metadata": {"annotations": {A.NODE_LOCK: lock}}})


async def test_a_waiter_takes_the_lock_when_the_holders_lock_expires(fake_apiserver, patient, session) -> None:
    # The holder stays between Bind and Allocate (no device plugin here): only its lock's age frees
    # the node. Its lock was taken 298 s ago, so it expires (after --node-lock-timeout, 5 minutes)
    # about 2 s into a wait of 120 s: the waiter must take it then, not wait out its whole wait.
    api, sched = fake_apiserver, Scheduler(session, patient.url)
    first, second = await filtered(api, sched, "first"), await filtered(api, sched, "second")
    assert await sched.bind(first, "node1") == {"Error": ""}
    backdate_lock(api, "node1", 298)
    assert await asyncio.wait_for(sched.bind(second, "node1"), 12) == {"Error": ""}
    assert lock_owner(api) == "second"


async def test_a_lock_released_while_the_node_watch_was_down_is_seen_after_the_relist(
    fake_apiserver, patient, session
) -> None:
    extender = patient
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    sync = extender.runtime.sync
    first, second = await filtered(api, sched, "first"), await filtered(api, sched, "second")
    assert await sched.bind(first, "node1") == {"Error": ""}
    waiting = asyncio.create_task(sched.bind(second, "node1"))
    await eventually(lambda: extender.lock_queues.waiting("node1") == 1, what="second waiting")
    # The node watch goes down and stays down; the lock is released meanwhile (no pod changes, so
    # the pod watch has nothing to tell either); the history is compacted, so the reconnect relists.
    refused = api.faults.add(verb="watch", resource="nodes", status=500)
    lists = sync.nodes.list_count
    api.drop_watches()
    await eventually(lambda: refused.hits >= 1, what="the node watch refused")
    api.store.patch("nodes", "node1", {"metadata": {"annotations": {A.NODE_LOCK: None}}})
    api.compact()
    api.faults.clear()
    await eventually(lambda: sync.nodes.list_count > lists, timeout_s=15, what="the node relist")
    assert await asyncio.wait_for(waiting, 10) == {"Error": ""}
    assert lock_owner(api) == "second"
