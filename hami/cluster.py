"""ClusterState: every node's cards and every card's usage, kept incrementally, shared by the extender and
the simulator.

HAMi recomputes node usage from every pod on every filter; here usage changes only when something
happens (a reservation, a pod event, a pod deletion or terminal phase), so a filter touches only the
candidate nodes' cards. The API server stays the truth: `rebuild(pods, nodes)` from annotations gives
exactly the state the incremental path reached (a property test holds that), and the extender rebuilds
on relist and failover.

Concurrency: one lock guards the whole state. `filter` decides and reserves under it, so two concurrent
filters can never take the same capacity; the lock is never held across I/O (callers patch the pod after
`filter` returns and call `release_reservation` if the patch fails).
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import logging
import math
import operator
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hami import annotations as A
from hami import fragmentation, objects, pods
from hami.config import DeviceConfig
from hami.errors import AnnotationError, InvalidRequest
from hami.fit import NodeView, fit_pod
from hami.model import CardGrant, Device, DeviceUsage, PodDevices, Selection
from hami.pods import ContainerSpec, collapse_grants
from hami.prefilter import CardSummary, Need, VerdictIndex, pod_needs
from hami.quota import QuotaState
from hami.scoring import NodePolicy, PolicyChoice, choose_policies, node_score
from hami.vendors import build_vendors
from hami.vendors.base import AllocationContext, Vendor

#: The prefilter demand of a vendor with its own fit: any node that has its cards.
_PRESENCE_ONLY = (Need(0, 0, 0, 0, ()),)

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Automatic garbage collection off for a short section that allocates per node.

    Why: a rebuild allocates millions of objects and a filter some per candidate node, and every
    allocation counts towards CPython's next collection, whose older generations walk every object
    the process holds (at 10,000 nodes a full collection took 1-4 s on the dev machine, see
    docs/benchmarks.md). Work per call that grows with the node count thus also set off collections
    whose cost grows with it. Paused, the section's garbage (freed by reference counting anyway) is
    seen by one young collection afterwards. The switch is process-wide, so it is only restored when
    this section turned it off; the extender's GcFreezer keeps the older generations small besides.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()

# Kept importable from here for callers written before `hami.pods` held the pod-level rules.
TERMINAL_PHASES = pods.TERMINAL_PHASES
pod_container_kinds = pods.container_kinds


@dataclass(frozen=True, slots=True)
class CardStat:
    """One card and its usage (for metrics, reports and tests). Memory MiB, cores percent."""

    node: str
    uuid: str
    index: int
    type: str
    vendor: str
    count: int
    used: int
    devmem: int
    usedmem: int
    devcore: int
    usedcores: int
    health: bool


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


@dataclass(slots=True)
class _Node:
    name: str
    devices: dict[str, list[Device]] = field(default_factory=dict)
    by_uuid: dict[str, Device] = field(default_factory=dict)
    usage: dict[str, DeviceUsage] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    pair_scores: dict[str, dict[str, int]] = field(default_factory=dict)
    unusable: str | None = None
    pods: set[str] = field(default_factory=set)
    score: float | None = None  # cached node_score, None = stale
    summaries: dict[str, CardSummary] = field(default_factory=dict)  # per vendor, cleared on any change
    frag: dict[Any, float] = field(default_factory=dict)  # fragmentation keys by pod shapes, same life
    cpu_alloc: int | None = None  # allocatable CPU, millicores (None: the Node does not say)
    cpu_used: int = 0  # CPU requested by the pods counted on this node, millicores
    source: tuple[str | None, ...] | None = None  # the annotations the devices were parsed from
    problem: str | None = None  # what the registration itself says is wrong (None = fine)
    index: VerdictIndex | None = None  # told of every change, so the filter re-judges only changed nodes

    def touch(self) -> None:
        if self.index is not None:
            self.index.changed(self.name)
        self.score = None
        self.summaries.clear()
        self.frag.clear()

    def cpu_free(self) -> int | None:
        """Allocatable CPU minus the CPU of the pods counted here, millicores; None when unknown."""
        return None if self.cpu_alloc is None else self.cpu_alloc - self.cpu_used

    def summary(self, vendor: str) -> CardSummary:
        s = self.summaries.get(vendor)
        if s is None:
            s = self.summaries[vendor] = CardSummary.of(
                self.devices.get(vendor, ()), self.usage, self.cordoned
            )
        return s

    def view(self) -> NodeView:
        return NodeView(self.name, self.devices, self.usage, self.cordoned, self.pair_scores)

    def current_score(self) -> float:
        if self.score is None:
            sums = [0, 0, 0, 0, 0, 0]
            for d in self.by_uuid.values():
                u = self.usage.get(d.uuid)
                sums[0] += d.count
                sums[2] += d.devcore
                sums[4] += d.devmem
                if u is not None:
                    sums[1] += u.used
                    sums[3] += u.usedcores
                    sums[5] += u.usedmem
            self.score = node_score(*sums)
        return self.score


class _PolicyOrder:
    """Candidate nodes in node-policy order: ascending (key, name), where key is -score (binpack) or
    score (spread), or the given keys of other policies.

    Only the best fitting node is needed, and the first candidate nearly always fits (the prefilter
    already refused the rest). So the first node comes from one scan over the cached scores, which
    allocates no object per node (floats are not tracked by the garbage collector, tuples are); only
    when it does not fit do the others go into a heap, giving them in O(k log n) for the k tried.
    Building that heap of (key, name, node) tuples up front for 10,000 candidates cost more than the
    rest of a filter, and its tuples set off garbage collections.
    """

    __slots__ = ("_nodes", "_keys", "_sign", "_heap", "_taken")

    def __init__(self, nodes: list[_Node], keys: list[Any], sign: float = 1.0) -> None:
        # keys[i] is nodes[i]'s score when `sign` is +-1 (order by sign * score), else its own key
        self._nodes, self._keys, self._sign = nodes, keys, sign
        self._heap: list[tuple[Any, str, _Node]] | None = None
        self._taken = -1  # index of the node given by the scan

    @classmethod
    def by_score(cls, candidates: list[_Node], sign: float) -> _PolicyOrder:
        scores = list(map(_SCORE, candidates))  # C-level: cached scores, None where stale
        if None in scores:
            scores = [n.current_score() if x is None else x for n, x in zip(candidates, scores, strict=True)]
        return cls(candidates, scores, sign)

    @classmethod
    def from_entries(cls, entries: list[tuple[Any, str, _Node]]) -> _PolicyOrder:
        order = cls([], [])
        heapq.heapify(entries)
        order._heap = entries
        return order

    def __bool__(self) -> bool:
        if self._heap is not None:
            return bool(self._heap)
        return len(self._nodes) > (self._taken >= 0)

    def pop(self) -> _Node:
        if self._heap is None and self._taken < 0:
            keys, nodes = self._keys, self._nodes
            best = max(keys) if self._sign < 0 else min(keys)
            if keys.count(best) == 1:
                self._taken = keys.index(best)
            else:
                self._taken = min((i for i, k in enumerate(keys) if k == best), key=lambda i: nodes[i].name)
            return nodes[self._taken]
        return heapq.heappop(self._rest())[2]

    def _rest(self) -> list[tuple[Any, str, _Node]]:
        if self._heap is None:
            t, sign = self._taken, self._sign
            self._heap = [(sign * k, n.name, n) for i, (k, n) in enumerate(zip(self._keys, self._nodes, strict=True))
                          if i != t]  # fmt: skip
            heapq.heapify(self._heap)
        return self._heap

    def names(self) -> list[str]:
        """Names of the nodes not given yet."""
        if self._heap is not None:
            return [name for _, name, _ in self._heap]
        names = list(map(_NAME, self._nodes))
        if self._taken >= 0:
            del names[self._taken]
        return names

    def entries(self) -> list[tuple[Any, str, _Node]]:
        """The nodes not given yet as (key, name, node)."""
        return list(self._rest())


_SCORE = operator.attrgetter("score")
_NAME = operator.attrgetter("name")


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


class ClusterState:
    """Nodes, cards, per-card usage, pod reservations and quotas. Thread-safe.

    Pods count only when they carry `hami.io/vgpu-node` and were scheduled by `scheduler_name`
    (pods of another scheduler with copied annotations are never our allocations).
    """

    def __init__(
        self,
        config: DeviceConfig | None = None,
        vendors: Mapping[str, Vendor] | None = None,
        *,
        scheduler_name: str | None = None,
    ) -> None:
        self.config = config or DeviceConfig()
        self.vendors: dict[str, Vendor] = dict(vendors or build_vendors(self.config))
        self.scheduler_name = (
            scheduler_name if scheduler_name is not None else self.config.scheduler.schedulerName
        )
        self.quota = QuotaState(self.vendors)
        #: The workload learned from the pods seen (memory only), for the `fragmentation` policies.
        self.fragmentation = fragmentation.FragmentationModel()
        self._lock = threading.RLock()
        self._node_keys = (
            *dict.fromkeys(k for v in self.vendors.values() for k in v.node_annotation_keys),
            A.NVIDIA_SCORE,
            A.DEVICE_CORDON,
        )
        # Vendors whose inventory is node capacity or labels (Cambricon, AWS Neuron, ...): their
        # entries are part of what a node's devices were parsed from.
        self._capacity_keys = tuple(dict.fromkeys(k for v in self.vendors.values() for k in v.node_capacity_keys))
        self._label_keys = tuple(dict.fromkeys(k for v in self.vendors.values() for k in v.node_label_keys))
        # Every node's prefilter verdict per demand; the nodes tell it when they change (`_Node.touch`).
        self._verdicts = VerdictIndex()
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[str, _Pod] = {}
        # uid -> (node, CPU millicores) of every pod whose CPU is counted on a node: ours, and pods
        # bound by others (kube-scheduler's CPU fit decides where the next pods can go).
        self._cpu: dict[str, tuple[str, int]] = {}

    # ------------------------------------------------------------------------------------------
    # nodes

    def upsert_node(self, node: Mapping[str, Any]) -> str | None:
        """Add or refresh a node from its Node object (registration, cordon and pair-score annotations).

        Returns None when the node is usable, else the reason it is not (a malformed registration marks
        the node unusable and is logged; it never raises).
        """
        name = objects.name(node)
        annos = A.pod_annotations(node)
        # Lock, handshake and status updates leave the registration as it was: skip the re-parse and
        # recount, which every bind's node-lock write would otherwise cost twice.
        source = tuple(annos.get(k) for k in self._node_keys)
        if self._capacity_keys or self._label_keys:
            cap = objects.status(node).get("capacity")
            cap = cap if isinstance(cap, dict) else {}
            lab = objects.labels(node)
            source += (*(cap.get(k) for k in self._capacity_keys), *(lab.get(k) for k in self._label_keys))
        cpu_alloc = fragmentation.node_cpu_milli(node)
        with self._lock:
            n = self._nodes.get(name)
            if n is not None and n.source == source:
                if n.unusable != n.problem:
                    n.unusable = n.problem
                    self._verdicts.changed(name)
                if n.cpu_alloc != cpu_alloc:
                    n.cpu_alloc = cpu_alloc
                    n.frag.clear()
                return n.problem
        devices: dict[str, list[Device]] = {}
        unusable = None
        for vendor in self.vendors.values():
            try:
                found = vendor.node_devices(node)
            except AnnotationError as e:
                unusable = f"{vendor.register_key or vendor.common_word + ' inventory'}: {e}"
                log.warning("node %s: malformed registration, node unusable: %s", name, unusable)
                continue
            if found:
                devices[vendor.common_word] = found
        pair_scores: dict[str, dict[str, int]] = {}
        if A.NVIDIA_SCORE in annos:
            try:
                pair_scores = A.decode_pair_scores(annos[A.NVIDIA_SCORE])
            except AnnotationError as e:
                log.warning("node %s: ignoring %s: %s", name, A.NVIDIA_SCORE, e)
        cordoned = frozenset(p.strip() for p in annos.get(A.DEVICE_CORDON, "").split(",") if p.strip())
        if unusable is None and not devices:
            unusable = "node unregistered: no device registration annotation"
        with self._lock:
            n = self._nodes.get(name)
            if n is None:
                n = self._nodes[name] = _Node(name, index=self._verdicts)
                n.cpu_used = sum(c for where, c in self._cpu.values() if where == name)
            n.cpu_alloc = cpu_alloc
            n.devices = devices
            n.by_uuid = {d.uuid: d for ds in devices.values() for d in ds}
            n.cordoned, n.pair_scores, n.unusable = cordoned, pair_scores, unusable
            n.source, n.problem = source, unusable
            self._recount_node(n)
        return unusable

    def remove_node(self, name: str) -> None:
        """Forget a node; its pods stay recorded and count again if the node comes back."""
        with self._lock:
            self._nodes.pop(name, None)
            self._verdicts.changed(name)

    def mark_node_unusable(self, name: str, reason: str | None) -> None:
        """Set (or clear with None) a reason that keeps new pods off a node, e.g. a failed handshake."""
        with self._lock:
            n = self._nodes.get(name)
            if n is not None and n.unusable != reason:
                n.unusable = reason
                self._verdicts.changed(name)

    def _recount_node(self, n: _Node) -> None:
        n.usage = {}
        for uid in n.pods:
            p = self._pods.get(uid)
            if p is not None:
                self._apply(n, p.grants, +1)
        n.touch()

    @staticmethod
    def _apply(n: _Node, grants: Iterable[CardGrant], sign: int) -> None:
        for g in grants:
            if g.uuid not in n.by_uuid:
                continue  # a card that left the node's registration: nothing to count it against
            u = n.usage.get(g.uuid)
            if u is None:
                u = n.usage[g.uuid] = DeviceUsage()
            if sign > 0:
                u.add(g.usedmem, g.usedcores, g.slots)
            else:
                u.sub(g.usedmem, g.usedcores, g.slots)
        n.touch()

    # ------------------------------------------------------------------------------------------
    # pods

    def _add_record(self, p: _Pod) -> None:
        self._pods[p.uid] = p
        n = self._nodes.get(p.node)
        if n is None:
            n = self._nodes[p.node] = _Node(
                p.node, unusable="node unregistered: no device registration annotation", index=self._verdicts
            )
        n.pods.add(p.uid)
        self._apply(n, p.grants, +1)
        self.quota.add_usage(p.namespace, p.grants)
        self._set_cpu(p.uid, p.node, p.cpu)

    def _set_cpu(self, uid: str, node: str | None, cpu: int) -> None:
        """Count pod `uid`'s CPU on `node` (None: on no node any more)."""
        old = self._cpu.pop(uid, None)
        if old is not None and (n := self._nodes.get(old[0])) is not None:
            n.cpu_used -= old[1]
            n.frag.clear()
        if node is not None:
            self._cpu[uid] = (node, cpu)
            if (n := self._nodes.get(node)) is not None:
                n.cpu_used += cpu
                n.frag.clear()

    def _drop_record(self, uid: str) -> _Pod | None:
        p = self._pods.pop(uid, None)
        if p is None:
            return None
        self._set_cpu(uid, None, 0)
        n = self._nodes.get(p.node)
        if n is not None:
            n.pods.discard(uid)
            self._apply(n, p.grants, -1)
        self.quota.remove_usage(p.namespace, p.grants)
        return p

    def upsert_pod(self, pod: Mapping[str, Any]) -> None:
        """Apply a pod add/update event: count its allocation, or release it when terminal.

        Malformed allocation annotations are logged and the pod is not counted (never raises).
        """
        uid = objects.uid(pod)
        annos = objects.annotations(pod)
        node = annos.get(A.ASSIGNED_NODE)
        ours = not self.scheduler_name or objects.scheduler_name(pod) == self.scheduler_name
        with self._lock:
            if not ours or pods.is_terminal(pod):
                self._drop_record(uid)
                bound = objects.spec(pod).get("nodeName")
                if not pods.is_terminal(pod) and isinstance(bound, str) and bound:
                    self._set_cpu(uid, bound, fragmentation.pod_cpu_milli(pod))
                else:
                    self._set_cpu(uid, None, 0)
                return
            if not node:
                return  # not (yet) placed by us; a reservation in flight stays
            devices: PodDevices = {}
            kinds = pods.container_kinds(pod)
            try:
                for v in self.vendors.values():
                    if v.allocated_key in annos:
                        # Lists written by other HAMi versions may lack leading empty entries (§8.2).
                        devices[v.common_word] = A.align_pod_devices(
                            A.decode_pod_devices(annos[v.allocated_key]), len(kinds)
                        )
            except AnnotationError as e:
                log.warning("pod %s: not counted, malformed allocation: %s", objects.ref(pod), e)
                return
            if pods.init_done(pod):
                # Finished init containers hold nothing any more: keep only app and sidecar entries.
                devices = pods.without_finished_init(devices, kinds)
            grants = tuple(collapse_grants(devices, kinds))
            old = self._pods.get(uid)
            if old is not None and old.node == node and old.grants == grants:
                old.reserved = False
                return
            if old is None:
                self._learn(pod, uid)
            self._drop_record(uid)
            self._add_record(
                _Pod(
                    uid,
                    objects.namespace(pod),
                    objects.name(pod),
                    node,
                    grants,
                    False,
                    time.time(),
                    fragmentation.pod_cpu_milli(pod),
                )
            )

    def remove_pod(self, uid: str) -> bool:
        """A pod was deleted (or its reservation must go): free its usage. True when something was freed."""
        with self._lock:
            freed = self._drop_record(uid) is not None
            self._set_cpu(uid, None, 0)
            return freed

    release_reservation = remove_pod

    def expire_reservations(self, max_age_s: float, *, now: float | None = None) -> list[str]:
        """Drop reservations no pod event confirmed within `max_age_s` seconds; returns their UIDs."""
        now = time.time() if now is None else now
        with self._lock:
            stale = [p.uid for p in self._pods.values() if p.reserved and now - p.since > max_age_s]
            for uid in stale:
                self._drop_record(uid)
        return stale

    # ------------------------------------------------------------------------------------------
    # quotas

    def upsert_quota(self, quota: Mapping[str, Any]) -> None:
        self.quota.upsert_quota(quota)

    def remove_quota(self, namespace: str, name: str) -> None:
        self.quota.remove_quota(namespace, name)

    # ------------------------------------------------------------------------------------------
    # filter

    def _learn(self, pod: Mapping[str, Any], uid: str) -> None:
        """Count a live pod the filter did not see (a restart relearns the workload from the live pods)."""
        try:
            containers = self.pod_requests(pod)
            annos = objects.annotations(pod)
            wanted = {r.vendor for c in containers for r in c.requests}
            selections = {v: self.vendors[v].selection(annos) for v in wanted}
        except InvalidRequest:
            return
        shapes = fragmentation.pod_shapes(containers, selections, fragmentation.pod_cpu_milli(pod))
        self.fragmentation.observe((s for ss in shapes.values() for s in ss), uid)

    def _best_by_vendor_scores(
        self,
        first: _Node,
        first_fit: Any,
        rest: Sequence[tuple[Any, str, _Node]],
        containers: Sequence[ContainerSpec],
        selections: Mapping[str, Selection],
        policy: Any,
        quota: Any,
        scorers: Sequence[Vendor],
        failed: dict[str, str] | None,
    ) -> tuple[_Node, Any]:
        """For pods of vendors with a topology term (`Vendor.node_score`: MetaX GPU topology tables,
        Ascend NetworkIDs, Vastai dies): fit the other candidates too and keep the node with the highest
        vendor term, ties going to the node policy's order (`first` is the policy's best fitting node)."""

        def term(n: _Node, f: Any) -> float:
            return sum(
                v.node_score(
                    f.devices.get(v.common_word, []),
                    cards={d.uuid: d for d in n.devices.get(v.common_word, ())},
                    node_policy=policy.node.value,
                )
                for v in scorers
            )

        best = ((-term(first, first_fit), -1), first, first_fit)
        for i, (_, _, n) in enumerate(sorted(rest, key=lambda item: (item[0], item[1]))):
            f = fit_pod(containers, n.view(), vendors=self.vendors, selections=selections, policy=policy, quota=quota)
            if f.ok:
                cand = ((-term(n, f), i), n, f)
                if cand[0] < best[0]:
                    best = cand
            elif failed is not None:
                failed[n.name] = f.reason_text()
        chosen = best[1]
        if failed is not None and chosen is not first:
            failed.pop(chosen.name, None)
            why = f"node {chosen.name} preferred by the {'/'.join(v.common_word for v in scorers)} topology score"
            failed[first.name] = why
            for name, text in list(failed.items()):
                if text.startswith(f"node {first.name} preferred by node policy"):
                    failed[name] = why
        return chosen, best[2]

    def pod_requests(self, pod: Mapping[str, Any]) -> list[ContainerSpec]:
        """Per container (init first) its device requests. Raises InvalidRequest for bad quantities."""
        return pods.requests(pod, self.vendors)

    def filter(
        self,
        pod: Mapping[str, Any],
        node_names: Sequence[str],
        *,
        now: float | None = None,
        explain: bool = True,
    ) -> FilterOutcome:
        """Choose a node and the exact cards for `pod` among `node_names`, and reserve them.

        `now` (Unix seconds) stamps `hami.io/vgpu-time`. With `explain` False, nodes that were not
        tried because a better one fitted get no entry in `failed_nodes` (the simulator needs none).

        Nodes are tried in node-policy order (binpack: fullest first, spread: emptiest first; ties by
        name) and the first that fits wins, which is the same as fitting all and taking the best score.
        A retried filter for the same pod UID first drops its earlier reservation. Never raises for a
        bad pod: the problem is in `error`.
        """
        uid, ns = objects.uid(pod), objects.namespace(pod)
        annos = objects.annotations(pod)
        try:
            containers = self.pod_requests(pod)
            if not any(c.requests for c in containers):
                return FilterOutcome(no_devices=True)
            wanted = {r.vendor for c in containers for r in c.requests}
            selections: dict[str, Selection] = {v: self.vendors[v].selection(annos) for v in wanted}
        except InvalidRequest as e:
            return FilterOutcome(error=f"pod {ns}/{objects.meta(pod).get('name')}: {e}")
        sched = self.config.scheduler
        policy = choose_policies(
            annos, node_default=sched.nodeSchedulerPolicy, card_default=sched.gpuSchedulerPolicy
        )
        cpu = fragmentation.pod_cpu_milli(pod)
        with self._lock, _gc_paused():
            shapes = fragmentation.pod_shapes(containers, selections, cpu)
            model = self.fragmentation
            model.observe((s for ss in shapes.values() for s in ss), uid)
            if policy.uses_fragmentation:
                policy = replace(policy, fragmentation=model)
            out = FilterOutcome(warnings=policy.warnings, policy=policy)
            self._drop_record(uid)
            failed = out.failed_nodes
            needs = pod_needs(containers, selections)
            for v in needs:
                if self.vendors[v].custom_fit:
                    needs[v] = _PRESENCE_ONLY  # the vendor's own fit decides; the node must have its cards
            candidates = self._verdicts.candidates(self._nodes, node_names, needs, failed)
            if policy.node is NodePolicy.FRAGMENTATION:
                order = _PolicyOrder.from_entries(self._fragmentation_keys(candidates, shapes))
            else:
                sign = -1.0 if policy.node is NodePolicy.BINPACK else 1.0
                order = _PolicyOrder.by_score(candidates, sign)
            quota = None
            if self.quota.has_limits(ns):
                quota = lambda vendor, mem, cores: self.quota.fits(ns, vendor, mem, cores)  # noqa: E731
            chosen = None
            while order:
                n = order.pop()
                fit = fit_pod(
                    containers,
                    n.view(),
                    vendors=self.vendors,
                    selections=selections,
                    policy=policy,
                    quota=quota,
                )
                if fit.ok:
                    chosen = n
                    if explain:
                        why = f"node {n.name} preferred by node policy {policy.node.value}"
                        failed.update(dict.fromkeys(order.names(), why))
                    break
                failed[n.name] = fit.reason_text()
            if chosen is None:
                return out
            scorers = [self.vendors[v] for v in wanted if self.vendors[v].scores_nodes]
            if scorers:
                chosen, fit = self._best_by_vendor_scores(
                    chosen, fit, order.entries(), containers, selections, policy, quota, scorers,
                    failed if explain else None,
                )
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pod %s/%s -> node %s: policy node=%s cards=%s, %s",
                    ns, objects.name(pod), chosen.name, policy.node.value,
                    ",".join(p.value for p in policy.cards), self._score_terms(chosen, shapes, policy),
                )  # fmt: skip
            grants = tuple(collapse_grants(fit.devices, [c.kind for c in containers]))
            self._add_record(_Pod(uid, ns, objects.name(pod), chosen.name, grants, True, time.time(), cpu))
        out.node, out.devices = chosen.name, fit.devices
        stamp = int(time.time() if now is None else now)
        out.annotations = {A.ASSIGNED_NODE: chosen.name, A.ASSIGNED_TIME: str(stamp)}
        names = [c.name for c in containers]
        for v, lst in fit.devices.items():
            cards = {d.uuid: d for d in chosen.devices.get(v, ())}
            ctx = AllocationContext(chosen.name, pod, cards, names, time.time() if now is None else now)
            out.annotations.update(self.vendors[v].allocation_annotations(lst, context=ctx))
        out.labels = {A.ASSIGNED_NODE: chosen.name}
        return out

    def _fragmentation_keys(
        self, candidates: Sequence[_Node], shapes: Mapping[str, tuple[fragmentation.Shape, ...]]
    ) -> list[tuple[Any, str, _Node]]:
        """Heap entries under the `fragmentation` node policy: the smallest increase of the node's
        expected fragmentation for the pod (cached per node until its usage or the learned workload
        changes), ties to the fuller node (binpack), then by name."""
        model = self.fragmentation
        version = model.version
        out = []
        single = None
        if len(shapes) == 1:
            ((vendor, ss),) = shapes.items()
            if len(ss) == 1:
                single = ss[0]
        if single is None:  # several containers or vendors: each judged alone, summed (rare, slower)
            key = tuple(shapes.items())
            for n in candidates:
                memo = n.frag
                if memo.get(None) != version:
                    memo.clear()
                    memo[None] = version
                x = memo.get(key)
                if x is None:
                    x = memo[key] = fragmentation.pod_delta(model, n.devices, n.usage, shapes, n.cpu_free())
                out.append(((x, -n.current_score()), n.name, n))
            return out
        # One container: the GPU part of the move is cached per GPU shape, the node's value before the
        # pod once, and the increase per (GPU shape, pod CPU); a miss costs one evaluation.
        gpu_key = ("gpu", single._replace(cpu=0))
        key = (single.nums, single.mem, single.pct, single.cores, single.types, single.cpu)
        for n in candidates:
            memo = n.frag
            if memo.get(None) != version:
                memo.clear()
                memo[None] = version
            x = memo.get(key)
            if x is None:
                cpu_free = n.cpu_free()
                before = memo.get("before")
                if before is None:
                    look = fragmentation.usage_of(n.usage)
                    before = memo["before"] = model.value_of(
                        *model.node_terms(n.devices.get(vendor, ()), look), cpu_free
                    )
                move = memo.get(gpu_key, False)
                if move is False:
                    move = memo[gpu_key] = model.gpu_move(
                        n.devices.get(vendor, ()), fragmentation.usage_of(n.usage), single
                    )
                if move is None:
                    x = math.inf
                else:
                    after_cpu = None if cpu_free is None else cpu_free - single.cpu
                    x = model.value_of(move[0], move[1], after_cpu) - before
                memo[key] = x
            out.append(((x, -n.current_score()), n.name, n))
        return out

    def _score_terms(
        self, n: _Node, shapes: Mapping[str, tuple[fragmentation.Shape, ...]], policy: PolicyChoice
    ) -> str:
        """The chosen node's score terms for the debug log (before the pod's reservation)."""
        terms = f"node score {n.current_score():.3f} (0..30, utilisation before the pod)"
        if policy.uses_fragmentation:
            model = self.fragmentation
            look = fragmentation.usage_of(n.usage)
            value = sum(model.node_value(n.devices.get(v, ()), look, n.cpu_free()) for v in shapes)
            delta = fragmentation.pod_delta(model, n.devices, n.usage, shapes, n.cpu_free())
            terms += (
                f", expected fragmentation {value:.4f} cards, increase {delta:+.4f} cards "
                f"(workload v{model.version}: {len(model.active)} shapes, {model.histogram.observed} seen)"
            )
        return terms

    # ------------------------------------------------------------------------------------------
    # snapshots

    def rebuild(
        self,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        quotas: Iterable[Mapping[str, Any]] = (),
        *,
        keep_reservations: bool = False,
    ) -> None:
        """Replace the whole state by what these objects say (restart, relist, failover).

        With `keep_reservations`, reservations made by `filter` that no pod event has confirmed yet
        survive when the listed pods do not account for them (a relist in the middle of a leadership
        term must not free capacity whose patch is still in flight); at startup and failover the API
        server alone is the truth, so the default drops them.
        """
        with self._lock, _gc_paused():
            pending = [p for p in self._pods.values() if p.reserved] if keep_reservations else []
            self._nodes.clear()
            self._pods.clear()
            self._verdicts.reset()
            self._cpu.clear()
            self.quota = QuotaState(self.vendors)
            for q in quotas:
                self.quota.upsert_quota(q)
            for n in nodes:
                self.upsert_node(n)
            for p in pods:
                self.upsert_pod(p)
            for p in pending:
                if p.uid not in self._pods:
                    self._add_record(p)

    def card_stats(self) -> list[CardStat]:
        """Every registered card with its usage, ordered by node then card index."""
        with self._lock:
            out = []
            for name in sorted(self._nodes):
                n = self._nodes[name]
                for d in sorted(n.by_uuid.values(), key=lambda d: (d.vendor, d.index)):
                    u = n.usage.get(d.uuid) or DeviceUsage()
                    out.append(
                        CardStat(name, d.uuid, d.index, d.type, d.vendor, d.count, u.used, d.devmem, u.usedmem,
                                 d.devcore, u.usedcores, d.health)
                    )  # fmt: skip
            return out

    def usage_snapshot(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> card uuid -> (slots, MiB, percent) for cards with any usage (comparisons in tests)."""
        with self._lock:
            return {
                name: {
                    u: (x.used, x.usedmem, x.usedcores)
                    for u, x in n.usage.items()
                    if x.used or x.usedmem or x.usedcores
                }
                for name, n in self._nodes.items()
            }

    def pod_grants(self) -> list[tuple[str, str, str, tuple[CardGrant, ...]]]:
        """Every counted pod as (namespace, name, node, collapsed card grants), for per-pod metrics."""
        with self._lock:
            return [(p.namespace, p.name, p.node, p.grants) for p in self._pods.values()]

    def quota_stats(self) -> list[tuple[str, str, int, int]]:
        """(namespace, resource, used, limit) for every quota-limited resource (HAMi's quota metrics)."""
        return self.quota.snapshot()

    def pod_node(self, uid: str) -> str | None:
        """The node a pod is counted on (reserved or confirmed), or None."""
        with self._lock:
            p = self._pods.get(uid)
            return p.node if p else None

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def node_unusable_reason(self, name: str) -> str | None:
        with self._lock:
            n = self._nodes.get(name)
            return "node unregistered" if n is None else n.unusable

    def node_scores(self, names: Sequence[str]) -> dict[str, float]:
        """Each known node's utilisation score before the next pod (0..30, `hami.scoring.node_score`, the
        binpack/spread order of `filter`); names not registered are left out."""
        with self._lock:
            return {n: self._nodes[n].current_score() for n in names if n in self._nodes}

    def fitting_nodes(
        self, pod: Mapping[str, Any], node_names: Sequence[str]
    ) -> tuple[FilterOutcome, list[str]]:
        """Every node among `node_names` that `pod` fits on now, in the order given; nothing is reserved.

        For callers that let another scorer choose among the fitting nodes (the extender's
        ``--filter-mode all``; the cards are then chosen by `filter` with the one node picked). The
        outcome has `node` None and in `failed_nodes` the reason of every node that does not fit;
        `error` / `no_devices` as in `filter` (then the list is empty). The pod's own earlier
        reservation, if any, does not count against it. One parse of the pod, one prefilter pass,
        one fit per remaining candidate.
        """
        from hami.prefilter import prefilter  # every candidate is wanted here, not the best one first

        uid, ns = objects.uid(pod), objects.namespace(pod)
        annos = objects.annotations(pod)
        try:
            containers = self.pod_requests(pod)
            if not any(c.requests for c in containers):
                return FilterOutcome(no_devices=True), []
            wanted = {r.vendor for c in containers for r in c.requests}
            selections: dict[str, Selection] = {v: self.vendors[v].selection(annos) for v in wanted}
        except InvalidRequest as e:
            return FilterOutcome(error=f"pod {ns}/{objects.meta(pod).get('name')}: {e}"), []
        sched = self.config.scheduler
        policy = choose_policies(
            annos, node_default=sched.nodeSchedulerPolicy, card_default=sched.gpuSchedulerPolicy
        )
        out = FilterOutcome(warnings=policy.warnings, policy=policy)
        fits: set[str] = set()
        with self._lock:
            own = self._drop_record(uid)
            try:
                needs = pod_needs(containers, selections)
                for v in needs:
                    if self.vendors[v].custom_fit:
                        needs[v] = _PRESENCE_ONLY
                quota = None
                if self.quota.has_limits(ns):
                    quota = lambda vendor, mem, cores: self.quota.fits(ns, vendor, mem, cores)  # noqa: E731
                for n in prefilter(self._nodes, node_names, needs, out.failed_nodes):
                    fit = fit_pod(
                        containers, n.view(), vendors=self.vendors, selections=selections, policy=policy, quota=quota
                    )
                    if fit.ok:
                        fits.add(n.name)
                    else:
                        out.failed_nodes[n.name] = fit.reason_text()
            finally:
                if own is not None:
                    self._add_record(own)
        return out, [n for n in dict.fromkeys(node_names) if n in fits]
