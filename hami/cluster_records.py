"""The records `hami.cluster.ClusterState` keeps and hands out: the outcome of a filter (`FilterOutcome`),
one counted pod (`_Pod`), one decision of this process (`_Decision`), and the small pure readings of
a pod's annotations they are built from. Split from `hami.cluster` so that the state's module holds
the state's rules, not its record shapes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami import objects
from hami.errors import AnnotationError
from hami.model import CardGrant, PodDevices
from hami.preemption import pod_priority, pod_start
from hami.scoring import NodePolicy, PolicyChoice

__all__ = ["FilterOutcome"]


@dataclass(slots=True)
class FilterOutcome:
    """The decision of one filter call.

    `node` is None when nothing fits (or on `error`, or when the pod asks for no managed device:
    `no_devices` True, the extender then passes every node through). On success the pod's usage is
    already reserved; `annotations` and `labels` are what the extender patches onto the pod.
    """

    node: str | None = None
    devices: PodDevices = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    failed_nodes: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    warnings: tuple[str, ...] = ()
    no_devices: bool = False
    policy: PolicyChoice | None = None


def _shares(devices: PodDevices) -> dict[str, list[list[tuple[str, int, int]]]]:
    """The cards and shares of device lists (what a decision fixes; MIG runtime fields the device
    plugin adds later are no change)."""
    return {
        v: [[(d.uuid, d.usedmem, d.usedcores) for d in c] for c in lst] for v, lst in devices.items() if lst
    }


@dataclass(frozen=True, slots=True)
class _Decision:
    """What this process's filter decided for one pod UID: the node and each vendor's device lists."""

    node: str
    devices: PodDevices


@dataclass(slots=True)
class _Pod:
    uid: str
    namespace: str
    name: str
    node: str
    grants: tuple[CardGrant, ...]
    reserved: bool  # True until a pod event with the allocation annotations confirms it
    since: float
    cpu: int = 0  # the pod's CPU request, millicores (kube-scheduler's count)
    # What preemption reads (hami.preemption.Resident): spec.priority, the start time (status.startTime,
    # else creationTimestamp, as kube-scheduler's GetPodStartTime; kept as written and parsed only when a
    # preemption looks at the pod), labels (PodDisruptionBudget selectors), graceful deletion begun.
    priority: int = 0
    created: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False
    # The MIG instances the device plugin realized for the pod (runtime identity in its annotations).
    mig_realized: tuple[A.MigAllocation, ...] = ()

    @classmethod
    def of(
        cls, pod: Mapping[str, Any], node: str, grants: tuple[CardGrant, ...], reserved: bool, cpu: int
    ) -> _Pod:
        meta = objects.meta(pod)
        labels = meta.get("labels")
        return cls(
            objects.uid(pod), objects.namespace(pod), objects.name(pod), node, grants, reserved, time.time(),
            cpu, pod_priority(pod), pod_start(pod), dict(labels) if labels else {},
            bool(meta.get("deletionTimestamp")),
        )  # fmt: skip


def _realized_mig(annotations: Mapping[str, str]) -> tuple[A.MigAllocation, ...]:
    """The entries of ``hami.io/vgpu-mig-allocations`` with a runtime identity (an unreadable value, which
    the NVIDIA vendor already logs, gives none)."""
    try:
        allocations = A.decode_mig_allocations(annotations.get(A.MIG_ALLOCATIONS, ""))
    except AnnotationError:
        return ()
    return tuple(a for a in allocations if a.realized)


def _configured_fragmentation(node_policy: str, card_policy: str) -> bool:
    """Whether the configured default policies (node; card chain) name `fragmentation`."""
    return node_policy.strip().lower() == NodePolicy.FRAGMENTATION.value or any(
        p.strip().lower() == NodePolicy.FRAGMENTATION.value for p in card_policy.split(",")
    )
