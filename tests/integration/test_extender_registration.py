"""Node registration through the real extender: stale handshakes never keep a live node out (user bug log
R01), an unanswered handshake on a node that advertises nothing does, a malformed registration marks the
node unusable with its reason, and the active replica stamps ``Requesting_<time>``."""

from __future__ import annotations

import asyncio

from hami import annotations as A
from kubefakes.apiserver import FakeApiServer
from tests.builders import cards, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready


async def test_handshakes_and_malformed_registrations(fake_apiserver: FakeApiServer, session) -> None:
    api = fake_apiserver
    api.store.create(
        "nodes", gpu_node("stale", cards("s", 2), extra={A.NVIDIA_HANDSHAKE: "Deleted_2024-01-01 00:00:00"})
    )
    dead = gpu_node("dead", cards("d", 2), extra={A.NVIDIA_HANDSHAKE: "Requesting_2024-01-01 00:00:00"})
    del dead["status"]["allocatable"]["nvidia.com/gpu"]
    api.store.create("nodes", dead)
    broken = gpu_node("broken", cards("b", 2))
    broken["metadata"]["annotations"][A.NVIDIA_REGISTER] = '[{"id": "GPU-x", "devmem": "lots"}]'
    api.store.create("nodes", broken)
    # Liveness on (a non-zero interval), but no periodic pass within the test: it calls the pass itself.
    server = await start_extender(api, "--register-interval", "1h")
    try:
        await wait_ready(server)
        sched = Scheduler(session, server.url)
        pod = create_pod(api, gpu_pod("p", mem=1000, cores=10))
        result = await sched.filter(pod, ["dead", "broken", "stale"])
        assert result["NodeNames"] == ["stale"], result
        assert result["FailedNodes"]["broken"] == (
            "hami.io/node-nvidia-register: device 0 (GPU-x): field 'devmem' must be an integer, got 'lots'"
        )
        dead_reason = result["FailedNodes"]["dead"]
        assert dead_reason.startswith(
            "device plugin did not answer hami.io/node-handshake=Requesting_2024-01-01 00:00:00 for "
        )
        assert dead_reason.endswith(
            " s and kubelet advertises no nvidia.com/gpu (check the device plugin pod on this node)"
        )

        # The liveness pass of the active replica stamps every node whose value is not a Requesting stamp.
        stamped = await asyncio.to_thread(server.runtime.sync.register_pass)
        assert stamped == 2  # stale and broken; dead already holds a (stale) Requesting stamp
        value = api.store.get("nodes", "stale")["metadata"]["annotations"][A.NVIDIA_HANDSHAKE]
        assert A.decode_handshake(value).state == "Requesting" and A.decode_handshake(value).time is not None
        # The device plugin comes back on "dead": kubelet advertises its cards again -> usable at once.
        api.store.patch(
            "nodes", "dead", {"status": {"allocatable": {"nvidia.com/gpu": "20"}}}, subresource="status"
        )
        await eventually(lambda: server.state.node_unusable_reason("dead") is None, what="dead node back")
        again = await sched.filter(create_pod(api, gpu_pod("q", mem=1000, cores=10)), ["dead"])
        assert again["NodeNames"] == ["dead"]
    finally:
        await server.stop()


async def test_register_interval_zero_turns_node_liveness_off(fake_apiserver: FakeApiServer, session) -> None:
    # `--register-interval 0` (the harness's setting): no liveness verdicts and no stamps, so a node whose
    # handshake went unanswered and that advertises no nvidia.com/gpu is still a candidate.
    api = fake_apiserver
    dead = gpu_node("dead", cards("d"), extra={A.NVIDIA_HANDSHAKE: "Requesting_2024-01-01 00:00:00"})
    del dead["status"]["allocatable"]["nvidia.com/gpu"]
    api.store.create("nodes", dead)
    server = await start_extender(api, "--register-interval", "0")
    try:
        await wait_ready(server)
        assert server.state.node_unusable_reason("dead") is None
        result = await Scheduler(session, server.url).filter(
            create_pod(api, gpu_pod("p", mem=1000)), ["dead"]
        )
        assert result["NodeNames"] == ["dead"], result
        stored = api.store.get("nodes", "dead")["metadata"]["annotations"]
        assert stored[A.NVIDIA_HANDSHAKE] == "Requesting_2024-01-01 00:00:00"
    finally:
        await server.stop()
