"""One policy's replay: the core's ClusterState, kube-scheduler's view of the nodes, and the figures.

`Replay` is what `hami.simulate.engine.run` drives: a pod arrives (`submit`), goes through kube-scheduler's
fit (`hami.simulate.noderesources`) and, when it asks for devices, through `ClusterState.filter` over
the nodes that passed, handed a few at a time in the filter's own order (`filter`, `plan_for`;
`hami.simulate.candidates`, `hami.simulate.fragorder`); a pod leaves (`delete`, `remove`) through the
core's pod-removal path. `sample` keeps the peaks, the checkpoints and the curve of the run's
`RunResult`. With priorities a `hami.simulate.priority.PendingQueue` calls back into `place`, `fail`
and `remove`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hami import objects, pods
from hami.cluster import ClusterState, FilterOutcome
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.fragmentation import Shape
from hami.scoring import NodePolicy, choose_policies
from hami.simulate.allocation import CardUsage, families
from hami.simulate.candidates import PolicyOrder, Refusals
from hami.simulate.fragmeter import FragmentationMeter
from hami.simulate.fragorder import FragmentationOrder, single_shape
from hami.simulate.noderesources import NodeResources
from hami.simulate.results import (
    Checkpoint,
    Mode,
    Placement,
    RunResult,
    summarise_failure,
    summarise_reasons,
)
from hami.simulate.workload import SimPod, Workload
from hami.vendors import build_vendors


def _device_resources(container: Mapping) -> list[tuple[str, list]]:
    """A container's requests and limits without CPU and memory, in a stable order."""
    res = container.get("resources") or {}
    return [
        (part, sorted((k, str(v)) for k, v in (res.get(part) or {}).items() if k not in ("cpu", "memory")))
        for part in ("requests", "limits")
    ]


