"""A node agent that writes a broken registration spoils only its own node.

Through the real extender against the in-memory API server: a deeply nested 2 kB registration, card
ids holding HAMi's wire separators, and readiness after a rebuild that could not finish.
"""

from __future__ import annotations

from hami import annotations as A
from kubefakes.apiserver import FakeApiServer
from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready


def _placed(api: FakeApiServer, name: str, node: str, card: str, mem: int) -> dict:
    """A Running pod placed by the extender on `card` of `node` with `mem` MiB (as after Allocate)."""
    pod = gpu_pod(name, mem=mem, cores=10)
    value = A.encode_pod_devices([[A.ContainerDevice(card, "NVIDIA", mem, 10)]])
    pod["metadata"]["annotations"].update(
        {
            A.ASSIGNED_NODE: node,
            A.NVIDIA_ALLOCATED: value,
            A.NVIDIA_TO_ALLOCATE: ";",
            A.BIND_PHASE: "success",
        }
    )
    pod["spec"]["nodeName"] = node
    pod["status"] = {"phase": "Running"}
    return api.store.create("pods", pod)


async def test_a_deeply_nested_registration_spoils_only_its_node(
    fake_apiserver: FakeApiServer, session
) -> None:
    api = fake_apiserver
    bad = gpu_node("a-bad", cards("x", 1, mem=40000))
    bad["metadata"]["annotations"][A.NVIDIA_REGISTER] = "[" * 1000 + "]" * 1000  # 2 kB
    api.store.create("nodes", bad)
    api.store.create("nodes", gpu_node("b-good", cards("g", 1, mem=40000)))
    api.store.create("nodes", gpu_node("c-later", cards("l", 1, mem=40000)))
    _placed(api, "holder", "b-good", "GPU-g-0", 30000)
    server = await start_extender(api)
    try:
        await wait_ready(server)
        async with session.get(f"{server.url}/readyz") as r:
            assert r.status == 200
        # Every other node was rebuilt, with the running pod's usage counted.
        assert server.state.node_unusable_reason("b-good") is None
        assert server.state.node_unusable_reason("c-later") is None
        reason = server.state.node_unusable_reason("a-bad")
        assert reason is not None and "nested deeper than" in reason, reason
        sched = Scheduler(session, server.url)
        result = await sched.filter(
            create_pod(api, gpu_pod("next", mem=30000, cores=10)), ["a-bad", "b-good"]
        )
        assert result["NodeNames"] == [], result  # b-good's card holds 30000 of 40000 MiB already
        assert "CardInsufficientMemory" in result["FailedNodes"]["b-good"]

        # The operator is told which node: a Warning event on it, a metric, a log line.
        def bad_events() -> list[dict]:
            return [
                e
                for e in api.store.list("events")
                if e["involvedObject"].get("kind") == "Node" and e["involvedObject"].get("name") == "a-bad"
            ]

        await eventually(lambda: bad_events(), what="an event on node a-bad")
        event = bad_events()[0]
        assert event["type"] == "Warning" and event["reason"] == "InvalidRegistration"
        assert A.NVIDIA_REGISTER in event["message"] and "nested deeper than" in event["message"]
        async with session.get(f"{server.url}/metrics") as r:
            text = await r.text()
        assert 'hami_node_registration_invalid{node="a-bad"} 1.0' in text
        assert 'hami_node_registration_invalid{node="b-good"}' not in text
    finally:
        await server.stop()


def _registration(uuid: str) -> str:
    return f'[{{"id":"{uuid}","count":10,"devmem":40000,"devcore":100,"type":"NVIDIA-A100","health":true}}]'


async def test_card_ids_with_wire_separators_are_refused(fake_apiserver: FakeApiServer, session) -> None:
    api = fake_apiserver
    for name, uuid in (("n-comma", "GPU-a,b"), ("n-semi", "GPU-a;b"), ("n-space", "GPU-a b")):
        node = gpu_node(name, cards("q", 1, mem=40000))
        node["metadata"]["annotations"][A.NVIDIA_REGISTER] = _registration(uuid)
        api.store.create("nodes", node)
    server = await start_extender(api)
    try:
        await wait_ready(server)
        sched = Scheduler(session, server.url)
        result = await sched.filter(
            create_pod(api, gpu_pod("p", mem=30000, cores=10)), ["n-comma", "n-semi", "n-space"]
        )
        assert result["NodeNames"] == [], result
        for name, sep in (("n-comma", ","), ("n-semi", ";"), ("n-space", " ")):
            assert f"holds {sep!r}" in result["FailedNodes"][name], result["FailedNodes"][name]
    finally:
        await server.stop()


async def test_a_card_id_with_a_colon_is_counted_after_a_restart(
    fake_apiserver: FakeApiServer, session
) -> None:
    # PCI bus ids (HAMi's Kunlun XPU ids) hold ':', the device separator of pod device lists: a restarted
    # extender must read the running pod's usage back onto that card, not onto a card "00.0".
    api = fake_apiserver
    node = gpu_node("n-colon", cards("q", 1, mem=40000))
    node["metadata"]["annotations"][A.NVIDIA_REGISTER] = _registration("0000:1a:00.0")
    api.store.create("nodes", node)
    _placed(api, "holder", "n-colon", "0000:1a:00.0", 30000)
    server = await start_extender(api)
    try:
        await wait_ready(server)
        result = await Scheduler(session, server.url).filter(
            create_pod(api, gpu_pod("second", mem=30000, cores=10)), ["n-colon"]
        )
        assert result["NodeNames"] == [], result
        assert "CardInsufficientMemory" in result["FailedNodes"]["n-colon"]
    finally:
        await server.stop()


async def test_a_rebuild_that_failed_is_not_ready(
    fake_apiserver: FakeApiServer, session, monkeypatch
) -> None:
    api = fake_apiserver
    api.store.create("nodes", gpu_node("n1", cards("g", 1)))
    server = await start_extender(api)
    try:
        await wait_ready(server)
        real = server.state.rebuild

        def broken(*args, **kwargs):  # a bug anywhere in the rebuild, not one bad object
            raise RuntimeError("rebuild bug")

        monkeypatch.setattr(server.state, "rebuild", broken)
        server.runtime.sync.pods.resync()
        await eventually(lambda: server.runtime.sync.pods.synced, what="pods listed again")
        async with session.get(f"{server.url}/readyz") as r:
            assert r.status == 503
            assert "rebuild" in await r.text()
        monkeypatch.setattr(server.state, "rebuild", real)
        server.runtime.sync.pods.resync()
        await wait_ready(server)
    finally:
        await server.stop()
