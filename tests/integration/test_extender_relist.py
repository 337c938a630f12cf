"""A relist in the middle of a leadership term keeps the reservations whose pod patch is still in flight.

With ``--async-record`` /filter answers once the decision is reserved in ClusterState and writes the pod
patch afterwards. A pod relist (the reflector's answer to ``410 Gone``, or `Reflector.resync`) that lands
in between sees the pod without its allocation annotations; rebuilding the state from that list alone
would free the reserved card and hand it to the next pod as well. The real extender and its real sync
run against the in-memory API server; the placement write is held back at the server until released.
"""

from __future__ import annotations

import threading

import pytest

from hami import annotations as A
from kubefakes.apiserver import FakeApiServer
from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready

# The placement write is held at the API server until the test releases it (`Fault.gate`), so the relist
# and the second filter happen while it is pending however slow the machine; the extender's API
# timeout is raised above the harness's 2 s so that the held request is not abandoned and retried.
HELD_WRITE = ("--async-record", "--kube-timeout", "60")


_HELD: list[threading.Event] = []  # released before the extender stops, should a test fail first


def held_write(api: FakeApiServer, name: str) -> threading.Event:
    """Hold the next patch of pod `name` until the returned event is set."""
    gate = threading.Event()
    _HELD.append(gate)
    api.faults.add(verb="patch", resource="pods", name=name, status=None, gate=gate, times=1)
    return gate


async def _stop(server) -> None:  # type: ignore[no-untyped-def]
    while _HELD:
        _HELD.pop().set()
    await server.stop()


@pytest.fixture
async def async_extender(fake_apiserver: FakeApiServer):
    # One card of 32768 MiB: two pods of 30000 MiB cannot both have it.
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 1)))
    server = await start_extender(fake_apiserver, *HELD_WRITE)
    await wait_ready(server)
    try:
        yield server
    finally:
        await _stop(server)


def placed(api: FakeApiServer, name: str) -> bool:
    pod = api.store.get("pods", name, namespace="default")
    return A.ASSIGNED_NODE in (pod["metadata"].get("annotations") or {})


@pytest.mark.parametrize("how", ["resync", "410-gone"])
async def test_relist_during_a_pending_placement_write_keeps_the_reservation(
    fake_apiserver, async_extender, session, how
) -> None:
    api, sched = fake_apiserver, Scheduler(session, async_extender.url)
    sync = async_extender.runtime.sync
    gate = held_write(api, "first")
    first = create_pod(api, gpu_pod("first", mem=30000, cores=10))
    assert (await sched.filter(first, ["node1"]))["NodeNames"] == ["node1"]
    assert async_extender.state.usage_snapshot()["node1"] == {"GPU-n1-0": (1, 30000, 10)}

    lists, rebuilds = sync.pods.list_count, sync.rebuilds
    if how == "resync":
        sync.pods.resync()
    else:  # the reopened pod watch is answered 410 Expired, as after an etcd compaction
        api.faults.add(verb="watch", resource="pods", status=410, times=1)
        api.drop_watches()
    await eventually(lambda: sync.rebuilds > rebuilds, what="state rebuilt from the relist")
    assert sync.pods.list_count == lists + 1
    assert not placed(api, "first")
    assert async_extender.state.usage_snapshot()["node1"] == {"GPU-n1-0": (1, 30000, 10)}

    second = create_pod(api, gpu_pod("second", mem=30000, cores=10))
    result = await sched.filter(second, ["node1"])
    assert not placed(api, "first")
    assert result["NodeNames"] == []
    assert result["FailedNodes"] == {"node1": "1/1 CardInsufficientMemory (no card has 30000 MiB free)"}

    gate.set()
    await eventually(lambda: placed(api, "first"), what="first placement written")
    assert await sched.bind(first, "node1") == {"Error": ""}
    assert async_extender.state.usage_snapshot()["node1"] == {"GPU-n1-0": (1, 30000, 10)}


@pytest.fixture
async def two_card_extender(fake_apiserver: FakeApiServer):
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 2)))
    server = await start_extender(fake_apiserver, *HELD_WRITE)
    await wait_ready(server)
    try:
        yield server
    finally:
        await _stop(server)


async def test_relist_showing_an_older_placement_keeps_the_newer_reservation(
    fake_apiserver, two_card_extender, session
) -> None:
    api, ext = fake_apiserver, two_card_extender
    sched, sync = Scheduler(session, ext.url), ext.runtime.sync
    pod = create_pod(api, gpu_pod("moving", mem=30000, cores=10))
    assert (await sched.filter(pod, ["node1"]))["NodeNames"] == ["node1"]
    await eventually(lambda: placed(api, "moving") and len(ext.inflight) == 0, what="first placement seen")
    card_x = api.store.get("pods", "moving", namespace="default")["metadata"]["annotations"][
        A.NVIDIA_ALLOCATED
    ]
    card_x = card_x.split(",")[0]
    card_y = {"GPU-n1-0": "GPU-n1-1", "GPU-n1-1": "GPU-n1-0"}[card_x]
    # kube-scheduler filters the pod again (say its bind failed), now excluding card X; the write of
    # the new placement is held back, so the relist still lists the pod with card X.
    gate = held_write(api, "moving")
    retry = dict(pod, metadata={**pod["metadata"], "annotations": {"nvidia.com/nouse-gpuuuid": card_x}})
    assert (await sched.filter(retry, ["node1"]))["NodeNames"] == ["node1"]
    assert ext.state.usage_snapshot()["node1"] == {card_y: (1, 30000, 10)}
    rebuilds = sync.rebuilds
    sync.pods.resync()
    await eventually(lambda: sync.rebuilds > rebuilds, what="state rebuilt from the relist")
    listed = sync.pods.get("moving", "default")["metadata"]["annotations"][A.NVIDIA_ALLOCATED]
    assert listed.startswith(card_x + ",")
    # Counted from the listed pod it would sit on X again, leaving Y free for another pod.
    assert ext.state.usage_snapshot()["node1"] == {card_y: (1, 30000, 10)}
    gate.set()
    await eventually(lambda: len(ext.inflight) == 0, what="new placement seen")
    assert ext.state.usage_snapshot()["node1"] == {card_y: (1, 30000, 10)}
