"""Property: whatever the interleaving of bind, node-lock expiry, lock takeover, Allocate and pod
deletion, every Allocate answer carries exactly the limits the scheduler decided for the pod kubelet is
admitting (HAMi#3096: an expired lock handed to the next pod gave two pods each other's limits).

Real servers: the in-memory API server, the real device plugin (fake backend, two cards) and the fake
kubelet. Binds are made as the extender makes them (pod annotations, `hami.nodelock.lock_node` with its
allocation stamp, the Binding with bind-phase ``allocating``). kubelet's Allocate names no pod, so the
test's model knows which pod kubelet is admitting; the plugin may refuse (kubelet then fails that pod's
admission), but an answer it gives must be that pod's. And it must answer the only pod between Bind
and Allocate that holds the lock, so the property is not met by refusing everything.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from device_plugin.app import DevicePluginApp, PluginOptions
from device_plugin.backends.fake import FakeBackend
from hami import annotations as ann
from hami.errors import NodeLockContention
from hami.kube import KubeClient
from hami.model import ContainerDevice
from hami.nodelock import lock_node
from kubefakes.apiserver import FakeApiServer
from kubefakes.kubelet import AdmissionError, FakeKubelet, env_of

RESOURCE = "nvidia.com/gpu"
NODE = "node1"
CARDS = ["GPU-aaaa", "GPU-bbbb"]
EXPIRY_S = 300.0
PODS = 4

OPS = st.lists(
    st.tuples(st.sampled_from(["bind", "expire", "allocate", "delete"]), st.integers(0, PODS - 1)),
    min_size=1,
    max_size=14,
)


@dataclass
class Model:
    """What the test knows: each pod's decided limits, and where it stands."""

    decided: dict[int, tuple[str, int, int]] = field(default_factory=dict)  # pod -> (card, MiB, %)
    bound: set[int] = field(default_factory=set)  # bound to the node, Allocate not yet answered
    done: set[int] = field(default_factory=set)  # served, failed or deleted: kubelet asks no more
    created: set[int] = field(default_factory=set)
    holder: int | None = None  # who the node lock names (as the model's binds left it)
    served: int = 0


def _name(i: int) -> str:
    return f"p{i}"


def _decision(i: int) -> tuple[str, int, int]:
    return CARDS[i % 2], 1000 + 100 * i, 10 + i


def _bind(api: FakeApiServer, kube: KubeClient, model: Model, i: int) -> None:
    card, mem, cores = _decision(i)
    entry = [ContainerDevice(card, "NVIDIA", mem, cores)]
    value = ann.encode_pod_devices([entry])
    limits = {RESOURCE: "1", "nvidia.com/gpumem": str(mem), "nvidia.com/gpucores": str(cores)}
    pod = api.store.create(
        "pods",
        {
            "metadata": {
                "name": _name(i),
                "namespace": "default",
                "annotations": {
                    ann.ASSIGNED_NODE: NODE,
                    ann.ASSIGNED_TIME: str(int(time.time())),
                    ann.NVIDIA_TO_ALLOCATE: value,
                    ann.NVIDIA_ALLOCATED: value,
                },
            },
            "spec": {
                "schedulerName": "hami-scheduler",
                "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}],
            },
        },
        keep_status=False,
    )
    model.created.add(i)
    model.decided[i] = (card, mem, cores)
    uid = pod["metadata"]["uid"]
    stamp = ann.encode_allocation_stamp(uid, {ann.NVIDIA_ALLOCATED: value})
    try:
        lock_node(kube, NODE, namespace="default", pod_name=_name(i), uid=uid, expiry_s=EXPIRY_S, stamp=stamp)
    except NodeLockContention:
        return  # the extender's bind fails; the pod stays unbound and is filtered again later
    kube.bind_pod(
        "default", _name(i), uid=uid, node=NODE,
        annotations={ann.BIND_PHASE: "allocating", ann.BIND_TIME: str(int(time.time()))},
    )  # fmt: skip
    model.bound.add(i)
    model.holder = i


def _expire(api: FakeApiServer) -> None:
    """The lock's holder is still waiting for kubelet, but its lock is now older than the expiry."""
    node = api.store.get("nodes", NODE)
    value = (node["metadata"].get("annotations") or {}).get(ann.NODE_LOCK)
    if not value:
        return
    lock = ann.decode_node_lock(value)
    old = ann.NodeLock(datetime.now(UTC) - timedelta(seconds=EXPIRY_S + 60), lock.namespace, lock.name)
    api.store.patch("nodes", NODE, {"metadata": {"annotations": {ann.NODE_LOCK: ann.encode_node_lock(old)}}})


