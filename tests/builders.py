"""Builders of the objects tests feed the code: cards (`Device`), Nodes and Pods in the API's JSON form.

One module for the whole suite. Two shapes of each object exist because the tests need both:

* as the core reads them (``node``, ``pod``, ``ctr``): only the fields the rules look at; ``pod`` gets a
  fresh uid and name on every call;
* as an API server stores them (``make_node``, ``make_pod``, ``gpu_node``, ``gpu_pod``): labels,
  status, capacity and allocatable, conditions, so the official client and the extender accept them.

Memory is in MiB, cores in percent of one card, as HAMi's resources count them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from hami import annotations as A
from hami.model import Device
from hami.registration import encode_node_devices_json

V100 = "NVIDIA-Tesla V100-PCIE-32GB"
# Real-looking NVIDIA UUIDs (the format nvidia-smi prints), for tests that show them in annotations.
UUID_A = "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec"
UUID_B = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"

_uid = itertools.count()

# Short names `ctr` accepts for HAMi's NVIDIA resources.
_LIMIT_KEYS = {
    "gpu": "nvidia.com/gpu",
    "mem": "nvidia.com/gpumem",
    "pct": "nvidia.com/gpumem-percentage",
    "cores": "nvidia.com/gpucores",
}


# -- cards ----------------------------------------------------------------------------------------


def cards(
    prefix: str,
    n: int = 4,
    *,
    mem: int = 32768,
    count: int = 10,
    type: str = V100,
    numa: Sequence[int] | None = None,
    **kw: Any,
) -> list[Device]:
    """`n` cards ``GPU-<prefix>-<i>`` (index i) of `mem` MiB, 100 cores, `count` shares each.

    `numa` gives each card's NUMA node (default 0); `kw` goes to `Device` (e.g. ``health=False``).
    """
    return [
        Device(f"GPU-{prefix}-{i}", i, count, mem, 100, type, numa[i] if numa else 0, **kw) for i in range(n)
    ]


# -- objects as the core reads them ---------------------------------------------------------------


def node(name: str, devices: list[Device] | None = None, **annotations: str) -> dict[str, Any]:
    """A Node with HAMi's NVIDIA registration annotation for `devices` (default: 4 `cards`) and `annotations`."""
    devices = cards(name) if devices is None else devices
    annos = {A.NVIDIA_REGISTER: encode_node_devices_json(devices), **annotations}
    return {"metadata": {"name": name, "annotations": annos}}


def ctr(name: str = "c", **limits: Any) -> dict[str, Any]:
    """A container with resource limits; ``gpu``, ``mem``, ``pct``, ``cores`` stand for HAMi's NVIDIA names.

    ``ctr(gpu=1, mem=8000)`` limits ``nvidia.com/gpu: "1"`` and ``nvidia.com/gpumem: "8000"``; other
    keys are used as they are (values are stringified).
    """
    return {"name": name, "resources": {"limits": {_LIMIT_KEYS.get(k, k): str(v) for k, v in limits.items()}}}


def pod(
    *containers: dict[str, Any],
    init: Sequence[dict[str, Any]] = (),
    name: str | None = None,
    ns: str = "default",
    annotations: Mapping[str, str] | None = None,
    uid: str | None = None,
    scheduler: str = "hami-scheduler",
) -> dict[str, Any]:
    """A Pod of `containers` (default one ``ctr(gpu=1)``) and `init` containers; uid and name are fresh."""
    n = next(_uid)
    p: dict[str, Any] = {
        "metadata": {
            "uid": uid or f"uid-{n}",
            "name": name or f"pod-{n}",
            "namespace": ns,
            "annotations": dict(annotations or {}),
        },
        "spec": {"schedulerName": scheduler, "containers": list(containers) or [ctr(gpu=1)]},
    }
    if init:
        p["spec"]["initContainers"] = list(init)
    return p


# -- objects as an API server stores them ---------------------------------------------------------


def make_node(
    name: str,
    *,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A Node as kubelet registers it (Ready, with capacity = allocatable; default 8 CPUs, 32Gi, 110 pods)."""
    resources = dict(allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"})
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def make_pod(
    name: str,
    namespace: str = "default",
    *,
    node_name: str | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    scheduler_name: str = "hami-scheduler",
    limits: Sequence[Mapping[str, str]] = ({"nvidia.com/gpu": "1"},),
    phase: str = "Pending",
) -> dict[str, Any]:
    """A Pod with one container per entry of `limits` (container names c0, c1, ...)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "containers": [
            {"name": f"c{i}", "image": "busybox", "resources": {"limits": dict(lim)}}
            for i, lim in enumerate(limits)
        ],
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": dict(labels or {}),
            "annotations": dict(annotations or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def gpu_node(
    name: str, devices: Sequence[Device], *, extra: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Node registered by the NVIDIA device plugin: registration annotation + allocatable nvidia.com/gpu.

    Allocatable ``nvidia.com/gpu`` is the sum of the cards' shares; `extra` adds annotations.
    """
    slots = sum(d.count for d in devices)
    res = {"cpu": "64", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(slots)}
    return {
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name},
            "annotations": {A.NVIDIA_REGISTER: encode_node_devices_json(devices), **(extra or {})},
        },
        "spec": {},
        "status": {"capacity": res, "allocatable": res, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def gpu_pod(
    name: str,
    namespace: str = "default",
    *,
    gpus: int = 1,
    mem: int | None = 8000,
    cores: int | None = 10,
    scheduler: str = "hami-scheduler",
    annotations: Mapping[str, str] | None = None,
    containers: int = 1,
) -> dict[str, Any]:
    """A pod whose containers each ask `gpus` cards of `mem` MiB and `cores` percent (webhook already ran)."""
    limits: dict[str, str] = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    if gpus and mem is not None:
        limits["nvidia.com/gpumem"] = str(mem)
    if gpus and cores is not None:
        limits["nvidia.com/gpucores"] = str(cores)
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {
                    "name": f"c{i}",
                    "image": "cuda",
                    "resources": {"limits": dict(limits), "requests": dict(limits)},
                }
                for i in range(containers)
            ],
        },
    }
