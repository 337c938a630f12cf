"""Restart and failover: the state an extender reaches incrementally is exactly what a fresh replica rebuilds
from the annotations, whatever bind phase the pods are in; a standby serves nothing; a new leader takes
over with the same allocations.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

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


def snapshot(server) -> tuple:  # type: ignore[no-untyped-def]
    """Everything the extender counts: per-card usage, per-pod grants, quota counters."""
    state = server.state
    return (
        state.usage_snapshot(),
        state.card_stats(),
        sorted((ns, name, node, grants) for ns, name, node, grants in state.pod_grants()),
        state.quota_stats(),
    )


async def place(api: FakeApiServer, sched: Scheduler, name: str, nodes: list[str], **kw) -> tuple[dict, str]:  # type: ignore[no-untyped-def]
    pod = create_pod(api, gpu_pod(name, **kw))
    result = await sched.filter(pod, nodes)
    (node,) = result["NodeNames"]
    return pod, node


async def test_restart_with_pods_in_every_bind_phase_rebuilds_the_same_state(fake_apiserver, session) -> None:
    api = fake_apiserver
    for i in range(3):
        api.store.create("nodes", gpu_node(f"node{i}", cards(f"n{i}", 2, mem=16384)))
    api.store.create(
        "resourcequotas",
        {
            "metadata": {"name": "q", "namespace": "team"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "100000"}},
        },
    )
    first = await start_extender(api)
    await wait_ready(first)
    sched = Scheduler(session, first.url)
    nodes = ["node0", "node1", "node2"]
    assert len(nodes) == 3

    # One pod per node holds its lock at a time, so the pods that stay "allocating" get their own node.
    await place(api, sched, "filtered-only", nodes, mem=3000, cores=20)  # no bind-phase yet
    pod, node = await place(api, sched, "allocating", ["node1"], namespace="team", mem=5000, cores=30)
    assert await sched.bind(pod, node) == {"Error": ""}  # bind-phase allocating, lock held
    pod, node = await place(
        api, sched, "success", ["node0", "node2"], namespace="team", gpus=2, mem=2000, cores=10
    )
    assert await sched.bind(pod, node) == {"Error": ""}
    dp_allocated(api, pod, node)
    api.store.set_pod_phase("team", "success", "Running")
    pod, node = await place(api, sched, "failed", ["node0", "node2"], mem=1000, cores=5)
    assert await sched.bind(pod, node) == {"Error": ""}
    api.store.patch(
        "pods", "failed", {"metadata": {"annotations": {A.BIND_PHASE: "failed"}}}, namespace="default"
    )
    api.store.patch("nodes", node, {"metadata": {"annotations": {A.NODE_LOCK: None}}})
    pod, node = await place(api, sched, "finished", ["node0", "node2"], mem=7000, cores=50)
    assert await sched.bind(pod, node) == {"Error": ""}
    dp_allocated(api, pod, node)
    api.store.set_pod_phase("default", "finished", "Succeeded")  # terminal: no longer counted
    pod, node = await place(api, sched, "deleted", nodes, mem=6000, cores=50)
    api.store.delete("pods", "deleted", namespace="default")
    # A forged allocation of another scheduler must be ignored by both replicas.
    forged = gpu_pod("forged", scheduler="default-scheduler")
    forged["metadata"]["annotations"] = {
        A.ASSIGNED_NODE: "node0",
        A.NVIDIA_ALLOCATED: "GPU-n0-0,NVIDIA,16384,100:;",
    }
    api.store.create("pods", forged)

    def settled() -> bool:
        names = {name for _, name, _, _ in first.state.pod_grants()}
        return names == {"filtered-only", "allocating", "success", "failed"}

    await eventually(settled, what="first replica caught up with pod events")
    before = snapshot(first)
    assert before[3] == [("team", "nvidia.com/gpumem", 9000, 100000)]
    await first.stop()

    second = await start_extender(api)
    try:
        await wait_ready(second)
        assert snapshot(second) == before
    finally:
        await second.stop()


def lease_time(api: FakeApiServer, field: str) -> float:
    """A time field of the extender's Lease (RFC 3339 with microseconds), in seconds since the epoch."""
    lease = api.store.get("leases", "hami-scheduler-extender", namespace="default")
    return datetime.fromisoformat(lease["spec"][field]).timestamp()


