"""The extender with `fragmentation` as its default node and card policy, against the in-memory API server:
a burst of mixed pods (shares, whole cards, two-card pods) from concurrent clients never over-commits a
card (checked on the annotations, the truth a device plugin reads), and the chosen policy's score terms
are logged at debug level."""

from __future__ import annotations

import asyncio
import logging
import random

import aiohttp

from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, dp_allocated, start_extender, wait_ready
from tests.integration.test_extender_burst import usage_from_api

NODES = 4
CARD_MEM = 16000
SPLIT = 4


async def test_fragmentation_default_policy_places_a_mixed_burst_without_overcommit(
    fake_apiserver, tmp_path, caplog
) -> None:
    api = fake_apiserver
    for i in range(NODES):
        api.store.create("nodes", gpu_node(f"node{i}", cards(f"n{i}", 2, mem=CARD_MEM, count=SPLIT)))
    config = tmp_path / "device-config.yaml"
    config.write_text("scheduler:\n  nodeSchedulerPolicy: fragmentation\n  gpuSchedulerPolicy: fragmentation\n")
    caplog.set_level(logging.DEBUG, logger="hami.cluster")
    server = await start_extender(api, "--config", str(config))
    await wait_ready(server)
    assert server.state.config.scheduler.nodeSchedulerPolicy == "fragmentation"
    rng = random.Random(5)
    names = [f"node{i}" for i in range(NODES)]
    bound: list[str] = []
    try:
        async with aiohttp.ClientSession() as session:

            async def client(cid: int) -> None:
                sched = Scheduler(session, server.url, cache_capable=True)
                for k in range(8):
                    gpus, mem, cores = rng.choice(
                        ((1, 4000, 25), (1, 8000, 50), (1, 16000, 100), (2, 6000, 30), (1, 2000, 10))
                    )
                    pod = create_pod(api, gpu_pod(f"c{cid}-p{k}", gpus=gpus, mem=mem, cores=cores))
                    result = await sched.filter(pod, names)
                    assert result["Error"] == "", result
                    chosen = Scheduler.chosen(result)
                    if chosen and (await sched.bind(pod, chosen[0]))["Error"] == "":
                        dp_allocated(api, pod, chosen[0])
                        bound.append(pod["metadata"]["name"])
                    for uuid, (slots, m, c) in usage_from_api(api).items():
                        assert slots <= SPLIT and m <= CARD_MEM and c <= 100, (uuid, slots, m, c)

            await asyncio.gather(*(client(c) for c in range(4)))
        # 8 cards of 16000 MiB: the burst (32 pods, about 240000 MiB asked) fills them; some are refused.
        assert 8 <= len(bound) < 32
        used = usage_from_api(api)
        assert sum(m for _, m, _ in used.values()) > 0.7 * 8 * CARD_MEM
        terms = [r.getMessage() for r in caplog.records if "expected fragmentation" in r.getMessage()]
        assert len(terms) >= len(bound)
        assert "policy node=fragmentation cards=fragmentation" in terms[0] and "increase" in terms[0]
    finally:
        await server.stop()
