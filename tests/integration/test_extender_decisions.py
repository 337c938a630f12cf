"""A pod owner rewrites its running pod's allocation annotations (the webhook is down or bypassed): the
extender still counts what it decided, and after a restart at least what the pod's spec asks.

The real extender against the in-memory API server; the rewrite is a plain patch, as a pod owner
with update rights on its pod could make it where nothing refuses it.
"""

from __future__ import annotations

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

CARD = "GPU-g-0"


def _rewrite(api: FakeApiServer, name: str, value: str) -> None:
    api.store.patch(
        "pods", name, {"metadata": {"annotations": {A.NVIDIA_ALLOCATED: value}}}, namespace="default"
    )


async def test_a_rewritten_allocation_counts_what_was_decided(fake_apiserver: FakeApiServer, session) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("n1", cards("g", 1, mem=40000)))
    server = await start_extender(api)
    try:
        await wait_ready(server)
        sched = Scheduler(session, server.url)
        a = create_pod(api, gpu_pod("a", mem=30000, cores=30))
        assert Scheduler.chosen(await sched.filter(a, ["n1"])) == ["n1"]
        assert (await sched.bind(a, "n1"))["Error"] == ""
        dp_allocated(api, a, "n1")
        api.store.set_pod_phase("default", "a", "Running")
        _rewrite(api, "a", f"{CARD},NVIDIA,1,30:;")  # the owner says it uses 1 MiB
        await eventually(lambda: server.state.allocation_mismatches >= 1, what="the rewrite seen")
        b = create_pod(api, gpu_pod("b", mem=30000, cores=10))
        result = await sched.filter(b, ["n1"])
        assert result["NodeNames"] == [], result  # the card still holds a's 30000 of 40000 MiB
        assert "CardInsufficientMemory" in result["FailedNodes"]["n1"]
        async with session.get(f"{server.url}/metrics") as r:
            assert "hami_scheduler_allocation_mismatch_total 1.0" in await r.text()
        # Removing the annotations altogether frees nothing either.
        api.store.patch(
            "pods", "a",
            {"metadata": {"annotations": {A.NVIDIA_ALLOCATED: None, A.ASSIGNED_NODE: None}}},
            namespace="default",
        )  # fmt: skip
        await eventually(lambda: server.state.allocation_mismatches >= 2, what="the removal seen")
        assert (await sched.filter(b, ["n1"]))["NodeNames"] == []
        # Deleting the pod does free the card.
        api.store.delete("pods", "a", namespace="default")
        await eventually(lambda: server.state.pod_node(a["metadata"]["uid"]) is None, what="a gone")
        assert Scheduler.chosen(await sched.filter(b, ["n1"])) == ["n1"]
    finally:
        await server.stop()


async def test_after_a_restart_a_pod_counts_at_least_what_its_spec_asks(
    fake_apiserver: FakeApiServer, session
) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("n1", cards("g", 1, mem=40000)))
    pod = gpu_pod("a", mem=30000, cores=30)
    forged = f"{CARD},NVIDIA,1,0:;"  # rewritten by the owner before the extender (re)started
    pod["metadata"]["annotations"].update(
        {
            A.ASSIGNED_NODE: "n1",
            A.NVIDIA_ALLOCATED: forged,
            A.NVIDIA_TO_ALLOCATE: ";",
            A.BIND_PHASE: "success",
        }
    )
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = {"phase": "Running"}
    api.store.create("pods", pod)
    server = await start_extender(api)
    try:
        await wait_ready(server)
        [stat] = [c for c in server.state.card_stats() if c.uuid == CARD]
        assert (stat.usedmem, stat.usedcores) == (30000, 30), stat
        result = await Scheduler(session, server.url).filter(create_pod(api, gpu_pod("b", mem=30000)), ["n1"])
        assert result["NodeNames"] == [], result
    finally:
        await server.stop()
