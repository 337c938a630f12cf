"""Faults around the extender: objects vanishing between filter and bind, API errors (409, 500, timeouts)
on each API call of the two verbs, dropped and expired watches.

Each test asserts what was released (reservation, node lock) and the exact `Error` kube-scheduler sees.
"""

from __future__ import annotations

import asyncio

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
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 2)))
    fake_apiserver.store.create("nodes", gpu_node("node2", cards("n2", 2)))
    server = await start_extender(fake_apiserver)
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


def lock_of(api: FakeApiServer, node: str) -> str | None:
    obj = api.store.get("nodes", node)
    return None if obj is None else (obj["metadata"].get("annotations") or {}).get(A.NODE_LOCK)


async def filtered(api: FakeApiServer, sched: Scheduler, name: str, nodes=("node1",)) -> dict:  # type: ignore[no-untyped-def]
    pod = create_pod(api, gpu_pod(name, mem=1000, cores=10))
    result = await sched.filter(pod, list(nodes))
    assert result["Error"] == "" and len(Scheduler.chosen(result)) == 1, result
    return pod


async def test_node_disappears_between_filter_and_bind(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = await filtered(api, sched, "p")
    uid = pod["metadata"]["uid"]
    assert extender.state.pod_node(uid) == "node1"
    api.store.delete("nodes", "node1")
    result = await sched.bind(pod, "node1")
    assert result == {
        "Error": "binding pod default/p failed: node node1 no longer exists; the reservation was released"
    }
    assert extender.state.pod_node(uid) is None or extender.state.pod_node(uid) == "node1"
    assert api.store.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    await extender.events.drain()
    reasons = [
        e["reason"]
        for e in api.store.list("events", namespace="default")
        if e["involvedObject"]["name"] == "p"
    ]
    assert "BindingFailed" in reasons


async def test_node_disappears_after_the_lock_was_taken(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = await filtered(api, sched, "p")
    # The lock write is slow; meanwhile the node loses its device registration (its device plugin is
    # gone). The lock write then conflicts (the node changed), is retried from a fresh read and succeeds.
    # The API server would accept the Binding anyway (it does not check nodes), so the extender must
    # notice between the lock and the Binding and stop.
    lock_write = api.faults.add(
        verb="patch", resource="nodes", name="node1", status=None, delay_s=0.5, times=1
    )
    bind = asyncio.ensure_future(sched.bind(pod, "node1"))
    await eventually(lambda: lock_write.hits == 1, what="lock write sent")
    api.store.patch("nodes", "node1", {"metadata": {"annotations": {A.NVIDIA_REGISTER: None}}})
    await eventually(
        lambda: extender.state.node_unusable_reason("node1") is not None, what="unregistered seen"
    )
    result = await bind
    assert result == {
        "Error": "binding pod default/p failed: node node1 no longer exists; the reservation was released"
    }
    assert lock_of(api, "node1") is None
    assert api.store.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    assert extender.state.pod_node(pod["metadata"]["uid"]) is None
    assert api.store.get("pods", "p", namespace="default")["spec"].get("nodeName") is None


async def test_pod_deleted_between_filter_and_bind_releases_the_reservation(
    fake_apiserver,
    extender,
    session,
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = await filtered(api, sched, "gone")
    uid = pod["metadata"]["uid"]
    await eventually(lambda: extender.state.usage_snapshot()["node1"] != {}, what="usage")
    api.store.delete("pods", "gone", namespace="default")
    # Whether the watch already delivered the deletion or not, bind must end with nothing held.
    result = await sched.bind(pod, "node1")
    assert result["Error"] in (
        "binding pod default/gone to node1 failed: the pod was deleted (or re-created) after filtering; its "
        "reservation and the node lock were released",
        "binding pod default/gone to node1 failed: the pod no longer exists",
    ), result
    assert extender.state.pod_node(uid) is None
    assert lock_of(api, "node1") is None
    await eventually(lambda: extender.state.usage_snapshot()["node1"] == {}, what="usage released")


async def test_pod_deleted_before_bind_with_reservation_still_present(
    fake_apiserver, extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    # Keep the pod watch from telling the extender about the deletion: the bind path must find out itself.
    pod = await filtered(api, sched, "ghost")
    uid = pod["metadata"]["uid"]
    await eventually(lambda: extender.runtime.sync.cached_pod("default", "ghost") is not None, what="cached")
    extender.runtime.sync._lock.acquire()  # the pod watch's callbacks wait: a stalled watch
    try:
        api.store.delete("pods", "ghost", namespace="default")
        result = await sched.bind(pod, "node1")
    finally:
        extender.runtime.sync._lock.release()
    assert result["Error"] == (
        "binding pod default/ghost to node1 failed: the pod was deleted (or re-created) after filtering; "
        "its reservation and the node lock were released"
    )
    assert extender.state.pod_node(uid) is None
    assert lock_of(api, "node1") is None


@pytest.mark.parametrize(
    ("status", "times", "error"),
    [
        (
            409,
            1,
            "pod default/p was re-created (UID changed) while being filtered; its device reservation was "
            "released and it will be filtered again",
        ),
        (
            500,
            10,
            "recording the placement on pod default/p failed (patch pods default/p: Internal error occurred: injected fault); the reservation was released",
        ),
        (500, 1, ""),  # one 5xx is retried by the client
    ],
)
async def test_filter_patch_failures(fake_apiserver, extender, session, status, times, error) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    api.faults.add(verb="patch", resource="pods", status=status, times=times)
    pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
    result = await sched.filter(pod, ["node1"])
    assert result["Error"] == error
    uid = pod["metadata"]["uid"]
    if error:
        assert result["NodeNames"] is None
        assert extender.state.pod_node(uid) is None
        annos = api.store.get("pods", "p", namespace="default")["metadata"].get("annotations") or {}
        assert A.ASSIGNED_NODE not in annos
    else:
        assert result["NodeNames"] == ["node1"]
        assert extender.state.pod_node(uid) == "node1"
    api.faults.clear()


async def test_filter_patch_timeout_is_retried(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    # The first attempt hangs past the client's 2 s timeout; the retry succeeds.
    api.faults.add(verb="patch", resource="pods", hang_s=3.0, times=1)
    pod = create_pod(api, gpu_pod("slow", mem=1000, cores=10))
    result = await sched.filter(pod, ["node1"])
    assert result["NodeNames"] == ["node1"] and result["Error"] == ""


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (
            {"verb": "create", "subresource": "binding", "status": 500, "times": 10},
            "binding pod default/p to node1 failed: bind pod default/p to node node1: Internal error occurred: "
            "injected fault; the node lock was released",
        ),
        (
            {"verb": "patch", "resource": "nodes", "status": 500, "times": 10},
            "binding pod default/p failed: cannot take the lock of node node1: patch nodes node1: Internal "
            "error occurred: injected fault",
        ),
    ],
    ids=["binding-500", "node-lock-patch-500"],
)
async def test_bind_api_failures_release_the_lock_and_keep_the_reservation(
    fake_apiserver,
    extender,
    session,
    fault,
    error,
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = await filtered(api, sched, "p")
    api.faults.add(**fault)
    result = await sched.bind(pod, "node1")
    api.faults.clear()
    assert result == {"Error": error}
    assert lock_of(api, "node1") is None
    # The pod still carries its allocation, so it stays counted until kube-scheduler filters it again.
    assert extender.state.pod_node(pod["metadata"]["uid"]) == "node1"
    assert api.store.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    # kube-scheduler retries: a new filter replaces the reservation and bind succeeds.
    again = await sched.filter(api.store.get("pods", "p", namespace="default"), ["node1"])
    assert again["NodeNames"] == ["node1"]
    assert await sched.bind(pod, "node1") == {"Error": ""}


async def test_binding_conflict_when_already_bound_to_the_same_node_is_success(
    fake_apiserver,
    extender,
    session,
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = await filtered(api, sched, "twice")
    assert await sched.bind(pod, "node1") == {"Error": ""}
    # kube-scheduler timed out on our reply and retried the same bind (before the watch saw the Binding).
    assert await sched.bind(pod, "node1") == {"Error": ""}
    # The device plugin has allocated and released the lock; a late retry must not lock the node again.
    dp_allocated(api, pod, "node1")

    def cached_phase() -> str | None:
        cached = extender.runtime.sync.cached_pod("default", "twice") or {}
        return (cached.get("metadata", {}).get("annotations") or {}).get(A.BIND_PHASE)

    await eventually(lambda: cached_phase() == "success", what="the watch saw the allocation")
    assert await sched.bind(pod, "node1") == {"Error": ""}
    assert lock_of(api, "node1") is None
    annotations = api.store.get("pods", "twice", namespace="default")["metadata"]["annotations"]
    assert annotations[A.BIND_PHASE] == "success"
    # A bind to another node of a pod bound here is refused.
    other = await sched.bind(pod, "node2")
    assert other == {"Error": "binding pod default/twice to node2 failed: the pod is already bound to node1"}


@pytest.mark.parametrize(
    ("wait", "tail"),
    [
        ("0", "pod default/second must wait until that pod's devices are allocated"),
        ("0.3s", "must wait until that pod's devices are allocated; waited 0.3s for it (--bind-lock-wait)"),
    ],
    ids=["fail-at-once", "after-the-wait"],
)
async def test_lock_contention_is_reported_with_the_holder(fake_apiserver, session, wait, tail) -> None:
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 2)))
    server = await start_extender(fake_apiserver, "--bind-lock-wait", wait)
    try:
        await wait_ready(server)
        api, sched = fake_apiserver, Scheduler(session, server.url)
        first = await filtered(api, sched, "first")
        second = await filtered(api, sched, "second")
        assert await sched.bind(first, "node1") == {"Error": ""}
        result = await sched.bind(second, "node1")
        assert result["Error"].startswith(
            "binding pod default/second to node1 failed: node node1 is locked by default/first since "
        )
        assert result["Error"].endswith(tail)
        assert lock_of(api, "node1").endswith(",default,first")
        assert server.lock_queues.waiting() == 0
    finally:
        await server.stop()


async def test_dropped_and_expired_watches_are_recovered(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    sync = extender.runtime.sync
    lists_before = sync.nodes.list_count
    # Synced means listed; each reflector opens its watch just after its list.
    kinds = ("nodes", "pods", "resourcequotas")
    await eventually(lambda: all(api.open_watch_count(k) >= 1 for k in kinds), what="the three watches open")
    assert api.drop_watches(abrupt=True) >= 3
    api.store.create("nodes", gpu_node("node3", cards("n3", 2)))
    await eventually(lambda: "node3" in extender.state.node_names(), what="node3 after reconnect")
    assert sync.nodes.list_count == lists_before  # resumed from its resourceVersion, no relist
    # A watch that comes back with a too-old resourceVersion relists (410) and rebuilds the state.
    # The reconnect is held at the server while node2 goes and the history is compacted, so it
    # asks for a resourceVersion from before the compaction; the delay only orders the server's
    # work (a slower machine makes the test fail on the relist count, never pass by accident).
    await eventually(lambda: api.open_watch_count("nodes") >= 1, what="node watch reopened")
    api.faults.add(verb="watch", resource="nodes", status=None, delay_s=1.0)
    api.drop_watches()
    api.store.delete("nodes", "node2")
    api.compact()
    api.store.create("nodes", gpu_node("node4", cards("n4", 2)))
    await eventually(lambda: sync.nodes.list_count > lists_before, timeout_s=10.0, what="relist after 410")
    await eventually(lambda: "node4" in extender.state.node_names(), what="node4")
    assert "node2" not in extender.state.node_names()
    assert sync.nodes.list_count == lists_before + 1
    pod = create_pod(api, gpu_pod("after", mem=1000, cores=10))
    result = await sched.filter(pod, ["node3", "node4"])
    assert len(result["NodeNames"]) == 1


async def test_a_late_event_of_an_earlier_placement_does_not_move_the_reservation(
    fake_apiserver, extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = create_pod(api, gpu_pod("late", mem=1000, cores=10))
    first = await sched.filter(pod, ["node1"])
    assert first["NodeNames"] == ["node1"]
    stale = api.store.get("pods", "late", namespace="default")  # carries the first placement (card X)
    card_x = stale["metadata"]["annotations"][A.NVIDIA_ALLOCATED].split(",")[0]
    await eventually(lambda: len(extender.inflight) == 0, what="first placement seen")
    sync = extender.runtime.sync
    sync._lock.acquire()  # the pod watch stalls, so the event of the first placement can come late
    try:
        # kube-scheduler retries (say the bind failed); this time card X is excluded by the pod.
        retry = dict(pod, metadata={**pod["metadata"], "annotations": {"nvidia.com/nouse-gpuuuid": card_x}})
        second = await sched.filter(retry, ["node1"])
        assert second["NodeNames"] == ["node1"]
        card_y = api.store.get("pods", "late", namespace="default")["metadata"]["annotations"][
            A.NVIDIA_ALLOCATED
        ]
        card_y = card_y.split(",")[0]
        assert card_y != card_x
        assert sync.inflight is extender.inflight and len(extender.inflight) == 1
        sync._pod_event(stale)  # e.g. a status update written between the two placements, delivered now
        # Applied, it would move the usage back to X and leave Y free for another pod.
        assert extender.state.usage_snapshot()["node1"] == {card_y: (1, 1000, 10)}
    finally:
        sync._lock.release()
    await eventually(lambda: len(extender.inflight) == 0, what="second placement seen")
    assert extender.state.usage_snapshot()["node1"] == {card_y: (1, 1000, 10)}


async def test_a_placed_pod_that_now_fits_nowhere_loses_its_stale_allocation(
    fake_apiserver, extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = await filtered(api, sched, "moved")
    big = {**pod, "metadata": dict(pod["metadata"])}
    big["spec"] = {**pod["spec"], "containers": [dict(pod["spec"]["containers"][0])]}
    big["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "3"}}  # 3 cards: nowhere
    result = await sched.filter(big, ["node1", "node2"])
    assert result["NodeNames"] == [] and result["Error"] == ""
    stored = api.store.get("pods", "moved", namespace="default")["metadata"]
    assert not {A.ASSIGNED_NODE, A.NVIDIA_ALLOCATED, A.NVIDIA_TO_ALLOCATE, A.ASSIGNED_TIME} & set(
        stored.get("annotations") or {}
    )
    assert A.ASSIGNED_NODE not in (stored.get("labels") or {})
    await eventually(lambda: len(extender.inflight) == 0, what="clearing event applied")
    assert extender.state.pod_node(pod["metadata"]["uid"]) is None
    assert extender.state.usage_snapshot()["node1"] == {}


# -- --async-record: the placement write leaves the filter path, bind waits for it -----------------------


@pytest.fixture
async def async_extender(fake_apiserver: FakeApiServer):
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 2)))
    server = await start_extender(fake_apiserver, "--async-record")
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


async def test_async_record_bind_waits_for_a_slow_placement_write(
    fake_apiserver, async_extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, async_extender.url)
    api.faults.add(verb="patch", resource="pods", name="p", status=None, delay_s=0.5, times=1)
    pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
    result = await sched.filter(pod, ["node1"])
    # Answered before the write landed: the pod has no placement yet.
    assert result["NodeNames"] == ["node1"] and result["Error"] == ""
    assert A.ASSIGNED_NODE not in (
        api.store.get("pods", "p", namespace="default")["metadata"].get("annotations") or {}
    )
    assert await sched.bind(pod, "node1") == {"Error": ""}
    stored = api.store.get("pods", "p", namespace="default")
    annos = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "node1"
    assert annos[A.ASSIGNED_NODE] == "node1" and annos[A.BIND_PHASE] == "allocating"
    assert annos[A.NVIDIA_ALLOCATED] == "GPU-n1-0,NVIDIA,1000,10:;"


async def test_async_record_failed_write_fails_the_bind_and_releases(
    fake_apiserver, async_extender, session
) -> None:
    api, sched = fake_apiserver, Scheduler(session, async_extender.url)
    api.faults.add(verb="patch", resource="pods", name="p", status=500, times=10)
    pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
    result = await sched.filter(pod, ["node1"])
    assert result["NodeNames"] == ["node1"] and result["Error"] == ""
    bound = await sched.bind(pod, "node1")
    assert bound == {
        "Error": "binding pod default/p to node1 failed: recording the placement on pod default/p failed "
        "(patch pods default/p: Internal error occurred: injected fault); the reservation was released"
    }
    assert async_extender.state.pod_node(pod["metadata"]["uid"]) is None
    assert lock_of(api, "node1") is None
    assert api.store.get("pods", "p", namespace="default")["spec"].get("nodeName") is None
    # kube-scheduler retries the pod: filter and bind now succeed.
    api.faults.clear()
    assert (await sched.filter(api.store.get("pods", "p", namespace="default"), ["node1"]))["NodeNames"] == [
        "node1"
    ]
    assert await sched.bind(pod, "node1") == {"Error": ""}


async def test_a_late_creation_event_does_not_take_the_clearing_writes_place(
    fake_apiserver, extender, session
) -> None:
    # The creation event (no allocation) predates the clearing write although it looks like it: taken
    # for it, the expectation ends and the late placement event after it is counted until the
    # clearing event arrives (a test that waits for the expectation to end reads the stale count).
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    sync = extender.runtime.sync
    sync._lock.acquire()  # the pod watch stalls: every event of this pod arrives after both filters
    try:
        pod = create_pod(api, gpu_pod("slow", mem=1000, cores=10))
        created = api.store.get("pods", "slow", namespace="default")
        assert (await sched.filter(pod, ["node1"]))["NodeNames"] == ["node1"]
        placed = api.store.get("pods", "slow", namespace="default")
        big = {**pod, "spec": {**pod["spec"], "containers": [dict(pod["spec"]["containers"][0])]}}
        big["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "3"}}  # nowhere
        assert (await sched.filter(big, ["node1", "node2"]))["NodeNames"] == []
        cleared = api.store.get("pods", "slow", namespace="default")
        uid = pod["metadata"]["uid"]
        sync._pod_event(created)
        assert uid in extender.inflight  # still waiting for the clearing write
        sync._pod_event(placed)
        assert extender.state.pod_node(uid) is None
        assert extender.state.usage_snapshot()["node1"] == {}
        sync._pod_event(cleared)
        assert uid not in extender.inflight
        assert extender.state.pod_node(uid) is None
        assert extender.state.usage_snapshot()["node1"] == {}
    finally:
        sync._lock.release()
    # The watch then delivers the same events for real: nothing comes back.
    await eventually(lambda: len(extender.inflight) == 0, what="events applied")
    assert extender.state.pod_node(uid) is None
    assert extender.state.usage_snapshot()["node1"] == {}
