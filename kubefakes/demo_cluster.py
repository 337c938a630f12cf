"""A realistic small GPU cluster to seed the in-memory API server with, for the operator tools' tests and
the examples in docs/operations.md.

Seven nodes, three card models, every state an operator meets:

* ``gpu-a100-1``: 4 x A100 80 GB (NUMA 0,0,1,1), a 2-card training pod and an inference pod sharing card 0,
  card 3 cordoned through ``hami.io/device-cordon``;
* ``gpu-a100-2``: 4 x A100 80 GB, one inference pod per card, its node lock held for 130 s by one being bound;
* ``gpu-v100-1``: 4 x V100 32 GB, a whole-card pod on every card but one, small sharers on two;
* ``gpu-v100-2``: 4 x V100 32 GB, cordoned by ``kubectl cordon`` (``spec.unschedulable``);
* ``gpu-t4-1``: 1 x T4 16 GB split 4, three notebooks sharing it;
* ``gpu-t4-2``: 1 x T4, unhealthy: kubelet advertises ``nvidia.com/gpu: 0`` (device plugin gone);
* ``cpu-1``: no GPU registration at all;

a ResourceQuota ``limits.nvidia.com/gpumem: 24000`` in namespace ``team-a`` (16000 MiB used), pending pods
that each fail for a different reason, and the Helm chart's device ConfigMap
``hami-system/hami-scheduler-device`` (what `hami inspect` and `hami explain` read the cluster with).
Every timestamp is relative to `now`, so a report made at `now`
is the same on every run. Pure data: no I/O.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hami import annotations as A
from hami.model import ContainerDevice, Device
from hami.registration import encode_node_devices_json

A100 = "NVIDIA-A100-SXM4-80GB"
V100 = "NVIDIA-Tesla V100-PCIE-32GB"
T4 = "NVIDIA-Tesla T4"
SCHEDULER = "hami-scheduler"
#: The clock the examples in docs/operations.md are made at.
DEMO_NOW = datetime(2026, 5, 4, 10, 0, 0, tzinfo=UTC)
#: The chart's device-config.yaml with its default values, as the release "hami" in "hami-system" writes it.
DEVICE_CONFIG = """\
nvidia:
  resourceCountName: "nvidia.com/gpu"
  resourceMemoryName: "nvidia.com/gpumem"
  resourceMemoryPercentageName: "nvidia.com/gpumem-percentage"
  resourceCoreName: "nvidia.com/gpucores"
  resourcePriorityName: "nvidia.com/priority"
  deviceSplitCount: 10
  deviceMemoryScaling: 1
  deviceCoreScaling: 1
scheduler:
  schedulerName: "hami-scheduler"
  nodeSchedulerPolicy: "binpack"
  gpuSchedulerPolicy: "spread"
  enableAscend: false
  enableIluvatar: false
"""


def device_configmap(text: str = DEVICE_CONFIG, *, namespace: str = "hami-system") -> dict[str, Any]:
    """The chart's device ConfigMap (name, namespace and label as helm/hami renders them) holding `text`."""
    return {
        "kind": "ConfigMap",
        "metadata": {
            "name": "hami-scheduler-device",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/name": "hami", "app.kubernetes.io/component": "device-config"},
        },
        "data": {"device-config.yaml": text},
    }


def cards(
    node: str, n: int, mem: int, model: str, *, count: int = 10, numa: tuple[int, ...] = (), **kw: Any
) -> list[Device]:
    """`n` cards ``GPU-<node>-<i>`` of `mem` MiB, 100 % cores, `count` shares; `numa` per card (default 0)."""
    return [
        Device(f"GPU-{node}-{i}", i, count, mem, 100, model, numa[i] if numa else 0, **kw) for i in range(n)
    ]