@pytest.mark.parametrize("graceful", [True, False], ids=["graceful-release", "crash"])
async def test_leader_failover(fake_apiserver, session, graceful: bool) -> None:
    api = fake_apiserver
    for i in range(2):
        api.store.create("nodes", gpu_node(f"node{i}", cards(f"n{i}", 2)))
    # Graceful: a Lease far longer than a takeover may take, so a quick takeover shows the release
    # was used and not the expiry. Crash: a short Lease, so the test waits for its expiry.
    lease_s = 15 if graceful else 3
    flags = ["--leader-elect", "--leader-elect-resource-namespace", "default",
             "--leader-elect-lease-duration", f"{lease_s}s", "--leader-elect-renew-deadline", "2s",
             "--leader-elect-retry-period", "200ms"]  # fmt: skip
    a = await start_extender(api, *flags, "--leader-elect-identity", "replica-a")
    await wait_ready(a)
    b = await start_extender(api, *flags, "--leader-elect-identity", "replica-b")
    try:
        await eventually(
            lambda: b.runtime.readiness() == "standby replica (leader is replica-a)", what="b saw a's Lease"
        )
        assert b.runtime.readiness() == "standby replica (leader is replica-a)"
        async with session.get(f"{b.url}/readyz") as r:
            assert r.status == 503
            assert await r.text() == "not ready: standby replica (leader is replica-a)\n"
        async with session.get(f"{a.url}/readyz") as r:
            assert r.status == 200
        standby = Scheduler(session, b.url)
        pod = create_pod(api, gpu_pod("p0", mem=4000, cores=20))
        refused = await standby.filter(pod, ["node0", "node1"])
        assert refused["Error"] == "extender not ready: standby replica (leader is replica-a)"
        assert refused["NodeNames"] is None
        bind_refused = await standby.bind(pod, "node0")
        assert bind_refused == {"Error": "extender not ready: standby replica (leader is replica-a)"}
        assert b.state.node_names() == []  # a standby keeps no view of its own

        leader = Scheduler(session, a.url)
        placed = await leader.filter(pod, ["node0", "node1"])
        (node,) = placed["NodeNames"]
        assert await leader.bind(pod, node) == {"Error": ""}
        pod1 = create_pod(api, gpu_pod("p1", mem=6000, cores=30))
        assert len((await leader.filter(pod1, ["node0", "node1"]))["NodeNames"]) == 1
        await eventually(lambda: len(a.state.pod_grants()) == 2, what="leader saw its pods")
        before = snapshot(a)

        if not graceful:
            # A crash: the Lease is not released, b waits for it to expire (3 s) before taking over.
            a.runtime.elector.release_on_stop = False
        t0 = asyncio.get_running_loop().time()
        await a.stop()  # graceful: releases the Lease, b takes over within a retry period
        last_renew = None if graceful else lease_time(api, "renewTime")  # a's last renewal
        await wait_ready(b, timeout_s=lease_s + 10)
        took = asyncio.get_running_loop().time() - t0
        if graceful:
            assert took < lease_s - 5, took
        else:
            # b counts the Lease's duration from when it saw a's last renewal, so it acquires at least
            # that long after the renewal was written (both times are the Lease's, not the test's).
            assert last_renew is not None
            waited = lease_time(api, "acquireTime") - last_renew
            assert waited >= lease_s, waited
        assert b.runtime.elector.leader_identity == "replica-b"
        assert snapshot(b) == before
        lease = api.store.get("leases", "hami-scheduler-extender", namespace="default")
        assert lease["spec"]["holderIdentity"] == "replica-b"
        assert lease["spec"]["leaseTransitions"] >= 1
        # The new leader continues from the same allocations.
        pod2 = create_pod(api, gpu_pod("p2", mem=1000, cores=10))
        result = await Scheduler(session, b.url).filter(pod2, ["node0", "node1"])
        assert len(result["NodeNames"]) == 1 and result["Error"] == ""
    finally:
        await b.stop()
        if a.runtime.elector is not None and a.runtime.elector.is_leader:
            await a.stop()