def _lock_holder(api: FakeApiServer) -> str | None:
    value = (api.store.get("nodes", NODE)["metadata"].get("annotations") or {}).get(ann.NODE_LOCK)
    return ann.decode_node_lock(value).name if value else None


async def _allocate(api: FakeApiServer, kubelet: FakeKubelet, model: Model, i: int) -> None:
    in_flight = model.bound - model.done
    only_holder = in_flight == {i} and _lock_holder(api) == _name(i)
    try:
        _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    except AdmissionError as e:
        assert not only_holder, f"{_name(i)} holds the lock alone and was refused: {e}"
        # kubelet fails the pod's admission: it ends, and asks nothing more for it.
        api.store.set_pod_phase("default", _name(i), "Failed")
        model.done.add(i)
        return
    env = env_of(resp)
    card, mem, cores = model.decided[i]
    got = (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"])
    assert got == (card, f"{mem}m", str(cores)), (
        f"{_name(i)} was admitted with {got}, decided {model.decided[i]}"
    )
    model.done.add(i)
    model.served += 1


async def _scenario(ops: list[tuple[str, int]]) -> None:
    with FakeApiServer() as api, tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        api.store.create("nodes", {"metadata": {"name": NODE}, "status": {"nodeInfo": {"bootID": "b1"}}})
        kube = KubeClient.from_kubeconfig(api.kubeconfig_path, retries=1, retry_initial_wait_s=0.01)
        vgpu = root / "hook" / "vgpu"
        vgpu.mkdir(parents=True)
        (vgpu / "libvgpu.so").write_text("fake library")
        (vgpu / "ld.so.preload").write_text(f"{vgpu}/libvgpu.so\n")
        cards = [{"uuid": u, "index": n, "model": "A100", "memory_mib": 40000} for n, u in enumerate(CARDS)]
        (root / "cards.yaml").write_text(yaml.safe_dump({"cards": cards}))
        kubelet = FakeKubelet(root / "device-plugins")
        await kubelet.start()
        app = DevicePluginApp(
            PluginOptions(node_name=NODE, socket_dir=str(kubelet.socket_dir), hook_path=str(root / "hook"),
                          register_interval_s=60),
            FakeBackend(root / "cards.yaml", poll_s=60), kube,
        )  # fmt: skip
        await app.start()
        try:
            await kubelet.wait_registered(RESOURCE)
            model = Model()
            for op, i in ops:
                if op == "bind" and i not in model.created:
                    await asyncio.to_thread(_bind, api, kube, model, i)
                elif op == "expire":
                    _expire(api)
                elif op == "allocate" and i in model.bound and i not in model.done:
                    await _allocate(api, kubelet, model, i)
                elif op == "delete" and i in model.created and i not in model.done:
                    api.store.delete("pods", _name(i), namespace="default")
                    model.done.add(i)
                    model.bound.discard(i)
            # Whatever happened, a fresh pod bound now on its own is served its own limits.
            for j in list(model.bound - model.done):
                api.store.delete("pods", _name(j), namespace="default")
                model.done.add(j)
            fresh = PODS
            await asyncio.to_thread(_expire, api)
            await asyncio.to_thread(_bind, api, kube, model, fresh)
            assert fresh in model.bound
            await _allocate(api, kubelet, model, fresh)
            assert model.served >= 1
        finally:
            await app.stop()
            await kubelet.stop()
            kube.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS)
# HAMi#3096 itself: p0's lock expires before kubelet admits it, p1's bind takes the lock over.
@example(ops=[("bind", 0), ("expire", 0), ("bind", 1), ("allocate", 0), ("allocate", 1)])
@example(ops=[("bind", 0), ("expire", 0), ("bind", 1), ("allocate", 1), ("allocate", 0)])
# The holder is deleted between Bind and Allocate, the next pod binds at once.
@example(ops=[("bind", 0), ("delete", 0), ("bind", 1), ("allocate", 1)])
def test_every_allocate_answer_is_the_admitted_pods_decision(ops: list[tuple[str, int]]) -> None:
    asyncio.run(_scenario(ops))