def node(name: str, devices: list[Device], *, now: datetime, annotations: dict[str, str] | None = None,
          gpus: int | None = None, unschedulable: bool = False) -> dict[str, Any]:  # fmt: skip
    """A Node as kubelet and the NVIDIA device plugin leave it: registration and a Reported handshake, allocatable
    ``nvidia.com/gpu`` = the cards' shares (or `gpus`), InternalIP 127.0.0.1; `unschedulable` = kubectl cordon."""
    annos = {A.NVIDIA_REGISTER: encode_node_devices_json(devices)} if devices else {}
    if devices:
        # In UTC, so the examples read the same on every machine (a Reported_ stamp is never judged by age).
        stamp = now.astimezone(UTC).replace(tzinfo=None)
        annos[A.NVIDIA_HANDSHAKE] = A.encode_handshake(A.HANDSHAKE_REPORTED, stamp)
    annos.update(annotations or {})
    res = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    if devices:
        res["nvidia.com/gpu"] = str(sum(d.count for d in devices) if gpus is None else gpus)
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": annos},
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": res,
            "allocatable": res,
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        },
    }


def limits(gpu: int, mem: int | None, cores: int | None) -> dict[str, str]:
    """HAMi's NVIDIA limits: `gpu` cards, `mem` MiB (``nvidia.com/gpumem``), `cores` percent; None leaves one out."""
    out = {"nvidia.com/gpu": str(gpu)}
    if mem is not None:
        out["nvidia.com/gpumem"] = str(mem)
    if cores is not None:
        out["nvidia.com/gpucores"] = str(cores)
    return out


def pod(
    namespace: str,
    name: str,
    containers: list[tuple[str, dict[str, str]]],
    *,
    node: str | None = None,
    cards: list[list[tuple[str, int, int]]] | None = None,
    phase: str = "Running",
    annotations: dict[str, str] | None = None,
    now: datetime = DEMO_NOW,
    bind_phase: str = "success",
) -> dict[str, Any]:
    """A pod of `containers` ((name, limits)); placed on `node` with `cards` per container
    ([(uuid, MiB, cores)]) as the extender and the device plugin leave it, else Pending."""
    annos = dict(annotations or {})
    if node is not None and cards is not None:
        lists = [[ContainerDevice(u, "NVIDIA", m, c) for u, m, c in per] for per in cards]
        enc = A.encode_pod_devices(lists)
        annos.update({
            A.ASSIGNED_NODE: node,
            A.ASSIGNED_TIME: str(int((now - timedelta(hours=1)).timestamp())),
            A.NVIDIA_ALLOCATED: enc,
            A.NVIDIA_TO_ALLOCATE: enc if bind_phase != "success" else A.encode_pod_devices([[] for _ in lists]),
            A.BIND_PHASE: bind_phase,
        })  # fmt: skip
    spec: dict[str, Any] = {
        "schedulerName": SCHEDULER,
        "containers": [
            {"name": n, "image": "cuda:12", "resources": {"limits": dict(lim), "requests": dict(lim)}}
            for n, lim in containers
        ],
    }
    if node is not None and bind_phase == "success":
        spec["nodeName"] = node
    return {
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "annotations": annos,
        },
        "spec": spec,
        "status": {"phase": phase if node is not None and bind_phase == "success" else "Pending"},
    }


