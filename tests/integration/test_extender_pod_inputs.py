"""What a pod owner writes on its own pod cannot stall the extender for everyone else.

The real extender against the in-memory API server. A filter decides under the state's lock, so its
cost is every other pod's wait: a pod's selection annotations (use/nouse lists of card types and
UUIDs, which the owner may also change after creation) are checked against every card of every
candidate node, and were unbounded.
"""

from __future__ import annotations

from kubefakes.apiserver import FakeApiServer
from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, start_extender, wait_ready


async def test_selection_lists_longer_than_the_limit_are_the_pods_error(
    fake_apiserver: FakeApiServer, session
) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("n1", cards("g", 2, mem=40000)))
    server = await start_extender(api)
    try:
        await wait_ready(server)
        sched = Scheduler(session, server.url)
        many = ",".join(f"m{i}" for i in range(25000))  # 150 KiB: under the API server's limit
        for key in ("nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid"):
            pod = create_pod(api, gpu_pod(f"p-{key.rsplit('/', 1)[1]}", mem=1000, annotations={key: many}))
            result = await sched.filter(pod, ["n1"])
            assert result["NodeNames"] is None or result["NodeNames"] == [], result
            assert key in result["Error"] and "25000 entries" in result["Error"], result
            assert "at most 64" in result["Error"], result
        # 64 entries are still read, and the one that names the card's model selects it.
        fits = ",".join([*(f"model-{i}" for i in range(63)), "V100"])
        pod = create_pod(api, gpu_pod("typed", mem=1000, annotations={"nvidia.com/use-gputype": fits}))
        assert Scheduler.chosen(await sched.filter(pod, ["n1"])) == ["n1"]
        # The extender goes on serving the others.
        assert Scheduler.chosen(await sched.filter(create_pod(api, gpu_pod("plain", mem=1000)), ["n1"])) == [
            "n1"
        ]
    finally:
        await server.stop()
