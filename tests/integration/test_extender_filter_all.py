"""``--filter-mode all``: /filter returns every node that fits and writes nothing, /prioritize gives the
node policy's scores on kube-scheduler's 0..10 scale, /bind chooses the cards on kube-scheduler's pick and
never over-commits a card."""

from __future__ import annotations

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
    watches_open,
)


@pytest.fixture
async def extender(fake_apiserver: FakeApiServer):
    store = fake_apiserver.store
    store.create("nodes", gpu_node("node1", cards("n1", 1, mem=4000, count=2)))
    store.create("nodes", gpu_node("node2", cards("n2", 1, mem=500)))  # too small for every pod here
    store.create("nodes", gpu_node("node3", cards("n3", 2, mem=16000)))
    server = await start_extender(fake_apiserver, "--filter-mode", "all")
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


NODES = ["node1", "node2", "node3"]


async def test_filter_returns_every_fitting_node_and_writes_nothing(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
    # Ready means listed; the watch requests follow the lists and must not land in the counted span.
    await watches_open(api)
    before = fake_apiserver.request_count
    result = await sched.filter(pod, NODES)
    assert fake_apiserver.request_count == before  # no API call, whatever the number of candidates
    assert result["Error"] == "" and result["NodeNames"] == ["node1", "node3"]
    assert set(result["FailedNodes"]) == {"node2"} and "memory" in result["FailedNodes"]["node2"].lower()
    assert extender.state.pod_node(pod["metadata"]["uid"]) is None  # nothing stays reserved
    stored = api.store.get("pods", "p", namespace="default")
    assert stored["metadata"]["resourceVersion"] == pod["metadata"]["resourceVersion"]


async def test_bind_chooses_the_cards_on_kube_schedulers_pick(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
    assert (await sched.filter(pod, NODES))["NodeNames"] == ["node1", "node3"]
    # Our binpack policy would take node1 (fuller); kube-scheduler's own scoring picked node3.
    assert await sched.bind(pod, "node3") == {"Error": ""}
    stored = api.store.get("pods", "p", namespace="default")
    annos = stored["metadata"]["annotations"]
    assert stored["spec"]["nodeName"] == "node3"
    assert annos[A.ASSIGNED_NODE] == "node3" and annos[A.BIND_PHASE] == "allocating"
    [[device]] = A.decode_pod_devices(annos[A.NVIDIA_ALLOCATED])
    assert device.uuid.startswith("GPU-n3-") and (device.usedmem, device.usedcores) == (1000, 10)
    assert api.store.get("nodes", "node3")["metadata"]["annotations"][A.NODE_LOCK].endswith(",default,p")
    assert extender.state.pod_node(stored["metadata"]["uid"]) == "node3"


async def test_two_pods_offered_the_last_share_never_overcommit_it(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    first = create_pod(api, gpu_pod("first", mem=3000, cores=10))
    second = create_pod(api, gpu_pod("second", mem=3000, cores=10))
    # Both see node1 (4000 MiB) as fitting: nothing is reserved at filter time.
    assert "node1" in (await sched.filter(first, NODES))["NodeNames"]
    assert "node1" in (await sched.filter(second, NODES))["NodeNames"]
    assert await sched.bind(first, "node1") == {"Error": ""}
    dp_allocated(api, first, "node1")
    result = await sched.bind(second, "node1")
    assert result["Error"].startswith("binding pod default/second to node1 failed: it no longer fits there (")
    assert result["Error"].endswith("); it will be scheduled again")
    annos = api.store.get("pods", "second", namespace="default")["metadata"].get("annotations") or {}
    assert A.NVIDIA_ALLOCATED not in annos and A.ASSIGNED_NODE not in annos
    assert extender.state.usage_snapshot()["node1"] == {"GPU-n1-0": (1, 3000, 10)}
    # The next cycle no longer offers node1, and the pod binds elsewhere.
    assert (await sched.filter(second, NODES))["NodeNames"] == ["node3"]
    assert await sched.bind(second, "node3") == {"Error": ""}


async def test_prioritize_scores_are_the_node_policy_on_the_0_to_10_scale(fake_apiserver, extender, session) -> None:
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    placed = create_pod(api, gpu_pod("placed", mem=2000, cores=50))
    assert await sched.bind(placed, "node1") == {"Error": ""}  # node1 half used, node3 empty
    pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
    status, binpack = await sched.post("prioritize", sched.filter_args(pod, ["node1", "node3", "ghost"]))
    assert status == 200
    # node1: slots 1/2, cores 50/100, memory 2000/4000 -> 15 of 30 -> 5; node3 empty -> 0; unknown -> 0.
    assert binpack == [{"Host": "node1", "Score": 5}, {"Host": "node3", "Score": 0}, {"Host": "ghost", "Score": 0}]
    spread_pod = create_pod(api, gpu_pod("s", mem=1000, cores=10, annotations={"hami.io/node-scheduler-policy": "spread"}))
    _, spread = await sched.post("prioritize", sched.filter_args(spread_pod, ["node1", "node3"]))
    assert spread == [{"Host": "node1", "Score": 5}, {"Host": "node3", "Score": 10}]
    _, bad = await sched.post("prioritize", b"not json")
    assert bad == []  # kube-scheduler ignores a failed prioritize: every node 0 from us


async def test_a_bind_that_cannot_take_the_node_lock_releases_the_placement_it_made(
    fake_apiserver, session
) -> None:
    # --bind-lock-wait 0: a held lock fails the bind at once. The placement this bind made (cards
    # reserved, annotations written) must go with it, or the pod holds the capacity until its next bind.
    api = fake_apiserver
    api.store.create("nodes", gpu_node("node1", cards("n1", 1, mem=4000, count=2)))
    server = await start_extender(api, "--filter-mode", "all", "--bind-lock-wait", "0")
    try:
        await wait_ready(server)
        sched = Scheduler(session, server.url)
        first, second = (create_pod(api, gpu_pod(n, mem=1000, cores=10)) for n in ("first", "second"))
        for p in (first, second):
            assert (await sched.filter(p, ["node1"]))["NodeNames"] == ["node1"]
        assert await sched.bind(first, "node1") == {"Error": ""}
        result = await sched.bind(second, "node1")
        assert result["Error"].startswith("binding pod default/second to node1 failed: node node1 is locked by ")
        uid = second["metadata"]["uid"]
        assert server.state.pod_node(uid) is None
        assert server.state.usage_snapshot()["node1"] == {"GPU-n1-0": (1, 1000, 10)}  # first's share only
        annos = api.store.get("pods", "second", namespace="default")["metadata"].get("annotations") or {}
        assert A.ASSIGNED_NODE not in annos and A.NVIDIA_ALLOCATED not in annos
        # Its next bind places it afresh once the lock is free.
        dp_allocated(api, first, "node1")
        await eventually(lambda: A.NODE_LOCK not in api.store.get("nodes", "node1")["metadata"]["annotations"])
        assert await sched.bind(second, "node1") == {"Error": ""}
    finally:
        await server.stop()