class Replay:
    """One policy's replay: the core's ClusterState, kube-scheduler's resource view, and the figures."""

    def __init__(
        self,
        workload: Workload,
        config: DeviceConfig,
        result: RunResult,
        curve_step: float,
        placed: Sequence[tuple[str, SimPod]] = (),
    ) -> None:
        # Pods are drawn again and again from one workload: their parsed requests are kept. The workload
        # is learned under every policy: the report measures each policy's fragmentation with it.
        self.state = ClusterState(
            config=config, vendors=build_vendors(config), request_memo=4096, learn_workload=True
        )
        for n in workload.nodes:
            self.state.upsert_node(n.obj)
        self.card_type = {c.uuid: c.type for n in workload.nodes for c in n.cards}
        # The filter's node order mirrored per node policy (`hami.simulate.candidates`), made on first
        # use, and per workload pod the policy whose order it is handed in (None: every node at once).
        self.orders: dict[NodePolicy, PolicyOrder | FragmentationOrder] = {}
        self.plans: dict[int, tuple[NodePolicy, str] | None] = {}
        #: Per workload pod under the fragmentation order: its (vendor, shape) as the filter keys it.
        self.shapes: dict[int, tuple[str, Shape]] = {}
        self.kinds: dict[str, tuple[NodePolicy, str] | None] = {}
        self.refusals: Refusals | None = None
        self.res = NodeResources(workload.nodes)
        self.usage = CardUsage(workload.nodes, families(self.state.vendors))
        self.keep(placed)
        result.start_allocation = self.usage.ratios()
        self.capacity = result.gpu_capacity = self.usage.devcore / 100  # cards
        self.result = result
        self.where: dict[str, tuple[int, SimPod, list[tuple[str, int, int]]]] = {}
        self.arrived = 0.0  # cards
        self.now: float | None = None  # trace time (s) in trace mode
        self.stamp = 0.0  # `hami.io/vgpu-time`: trace time, or the submission number in fill mode
        self.curve_step = curve_step
        self.next_check = 10.0
        self.next_curve = curve_step
        self.check_limit = result.arrival_target if result.arrival_target is not None else float("inf")
        closed = frozenset(self.res.names_of(~self.res.open))  # cordoned: no new pod reaches them
        self.meter = FragmentationMeter(self.state, closed)
        self.best_nodes: tuple[Checkpoint, dict[str, tuple[float, float]]] | None = None
        #: With priorities (`hami.simulate.priority.PendingQueue`): pods that do not fit wait, may preempt.
        self.queue: Any = None
        if placed:
            # The cluster as it is, before any arrival: which of its nodes are fragmented now.
            result.start_fragmentation = self.meter.measure()
            result.start_node_fragmentation = [x for x in self.meter.nodes() if x.cards]

    def keep(self, placed: Sequence[tuple[str, SimPod]]) -> None:
        """Pods already on a node at the start (node name, pod whose `obj` carries its allocation
        annotations): their CPU, memory and pod slot taken there, their cards counted as the extender
        counts a listed pod (`ClusterState.upsert_pod`). They never leave. Pods on a node that is not in
        the input are skipped (callers count those)."""
        for k, (node, pod) in enumerate(placed):
            i = self.res.index.get(node)
            if i is None:
                continue
            self.res.take(i, pod.cpu_milli, pod.memory_mib)
            self.state.upsert_pod({**pod.obj, "metadata": {**pod.obj["metadata"], "uid": f"placed-{k}"}})
        for _, _, _, grants in self.state.pod_grants():
            self.usage.apply(self.usage.held(grants), +1)
        if placed:
            self.state.refresh_workload()  # the start state's pods are the workload learned so far

    @property
    def arrived_pct(self) -> float:
        return self.arrived / self.capacity * 100

    def point(self, arrival: float, measure: bool = False) -> Checkpoint:
        """The allocation now as a checkpoint at `arrival` percent (with the fragmentation measured)."""
        f = self.usage.ratios()
        frag = self.meter.measure() if measure else None
        return Checkpoint(arrival, f.cores, f.memory, self.now, frag, f.slots, f.capacity)

    def sample(self) -> None:
        """Peaks always; checkpoints (with the fragmentation measured) at every 10 % of arrivals and curve
        points at every `curve_step` %. The peak time is that of the highest capacity taken."""
        r = self.result
        f = self.usage.ratios()
        if f.capacity > r.peak_capacity_allocation_ratio:
            r.peak_capacity_allocation_ratio, r.peak_time = f.capacity, self.now
            r.peak_per_model = self.usage.per_model()
            r.peak_per_family = self.usage.per_family()
        r.peak_gpu_allocation_ratio = max(r.peak_gpu_allocation_ratio, f.cores)
        r.peak_memory_allocation_ratio = max(r.peak_memory_allocation_ratio, f.memory)
        r.peak_slot_allocation_ratio = max(r.peak_slot_allocation_ratio, f.slots)
        pct = self.arrived_pct
        while pct >= self.next_check - 1e-9 and self.next_check <= self.check_limit + 1e-9:
            c = self.point(self.next_check, measure=True)
            r.checkpoints.append(c)
            if self.best_nodes is None or f.capacity > self.best_nodes[0].capacity_allocation_ratio:
                self.best_nodes = (c, self.meter.last)
            self.next_check += 10.0
        if pct >= self.next_curve - 1e-9:
            r.curve.append(self.point(round(pct, 3)))
            while pct >= self.next_curve - 1e-9:
                self.next_curve += self.curve_step

    def node_figures(self) -> None:
        """The per-node fragmentation table: the state at the end (fill), or at the checkpoint of highest
        capacity taken (trace: at its end every pod has left)."""
        r = self.result
        if r.mode is Mode.TRACE and self.best_nodes is not None:
            r.node_fragmentation_at, figures = self.best_nodes
        else:
            self.meter.measure()
            figures = self.meter.last
        r.node_fragmentation = [x for x in self.meter.nodes(figures) if x.cards]

    def fail(self, pod: SimPod, name: str, reason: str, category: str) -> None:
        r = self.result
        r.failed += 1
        r.failure_reasons[category] += 1
        if pod.is_gpu:
            r.failed_gpu_pods += 1
            r.failed_gpu_demand += pod.gpu_demand
            if r.first_failure_arrival is None:
                r.first_failure_arrival = self.arrived_pct
        if r.placements is not None:
            cname = pod.obj["spec"]["containers"][0].get("name", "")
            r.placements.append(Placement(name, cname, "", "", "", None, None, reason))

    def submit(self, pod: SimPod, uid: str, name: str) -> None:
        """One pod arrives: kube-scheduler's fit, then (GPU pods) the extender's filter and reservation."""
        r = self.result
        r.pods += 1
        if pod.is_gpu:
            r.gpu_pods += 1
            self.arrived += pod.gpu_demand
        if pod.unplaceable is not None:
            self.fail(pod, name, pod.unplaceable, pod.unplaceable.split(" (")[0].split(" in ")[0])
            return
        self.place(pod, uid, name)

    def place(self, pod: SimPod, uid: str, name: str) -> None:
        """kube-scheduler's fit and the extender's filter for an arrived pod (again for a waiting one)."""
        r, res = self.result, self.res
        selector = (pod.obj.get("spec") or {}).get("nodeSelector")
        fitting = res.fitting(pod.cpu_milli, pod.memory_mib, selector)
        if not fitting.any():
            text = res.misfit_text(pod.cpu_milli, pod.memory_mib, selector)
            category = "Insufficient cpu/memory"
            if "node affinity/selector" in text and "Insufficient" not in text:
                category = "node affinity/selector"
            self.unplaced(pod, uid, name, text, category)
            return
        if pod.gpu_demand <= 0:
            # Asks no managed device: the extender is not involved, kube-scheduler scores alone.
            i = res.least_allocated(fitting, pod.cpu_milli, pod.memory_mib)
            res.take(i, pod.cpu_milli, pod.memory_mib)
            self.cpu_changed(i)
            self.where[uid] = (i, pod, [])
            # The extender sees the bound pod's event: its CPU counts where the next pods can go.
            meta = {**pod.obj["metadata"], "uid": uid, "name": name}
            self.state.upsert_pod(
                {**pod.obj, "metadata": meta, "spec": {**pod.obj["spec"], "nodeName": res.names[i]}}
            )
            r.scheduled += 1
            if self.queue is not None:
                self.queue.placed(self, pod, uid, name)
            if r.placements is not None:
                cname = pod.obj["spec"]["containers"][0].get("name", "")
                r.placements.append(Placement(name, cname, res.names[i], "", "", None, None))
            return
        meta = pod.obj["metadata"]
        obj = {
            **pod.obj,
            "metadata": {
                **meta,
                "uid": uid,
                "name": name,
                "annotations": dict(objects.annotations(pod.obj)),
            },
        }
        t0 = time.perf_counter()
        out, reasons = self.filter(pod, obj, fitting)
        r.decision_s.append(time.perf_counter() - t0)
        for w in out.warnings:
            r.warnings[w] += 1
        if out.node is None:
            if out.error:
                self.fail(pod, name, out.error, "invalid request")
            elif out.no_devices:
                self.fail(pod, name, "the pod asks for no device the scheduler manages", "no managed device")
            else:
                if reasons is None:
                    text, category = summarise_failure(out.failed_nodes)
                else:
                    text, category = summarise_reasons(reasons)
                self.unplaced(pod, uid, name, text, category)
            return
        i = res.index[out.node]
        res.take(i, pod.cpu_milli, pod.memory_mib)
        held = self.usage.held(pods.collapse_grants(out.devices, pods.container_kinds(obj)))
        self.usage.apply(held, +1)
        self.where[uid] = (i, pod, held)
        r.scheduled += 1
        if self.queue is not None:
            self.queue.placed(self, pod, uid, name)
        if r.annotations is not None:
            r.annotations.append((name, out.annotations))
        if r.placements is not None:
            names = pods.container_names(obj)
            for per_container in out.devices.values():
                for cname, cds in zip(names, per_container, strict=False):
                    for cd in cds:
                        r.placements.append(
                            Placement(
                                name,
                                cname,
                                out.node,
                                cd.uuid,
                                self.card_type.get(cd.uuid, ""),
                                cd.usedmem,
                                cd.usedcores,
                            )
                        )

    def unplaced(self, pod: SimPod, uid: str, name: str, reason: str, category: str) -> None:
        """No room now: the pod fails, or waits (and may preempt) when priorities are replayed."""
        if self.queue is None or not self.queue.wait(self, pod, uid, name, reason, category):
            self.fail(pod, name, reason, category)

    def filter(
        self, pod: SimPod, obj: dict, fitting: np.ndarray
    ) -> tuple[FilterOutcome, Counter[str] | None]:
        """`ClusterState.filter` over the nodes of `fitting`, and when nothing fits the number of nodes per
        reason (None: count `failed_nodes`). The best few nodes in the filter's own order that it has not
        refused yet go first, the next ones only while none fits (`hami.simulate.candidates`; the
        decision and the reasons are those of one call with every node)."""
        plan = self.plan_for(pod, obj)
        if plan is None:
            return self.state.filter(obj, self.res.names_of(fitting), now=self.stamp, explain=False), None
        order, r = plan
        known, index = self.refusals, self.res.index
        mask = fitting & known.unknown(r)
        if isinstance(order, FragmentationOrder):
            order.prepare(obj, *self.shapes[id(pod)], mask)
        first, rest = order.split(mask)
        out = self.state.filter(obj, first, now=self.stamp, explain=False)
        if out.error is not None or out.no_devices:
            return out, None
        known.learn(r, out.failed_nodes, index)
        size = 4 * len(first)
        while out.node is None and len(rest):
            # The next nodes in order, 4x as many each time: the node that fits is usually among the
            # first few, and a pod that fits nowhere is refused by every node at most once.
            chunk, rest = rest[:size], rest[size:]
            out = self.state.filter(obj, order.names_of(chunk), now=self.stamp, explain=False)
            known.learn(r, out.failed_nodes, index)
            size *= 4
        if out.node is not None:
            self.refresh(index[out.node])
            return out, None
        return out, known.counts(r, fitting)

    def plan_for(self, pod: SimPod, obj: dict) -> tuple[PolicyOrder | FragmentationOrder, int] | None:
        """The mirrored order of the pod's node policy and its row of known refusals; None when the
        filter must see every node in one call (`hami.simulate.candidates` says when)."""
        key = id(pod)  # the workload's pods live as long as the run; their requests never change
        plan = self.plans.get(key, False)
        if plan is False:
            # What the prefilter and the fit read of the pod: its containers' resources (and kinds),
            # its annotations (selections, policies) and its namespace; pods alike share one plan.
            # Its CPU and memory are kube-scheduler's fit (`NodeResources`), which no device rule reads.
            spec = obj.get("spec") or {}
            kind = repr((
                [(_device_resources(c), c.get("restartPolicy")) for c in spec.get("initContainers") or ()],
                [_device_resources(c) for c in spec.get("containers") or ()],
                sorted(objects.annotations(obj).items()),
                objects.namespace(obj),
            ))  # fmt: skip
            plan = self.kinds.get(kind, False)
            if plan is False:
                plan = self.kinds[kind] = self._plan(obj, kind)
            self.plans[key] = plan
            if plan is not None and plan[0] is NodePolicy.FRAGMENTATION:
                # the pod's shape with its own CPU request (pods of one kind differ in CPU)
                shape = single_shape(self.state, obj)
                if shape is None:
                    plan = self.plans[key] = None
                else:
                    self.shapes[key] = shape
        if plan is None:
            return None
        policy, kind = plan
        order = self.orders.get(policy)
        if order is None:
            if policy is NodePolicy.FRAGMENTATION:
                order = FragmentationOrder(self.res.names, self.state)
            else:
                order = PolicyOrder(self.res.names, self.state, policy)
            self.orders[policy] = order
        if self.refusals is None:
            self.refusals = Refusals(len(self.res.names))
        return order, self.refusals.row(kind)

    def _plan(self, obj: dict, kind: str) -> tuple[NodePolicy, str] | None:
        state = self.state
        try:
            containers = state.pod_requests(obj)
        except InvalidRequest:
            return None
        wanted = {r.vendor for c in containers for r in c.requests}
        if any(state.vendors[v].scores_nodes or state.vendors[v].custom_fit for v in wanted):
            return None
        if state.quota.has_limits(objects.namespace(obj)):
            return None
        sched = state.config.scheduler
        choice = choose_policies(
            objects.annotations(obj),
            node_default=sched.nodeSchedulerPolicy,
            card_default=sched.gpuSchedulerPolicy,
        )
        if choice.node is NodePolicy.FRAGMENTATION:
            # one container request of one vendor: the filter keys it from the per-node columns,
            # which `FragmentationOrder` reads for every node (others are scored by another path)
            return (choice.node, kind) if single_shape(state, obj) is not None else None
        if choice.node not in (NodePolicy.BINPACK, NodePolicy.SPREAD) or choice.uses_fragmentation:
            return None
        return choice.node, kind

    def refresh(self, i: int) -> None:
        """Node `i`'s cards changed: its place in every mirrored order; its known refusals go."""
        for order in self.orders.values():
            order.refresh(i)
        if self.refusals is not None:
            self.refusals.forget(i)

    def cpu_changed(self, i: int) -> None:
        """Node `i`'s free CPU changed (a pod without devices): the fragmentation order reads it."""
        order = self.orders.get(NodePolicy.FRAGMENTATION)
        if order is not None:
            order.refresh(i)

    def delete(self, uid: str) -> None:
        """A pod is deleted: free its CPU/memory and, through the core's pod-removal path, its cards."""
        if not self.remove(uid):
            if self.queue is not None:
                self.queue.gone(self, uid)  # deleted while still waiting
            return
        self.result.deleted += 1
        if self.queue is not None:
            self.queue.freed(self, uid)

    def remove(self, uid: str) -> bool:
        """Take a placed pod off its node (deletion or eviction); False when it is not placed."""
        placed = self.where.pop(uid, None)
        if placed is None:
            return False
        i, pod, held = placed
        self.res.take(i, pod.cpu_milli, pod.memory_mib, sign=-1)
        self.usage.apply(held, -1)
        self.state.remove_pod(uid)
        self.refresh(i)
        return True


__all__ = ("Replay",)
