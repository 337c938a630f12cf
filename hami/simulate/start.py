"""Where a replay starts: the pods already on the cluster, kept on their nodes and cards.

Why: "how would policy P do on *my* cluster" starts from the cluster as it is. The pods that run there
hold cards, CPU, memory and pod slots that no arriving pod can take, whichever policy is replayed; a
replay from empty cards answers another question (kept as ``--from-empty``).

One rule says which pods of an input are already placed, the same for the live cluster
(``--from-cluster``) and for any Kubernetes YAML pods file (so a ``hami snapshot`` replays to the same
figures as the cluster it was taken from). A pod is placed when it

* has not finished (``status.phase`` is not ``Succeeded`` or ``Failed``),
* is not being deleted (no ``metadata.deletionTimestamp``), and
* is on a node: ``spec.nodeName``, or HAMi's ``hami.io/vgpu-node`` with ``hami.io/bind-phase``
  ``allocating`` or ``success`` (being bound: the scheduler already holds its cards).

Its cards are what its allocation annotations say (``hami.io/vgpu-devices-allocated`` and the other
vendors' keys), counted as the scheduler extender counts a listed pod (`ClusterState.upsert_pod`): only
when ``spec.schedulerName`` is the config's ``schedulerName``. Its CPU and memory requests and one pod
slot are taken on its node. A placed pod never leaves during the replay.

Every pod of the input, placed or not, is also a shape of the workload (resampled in fill mode), with
its placement taken off. In trace mode a pod is never both placed and arriving: when the trace is the
same pods (the cluster's own, or the one YAML file), the replay starts from empty cards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami import annotations as A
from hami import objects, pods
from hami.config import DeviceConfig
from hami.simulate.workload import SimNode, SimPod
from hami.vendors import build_vendors

#: `hami.io/bind-phase` values of a pod whose cards the scheduler holds before `spec.nodeName` is set.
BOUND_PHASES = ("allocating", "success")


def placed_node(pod: dict[str, Any]) -> str | None:
    """The node a Pod object is placed on by the module's rule, else None."""
    if pods.is_terminal(pod) or objects.meta(pod).get("deletionTimestamp"):
        return None
    bound = objects.spec(pod).get("nodeName")
    if isinstance(bound, str) and bound:
        return bound
    annos = objects.annotations(pod)
    node = annos.get(A.ASSIGNED_NODE)
    if node and annos.get(A.BIND_PHASE) in BOUND_PHASES:
        return node
    return None


def placement_keys(config: DeviceConfig) -> set[str]:
    """Annotations that say where a pod is: HAMi's node, time and bind phase, every vendor's allocation."""
    keys = {A.ASSIGNED_NODE, A.ASSIGNED_TIME, A.BIND_PHASE, A.BIND_TIME}
    for vendor in build_vendors(config).values():
        keys.update(vendor.allocation_keys())
    return keys


def unplaced(pod: dict[str, Any], keys: set[str]) -> dict[str, Any]:
    """`pod` as a new arrival: no node, no status, no deletion time, none of the annotations `keys`."""
    meta = dict(pod.get("metadata") or {})
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k not in keys}
    meta.pop("deletionTimestamp", None)
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {**{k: v for k, v in pod.items() if k != "status"}, "metadata": meta, "spec": spec}


@dataclass(frozen=True, slots=True)
class Placed:
    """The placed pods of an input: (node name, pod with its allocation annotations), where they were read,
    and whether they are also the workload's pods (then a trace replays them instead)."""

    pods: list[tuple[str, SimPod]]
    source: str = ""
    in_workload: bool = False


def split(loaded: Sequence[SimPod], config: DeviceConfig) -> tuple[list[tuple[str, SimPod]], list[SimPod]]:
    """(placed pods with their nodes, every pod as a workload shape without its placement). Pure."""
    keys = placement_keys(config)
    placed = [(node, p) for p in loaded if (node := placed_node(p.obj)) is not None]
    return placed, [replace(p, obj=unplaced(p.obj, keys)) for p in loaded]


def kept(placed: Placed, *, trace: bool, from_empty: bool) -> list[tuple[str, SimPod]]:
    """The pods the replay starts with (see the module docstring for when that is none)."""
    if from_empty or (trace and placed.in_workload):
        return []
    return placed.pods


