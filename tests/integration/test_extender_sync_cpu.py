"""The extender's pod sync counts the CPU of pods other schedulers bind to a node.

The fragmentation policy judges a node's free CPU (kube-scheduler refuses a pod that does not fit it),
so a pod of ``default-scheduler`` that is bound later (``spec.nodeName`` set by its Binding) must reach
ClusterState: the sync's change filter has to see ``spec.nodeName``.
"""

from __future__ import annotations

import pytest

from kubefakes.apiserver import FakeApiServer
from tests.builders import cards, gpu_node
from tests.integration.extender_harness import eventually, start_extender, wait_ready


@pytest.fixture
async def extender(fake_apiserver: FakeApiServer):
    fake_apiserver.store.create("nodes", gpu_node("node1", cards("n1", 1)))
    server = await start_extender(fake_apiserver)
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


async def test_a_cpu_pod_bound_by_another_scheduler_is_counted_on_its_node(fake_apiserver, extender) -> None:
    api = fake_apiserver
    pod = {
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {
            "schedulerName": "default-scheduler",
            "containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": "1500m"}}}],
        },
    }
    api.store.create("pods", pod)
    node = extender.state._nodes["node1"]
    assert node.cpu_used == 0
    api.store.do_bind("default", "web", {"metadata": {"name": "web"}, "target": {"kind": "Node", "name": "node1"}})
    await eventually(lambda: node.cpu_used == 1500, what="the bound pod's CPU counted on node1")