def demo_objects(now: datetime = DEMO_NOW) -> list[dict[str, Any]]:
    """Every object of the demo cluster (Namespaces, the device ConfigMap, Nodes, Pods, the ResourceQuota), in
    creation order."""
    a1 = cards("a100-1", 4, 81920, A100, numa=(0, 0, 1, 1))
    a2 = cards("a100-2", 4, 81920, A100, numa=(0, 0, 1, 1))
    v1 = cards("v100-1", 4, 32768, V100)
    v2 = cards("v100-2", 4, 32768, V100)
    t1 = cards("t4-1", 1, 15360, T4, count=4)
    t2 = cards("t4-2", 1, 15360, T4, count=4, health=False)
    lock = A.encode_node_lock(A.NodeLock(now - timedelta(seconds=130), "infer", "chat-2"))
    objs: list[dict[str, Any]] = [
        {"kind": "Namespace", "metadata": {"name": ns}}
        for ns in ("hami-system", "train", "infer", "team-a", "default")
    ]
    objs.append(device_configmap())
    objs += [
        node("gpu-a100-1", a1, now=now, annotations={A.DEVICE_CORDON: a1[3].uuid}),
        node("gpu-a100-2", a2, now=now, annotations={A.NODE_LOCK: lock}),
        node("gpu-v100-1", v1, now=now),
        node("gpu-v100-2", v2, now=now, unschedulable=True),
        node("gpu-t4-1", t1, now=now),
        node("gpu-t4-2", t2, now=now, gpus=0),
        node("cpu-1", [], now=now),
    ]
    u = {d.uuid: d for d in (*a1, *a2, *v1, *v2, *t1)}
    g = lambda key: u[key].uuid  # noqa: E731
    objs += [
        pod("train", "llm-0", [("trainer", limits(2, 40000, 50))], node="gpu-a100-1",
            cards=[[(g("GPU-a100-1-0"), 40000, 50), (g("GPU-a100-1-1"), 40000, 50)]]),
        pod("infer", "chat-0", [("server", limits(1, 20000, 30))], node="gpu-a100-1",
            cards=[[(g("GPU-a100-1-0"), 20000, 30)]]),
        pod("infer", "chat-1", [("server", limits(1, 20000, 30))], node="gpu-a100-2",
            cards=[[(g("GPU-a100-2-0"), 20000, 30)]]),
        # Being bound right now: holds the node lock, not yet through Allocate.
        pod("infer", "chat-2", [("server", limits(1, 20000, 30))], node="gpu-a100-2",
            cards=[[(g("GPU-a100-2-1"), 20000, 30)]], bind_phase="allocating"),
        pod("infer", "chat-3", [("server", limits(1, 20000, 30))], node="gpu-a100-2",
            cards=[[(g("GPU-a100-2-2"), 20000, 30)]]),
        pod("infer", "embed-0", [("server", limits(1, 20000, 30))], node="gpu-a100-2",
            cards=[[(g("GPU-a100-2-3"), 20000, 30)]]),
        pod("train", "resnet-0", [("trainer", limits(1, None, None))], node="gpu-v100-1",
            cards=[[(g("GPU-v100-1-0"), 32768, 0)]]),
        pod("train", "resnet-1", [("trainer", limits(1, None, None))], node="gpu-v100-1",
            cards=[[(g("GPU-v100-1-1"), 32768, 0)]]),
        pod("team-a", "etl-0", [("worker", limits(1, 8000, 20))], node="gpu-v100-1",
            cards=[[(g("GPU-v100-1-2"), 8000, 20)]]),
        pod("team-a", "etl-1", [("worker", limits(1, 8000, 20))], node="gpu-v100-1",
            cards=[[(g("GPU-v100-1-3"), 8000, 20)]]),
        pod("default", "notebook-0", [("lab", limits(1, 4096, 25))], node="gpu-t4-1",
            cards=[[(g("GPU-t4-1-0"), 4096, 25)]]),
        pod("default", "notebook-1", [("lab", limits(1, 4096, 25))], node="gpu-t4-1",
            cards=[[(g("GPU-t4-1-0"), 4096, 25)]]),
        pod("default", "notebook-2", [("lab", limits(1, 4096, 25))], node="gpu-t4-1",
            cards=[[(g("GPU-t4-1-0"), 4096, 25)]]),
        # Finished: holds nothing, shown nowhere.
        pod("train", "resnet-old", [("trainer", limits(1, None, None))], node="gpu-v100-1",
            cards=[[(g("GPU-v100-1-3"), 32768, 0)]], phase="Succeeded"),
    ]  # fmt: skip
    objs.append(
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "24000"}},
        }
    )
    objs += pending_pods()
    return objs


def pending_pods() -> list[dict[str, Any]]:
    """The demo's pending pods, one per way of not fitting (each explained in docs/operations.md)."""
    return [
        # No gpumem: a whole V100; every V100 has sharers.
        pod(
            "default",
            "whole-card",
            [("main", limits(1, None, None))],
            annotations={"nvidia.com/use-gputype": "V100"},
        ),
        # Two distinct cards with 70000 MiB free on one node.
        pod("default", "big-pair", [("main", limits(2, 70000, 50))]),
        # Two distinct T4s: no node has two.
        pod(
            "default",
            "t4-pair",
            [("main", limits(2, 4000, 20))],
            annotations={"nvidia.com/use-gputype": "T4"},
        ),
        # Over the namespace quota: 16000 of 24000 MiB used.
        pod("team-a", "etl-2", [("worker", limits(1, 12000, 20))]),
        # Only T4 cards, and the one healthy T4 has no 8000 MiB free.
        pod(
            "default",
            "t4-only",
            [("main", limits(1, 8000, 20))],
            annotations={"nvidia.com/use-gputype": "T4"},
        ),
    ]
