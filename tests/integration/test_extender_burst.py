"""A burst of concurrent filters and binds from many clients (property: no card ever exceeds its memory,
cores or split count), checked against the annotations in the API server - the truth a device plugin and a
restarted extender would read - and against the extender's own counters.

Clients behave like kube-scheduler: filter, bind the chosen node, and on any bind error filter again
(the pod is requeued); a simulated device plugin finishes each bound pod (bind-phase success, lock
released); some pods are deleted midway, which must free their cards.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import AsyncIterator

import aiohttp
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

NODES = 5
CARD_MEM = 16000
SPLIT = 4


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as s:
        yield s


def usage_from_api(api: FakeApiServer) -> dict[str, list[int]]:
    """card uuid -> [slots, MiB, percent] summed over every live pod of ours, from its annotations."""
    usage: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for pod in api.store.list("pods"):
        annos = pod["metadata"].get("annotations") or {}
        if pod["spec"].get("schedulerName") != "hami-scheduler" or A.NVIDIA_ALLOCATED not in annos:
            continue
        if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            continue
        for container in A.decode_pod_devices(annos[A.NVIDIA_ALLOCATED]):
            for d in container:
                u = usage[d.uuid]
                u[0] += 1
                u[1] += d.usedmem
                u[2] += d.usedcores
    return usage


@pytest.mark.parametrize("seed", [1, 2])
async def test_concurrent_filters_and_binds_never_overcommit_a_card(
    fake_apiserver, session, seed: int
) -> None:
    api = fake_apiserver
    for i in range(NODES):
        api.store.create("nodes", gpu_node(f"node{i}", cards(f"n{i}", 2, mem=CARD_MEM, count=SPLIT)))
    server = await start_extender(api)
    await wait_ready(server)
    rng = random.Random(seed)
    names = [f"node{i}" for i in range(NODES)]
    outcome: dict[str, str] = {}

    async def client(cid: int, count: int) -> None:
        sched = Scheduler(session, server.url, cache_capable=bool(cid % 2))
        for k in range(count):
            spec = gpu_pod(
                f"c{cid}-p{k}",
                gpus=rng.choice((1, 1, 1, 2)),
                mem=rng.choice((1000, 2000, 4000, 6000, 9000)),
                cores=rng.choice((0, 10, 25, 40, 60)),
            )
            pod = create_pod(api, spec)
            nodes = [api.store.get("nodes", n) for n in names] if not sched.cache_capable else names
            outcome[pod["metadata"]["name"]] = "gave up"
            for _attempt in range(4):
                result = await sched.filter(pod, nodes)
                assert result["Error"] == "", result
                chosen = Scheduler.chosen(result)
                assert set(chosen) <= set(names) and len(chosen) <= 1
                assert set(result["FailedNodes"]) | set(chosen) == set(names)
                if not chosen:
                    outcome[pod["metadata"]["name"]] = "unschedulable"
                    break
                bound = await sched.bind(pod, chosen[0])
                if bound["Error"] == "":
                    outcome[pod["metadata"]["name"]] = "bound"
                    await asyncio.sleep(rng.random() * 0.01)
                    dp_allocated(api, pod, chosen[0])
                    if rng.random() < 0.2:
                        api.store.delete("pods", pod["metadata"]["name"], namespace="default")
                    break
                await asyncio.sleep(0.005)  # kube-scheduler's backoff, shortened
            # Property at every step, not only at the end.
            for uuid, (slots, mem, cores) in usage_from_api(api).items():
                assert slots <= SPLIT and mem <= CARD_MEM and cores <= 100, (uuid, slots, mem, cores)

    try:
        await asyncio.gather(*(client(c, 12) for c in range(10)))
        # The cluster (40 slots, 160000 MiB) fills up: many pods bound, the rest unschedulable.
        assert len(outcome) == 120
        assert list(outcome.values()).count("bound") >= 20
        assert list(outcome.values()).count("unschedulable") >= 15
        final = usage_from_api(api)
        for uuid, (slots, mem, cores) in final.items():
            assert slots <= SPLIT and mem <= CARD_MEM and cores <= 100, (uuid, slots, mem, cores)
        # The extender's counters converge to what the annotations say (no phantom, no lost usage).
        expected = {}
        for i in range(NODES):
            per_node = {u: tuple(v) for u, v in final.items() if u.startswith(f"GPU-n{i}-") and any(v)}
            expected[f"node{i}"] = per_node
        try:
            await eventually(lambda: server.state.usage_snapshot() == expected, timeout_s=10, what="usage")
        except AssertionError:
            got = server.state.usage_snapshot()
            diff = {n: (got.get(n), expected.get(n)) for n in expected if got.get(n) != expected.get(n)}
            raise AssertionError(f"extender usage != annotations: {diff}") from None
    finally:
        await server.stop()