def begin(
    placed: Placed, nodes: Sequence[SimNode], *, config: DeviceConfig, trace: bool, from_empty: bool
) -> tuple[list[tuple[str, SimPod]], Start]:
    """(the pods the replay starts with, the start state's summary)."""
    on = kept(placed, trace=trace, from_empty=from_empty)
    replayed = len(placed.pods) if trace and placed.in_workload and not from_empty else 0
    return on, summarise(
        nodes, on, config=config, source=placed.source, from_empty=from_empty, replayed=replayed
    )


@dataclass(frozen=True, slots=True)
class Start:
    """What is allocated before the first arrival. Ratios 0..1 of the cluster's cores and card memory."""

    pods: int  # placed pods kept on a node of the input
    skipped: int  # placed pods on a node that is not in the input
    card_pods: int  # of `pods`, those counted on cards
    cards_used: int  # cards with any memory, cores or slot taken
    cards: int
    gpu_allocation_ratio: float
    memory_allocation_ratio: float
    source: str = ""
    from_empty: bool = False
    replayed: int = 0  # placed pods not kept because the trace replays them
    capacity_allocation_ratio: float = 0.0  # per card the largest of cores, memory and slots taken

    def json(self) -> dict[str, Any]:
        return {
            "from_empty": self.from_empty,
            "replayed_by_trace": self.replayed,
            "source": self.source or None,
            "placed_pods": self.pods,
            "skipped_pods": self.skipped,
            "pods_on_cards": self.card_pods,
            "cards_used": self.cards_used,
            "cards": self.cards,
            "capacity_allocation_ratio": round(self.capacity_allocation_ratio, 6),
            "gpu_allocation_ratio": round(self.gpu_allocation_ratio, 6),
            "memory_allocation_ratio": round(self.memory_allocation_ratio, 6),
        }

    def text(self) -> str:
        if self.from_empty:
            return "start: empty cards (--from-empty)"
        if self.replayed:
            return (
                f"start: empty cards (the trace replays the {self.replayed} placed pods of {self.source} at "
                "their creation times)"
            )
        if not self.pods and not self.skipped:
            return "start: empty cards (no pod of the input is placed)"
        line = (
            f"start: {self.pods} {'pod' if self.pods == 1 else 'pods'} already placed and kept in place "
            f"({self.card_pods} on cards) from "
            f"{self.source}: {self.cards_used} of {self.cards} GPUs in use, capacity {self.capacity_allocation_ratio * 100:.2f}%, "
            f"cores {self.gpu_allocation_ratio * 100:.2f}%, memory {self.memory_allocation_ratio * 100:.2f}% allocated"
        )
        if self.skipped:
            line += f"; {self.skipped} placed pods skipped (their node is not in the input)"
        return line


def summarise(
    nodes: Sequence[SimNode], placed: Sequence[tuple[str, SimPod]], *, config: DeviceConfig, source: str = "",
    from_empty: bool = False, replayed: int = 0,
) -> Start:  # fmt: skip
    """The start state as the engine builds it (a replay of no arrival), with the core's own figures
    (`engine.card_allocation`)."""
    from hami.simulate.engine import Mode, Policy, card_allocation, run
    from hami.simulate.workload import Workload

    names = {n.name for n in nodes}
    on = [(node, p) for node, p in placed if node in names]
    cards = sum(len(n.cards) for n in nodes)
    if not on:
        return Start(0, len(placed), 0, 0, cards, 0.0, 0.0, source, from_empty, replayed)
    sched = config.scheduler
    result = run(
        Workload(nodes=list(nodes), pods=[]),
        config=config,
        policy=Policy(sched.nodeSchedulerPolicy, sched.gpuSchedulerPolicy),
        mode=Mode.TRACE,
        placed=on,
    )
    state = result.state
    assert state is not None
    gpu, mem, _ = card_allocation(state)
    taken = result.start_allocation.capacity if result.start_allocation is not None else 0.0
    stats = state.card_stats()
    used = sum(1 for s in stats if s.usedmem or s.usedcores or s.used)
    return Start(
        pods=len(on),
        skipped=len(placed) - len(on),
        card_pods=sum(1 for *_, grants in state.pod_grants() if grants),
        cards_used=used,
        cards=cards,
        gpu_allocation_ratio=gpu,
        memory_allocation_ratio=mem,
        source=source,
        from_empty=from_empty,
        replayed=replayed,
        capacity_allocation_ratio=taken,
    )


__all__ = (
    "begin",
    "BOUND_PHASES",
    "Placed",
    "Start",
    "kept",
    "placed_node",
    "placement_keys",
    "split",
    "summarise",
    "unplaced",
)
