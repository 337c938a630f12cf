"""Builders for Node and Pod objects in the API's JSON form, shared by the core's unit tests."""

from __future__ import annotations

import itertools
from typing import Any

from hami import annotations as A
from hami.model import Device

_uid = itertools.count()
V100 = "NVIDIA-Tesla V100-PCIE-32GB"


def cards(
    node: str, n: int = 4, *, mem: int = 32768, count: int = 10, type: str = V100, numa=None, **kw
) -> list[Device]:
    return [
        Device(f"GPU-{node}-{i}", i, count, mem, 100, type, numa[i] if numa else 0, **kw) for i in range(n)
    ]


def node(name: str, devices: list[Device] | None = None, **annotations: str) -> dict[str, Any]:
    devices = cards(name) if devices is None else devices
    annos = {A.NVIDIA_REGISTER: A.encode_node_devices_json(devices), **annotations}
    return {"metadata": {"name": name, "annotations": annos}}


def ctr(name: str = "c", **limits: Any) -> dict[str, Any]:
    lim = {}
    for k, v in limits.items():
        key = {"gpu": "nvidia.com/gpu", "mem": "nvidia.com/gpumem", "pct": "nvidia.com/gpumem-percentage",
               "cores": "nvidia.com/gpucores"}.get(k, k)  # fmt: skip
        lim[key] = str(v)
    return {"name": name, "resources": {"limits": lim}}


def pod(*containers: dict[str, Any], init=(), name=None, ns="default", annotations=None, uid=None,
        scheduler="hami-scheduler") -> dict[str, Any]:  # fmt: skip
    n = next(_uid)
    p = {
        "metadata": {"uid": uid or f"uid-{n}", "name": name or f"pod-{n}", "namespace": ns,
                     "annotations": dict(annotations or {})},
        "spec": {"schedulerName": scheduler, "containers": list(containers) or [ctr(gpu=1)]},
    }  # fmt: skip
    if init:
        p["spec"]["initContainers"] = list(init)
    return p
