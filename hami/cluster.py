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

import gc
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hami import annotations as A
from hami import fragmentation, objects, pods
from hami.cluster_preemption import ClusterPreemption
from hami.cluster_queries import CardStat, ClusterQueries
from hami.cluster_records import (
    FilterOutcome,
    _configured_fragmentation,
    _Decision,
    _Pod,
    _realized_mig,
    _shares,
)
from hami.cluster_scoring import PolicyScoring
from hami.config import DeviceConfig
from hami.errors import AnnotationError, InvalidRequest
from hami.fit import fit_pod
from hami.model import MIG_MODE, CardGrant, Device, DeviceUsage, PodDevices, Selection
from hami.node_order import _gc_paused, _KeyOrder, _Node, _PolicyOrder
from hami.pods import ContainerSpec, collapse_grants
from hami.preemption import is_terminating, pod_priority, pod_start
from hami.prefilter import Need, VerdictIndex, pod_needs
from hami.quota import QuotaState
from hami.registration import decode_pair_scores
from hami.scoring import NodePolicy, choose_policies
from hami.spec_limits import at_least_the_spec
from hami.vendors import build_vendors
from hami.vendors.base import AllocationContext, Vendor

# Kept importable from here: the card record, the node record and the candidate order moved to
# `hami.cluster_queries` and `hami.node_order` (the filter uses the same classes, no wrapper).
__all__ = ["CardStat", "ClusterState", "FilterOutcome", "TERMINAL_PHASES", "pod_container_kinds"]

#: The prefilter demand of a vendor with its own fit: any node that has its cards.
_PRESENCE_ONLY = (Need(0, 0, 0, 0, ()),)

log = logging.getLogger(__name__)

# Kept importable from here for callers written before `hami.pods` held the pod-level rules.
TERMINAL_PHASES = pods.TERMINAL_PHASES
pod_container_kinds = pods.container_kinds


class ClusterState(ClusterQueries, PolicyScoring, ClusterPreemption):
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
        request_memo: int = 0,
        spec_floor: bool = False,
        learn_workload: bool = False,
    ) -> None:
        """`learn_workload`: count every pod into the learned workload from the start, whatever the
        policies (the simulator measures every policy's fragmentation with it). `request_memo`: how many distinct container lists' parsed device requests to keep (0: none),
        for callers that submit many pods alike (the simulator); a pod's requests depend only on its
        containers, so a kept parse is the parse. `spec_floor`: count a pod this state did not place at
        least at what its spec asks on each card (`hami.spec_limits.at_least_the_spec`); the extender
        turns it on, where pod owners may have rewritten their annotations; read-only tools and the
        simulator show the annotations as written."""
        self.config = config or DeviceConfig()
        self.vendors: dict[str, Vendor] = dict(vendors or build_vendors(self.config))
        self.scheduler_name = (
            scheduler_name if scheduler_name is not None else self.config.scheduler.schedulerName
        )
        self.quota = QuotaState(self.vendors)
        #: The workload learned from the pods seen (memory only), for the `fragmentation` policies.
        self.fragmentation = fragmentation.FragmentationModel()
        #: Whether pods are counted into `fragmentation`: from the start when a configured default policy
        #: is `fragmentation`, else from the first pod whose own policy is (`filter`). Parsing every
        #: listed pod's requests for a workload that no policy reads was half of a fleet-size rebuild.
        sched = self.config.scheduler
        self.learning = learn_workload or _configured_fragmentation(
            sched.nodeSchedulerPolicy, sched.gpuSchedulerPolicy
        )
        self._lock = threading.RLock()
        self._node_keys = (
            *dict.fromkeys(k for v in self.vendors.values() for k in v.node_annotation_keys),
            A.NVIDIA_SCORE,
            A.DEVICE_CORDON,
        )
        # Vendors whose inventory is node capacity or labels (Cambricon, AWS Neuron, ...): their
        # entries are part of what a node's devices were parsed from.
        self._capacity_keys = tuple(
            dict.fromkeys(k for v in self.vendors.values() for k in v.node_capacity_keys)
        )
        self._label_keys = tuple(dict.fromkeys(k for v in self.vendors.values() for k in v.node_label_keys))
        # (allocation annotation key, vendor): a vendor reads a pod's devices only from its key, so a pod
        # event asks only the vendors whose key it carries (one lookup per vendor, not a call).
        self._allocated_by = tuple((v.allocated_key, v) for v in self.vendors.values())
        # Every node's prefilter verdict per demand; the nodes tell it when they change (`_Node.touch`).
        self._verdicts = VerdictIndex()
        self._nodes: dict[str, _Node] = {}
        self._pods: dict[str, _Pod] = {}
        # uid -> (node, CPU millicores) of every pod whose CPU is counted on a node: ours, and pods
        # bound by others (kube-scheduler's CPU fit decides where the next pods can go).
        self._cpu: dict[str, tuple[str, int]] = {}
        self._request_memo_size = request_memo
        self._request_memo: dict[str, list[ContainerSpec]] = {}
        # uid -> what this process's filter decided for the pod: counted instead of the pod's allocation
        # annotations, which its owner can rewrite (`upsert_pod`). Kept until the pod ends, is deleted,
        # its reservation is released or expires, or the state is rebuilt for a new leadership term.
        self._decided: dict[str, _Decision] = {}
        self.spec_floor = spec_floor
        #: Pod events whose allocation annotations differed from the decision (the decision counted).
        self.allocation_mismatches = 0
        self._holds = {}  # nominated preemptors' cards (hami.cluster_preemption)
        self._plans = OrderedDict()

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
            where = vendor.register_key or vendor.common_word + " inventory"
            try:
                found = vendor.node_devices(node)
                if found:
                    A.check_card_ids(found)  # whatever the vendor's format: ids must survive the wire
            except AnnotationError as e:
                unusable = f"{where}: {e}"
                log.warning("node %s: malformed registration, node unusable: %s", name, unusable)
                continue
            except Exception as e:  # noqa: BLE001 - one node agent's bad value must not stop a rebuild
                unusable = f"{where}: cannot be read ({type(e).__name__}: {e})"
                log.warning("node %s: unreadable registration, node unusable: %s", name, unusable)
                continue
            if found:
                devices[vendor.common_word] = found
        pair_scores: dict[str, dict[str, int]] = {}
        if A.NVIDIA_SCORE in annos:
            try:
                pair_scores = decode_pair_scores(annos[A.NVIDIA_SCORE])
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
            # the learned shapes' demand is measured on the fleet's most common card
            self.fragmentation.note_cards(n.by_uuid.values())
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
            d = n.by_uuid.get(g.uuid)
            if d is None:
                continue  # a card that left the node's registration: nothing to count it against
            u = n.usage.get(g.uuid)
            if u is None:
                u = n.usage[g.uuid] = DeviceUsage()
            # MIG occupancy counts on cards in MIG mode only; a device there without a recorded
            # instance leaves the card's free placements unknown.
            mig, unknown = (g.mig, 1 if g.mig_missing else 0) if d.mode == MIG_MODE else ((), 0)
            if sign > 0:
                u.add(g.usedmem, g.usedcores, g.slots, mig, unknown)
            else:
                u.sub(g.usedmem, g.usedcores, g.slots, mig, unknown)
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

        What is counted is never less than what was decided: a pod this process placed counts the
        node and cards of that decision, whatever its annotations say now (they are the pod owner's to
        edit where nothing stops it; a difference is logged and counted in `allocation_mismatches`).
        A pod placed before this process started counts its annotations, with `spec_floor` each card
        of a vendor with the generic fit at least at what the pod's spec asks there (the spec's device
        requests cannot change after creation and are what the scheduler fitted). Malformed allocation
        annotations are logged and the pod is not counted (never raises).
        """
        uid = objects.uid(pod)
        annos = objects.annotations(pod)
        node = annos.get(A.ASSIGNED_NODE)
        ours = not self.scheduler_name or objects.scheduler_name(pod) == self.scheduler_name
        with self._lock:
            decided = self._decided.get(uid)
            if not ours or pods.is_terminal(pod):
                self._decided.pop(uid, None)
                self._release_hold(uid)
                self._drop_record(uid)
                bound = objects.spec(pod).get("nodeName")
                if not pods.is_terminal(pod) and isinstance(bound, str) and bound:
                    self._set_cpu(uid, bound, fragmentation.pod_cpu_milli(pod))
                else:
                    self._set_cpu(uid, None, 0)
                return
            rec = self._pods.get(uid)
            if not node and decided is None and rec is not None and not rec.reserved:
                if not objects.spec(pod).get("nodeName"):
                    # Counted from its annotations alone and not bound: the allocation was cleared (a
                    # re-filter found no fit; the event that cleared it can follow a late event of the
                    # placement it undid). A bound pod keeps its count: its cards were handed out.
                    self._drop_record(uid)
                    self._set_cpu(uid, None, 0)
                return
            if not node and (decided is None or rec is None or rec.reserved):
                if uid not in self._pods:
                    self._nominated(pod)  # a pending preemptor keeps the cards it was nominated for
                # Not (yet) placed by us; a reservation in flight stays. (A placement that an earlier
                # event confirmed and whose annotations are now gone is still counted as decided.)
                return
            devices: PodDevices = {}
            kinds = pods.container_kinds(pod)
            try:
                for key, v in self._allocated_by:
                    if key in annos:
                        found = v.pod_devices(annos, len(kinds))
                        if found is not None:
                            devices[v.common_word] = found
            except AnnotationError as e:
                if decided is None:
                    log.warning("pod %s: not counted, malformed allocation: %s", objects.ref(pod), e)
                    return
                devices = {}
            if decided is not None:
                if node != decided.node or _shares(devices) != _shares(decided.devices):
                    self.allocation_mismatches += 1
                    log.warning(
                        "pod %s: its allocation annotations (node %s) differ from what was decided for it "
                        "(node %s); counting the decision",
                        objects.ref(pod), node, decided.node,
                    )  # fmt: skip
                node = decided.node
                devices = {v: [list(c) for c in lst] for v, lst in decided.devices.items()}
            elif self.spec_floor:
                devices = self._at_least_the_spec(pod, node, devices)
            every = devices
            if pods.init_done(pod):
                # Finished init containers hold nothing any more: keep only app and sidecar entries.
                devices = pods.without_finished_init(devices, kinds)
            grants = tuple(collapse_grants(devices, kinds, mig_from=every))
            realized = _realized_mig(annos)
            old = self._pods.get(uid)
            self._release_hold(uid)
            if old is not None and old.node == node and old.grants == grants:
                old.mig_realized = realized
                old.reserved = False
                old.terminating = is_terminating(pod)
                old.created = pod_start(pod)
                labels = objects.labels(pod)
                if labels != old.labels:
                    old.labels = dict(labels)
                return
            if old is None and self.learning:
                self._learn(pod, uid)
            self._drop_record(uid)
            rec = _Pod.of(pod, node, grants, False, fragmentation.pod_cpu_milli(pod))
            rec.mig_realized = realized
            self._add_record(rec)

    def _at_least_the_spec(self, pod: Mapping[str, Any], node: str, devices: PodDevices) -> PodDevices:
        """`devices` with each card of a generic-fit vendor raised to what the pod's spec asks on it
        (`hami.spec_limits`): for a pod this process did not place, whose annotations its owner may
        have rewritten and whose spec's device requests cannot have changed."""
        n = self._nodes.get(node)
        if n is None or not devices:
            return devices
        try:
            specs = self.pod_requests(pod)
        except InvalidRequest:
            return devices
        return at_least_the_spec(devices, specs, n.by_uuid, self.vendors, ref=objects.ref(pod))

    def decision(self, uid: str) -> tuple[str, PodDevices] | None:
        """(node, device lists per vendor) this process's filter decided for pod `uid`, or None."""
        with self._lock:
            d = self._decided.get(uid)
            return None if d is None else (d.node, d.devices)

    def decided_allocations(self, uid: str) -> dict[str, str]:
        """The stamped allocation annotations (`Vendor.stamped_keys`: key -> value) of this process's
        decision for pod `uid`, for the vendors whose device plugin the node lock serves
        (`Vendor.uses_node_lock`) and whose value does not depend on the filter's context; {} without a
        decision. What the node lock's
        allocation stamp (`hami.annotations.encode_allocation_stamp`) digests."""
        decided = self.decision(uid)
        if decided is None:
            return {}
        out = {}
        for vendor, lists in decided[1].items():
            v = self.vendors.get(vendor)
            if v is None or not v.uses_node_lock:
                continue
            try:
                written = v.allocation_annotations(lists)
            except Exception:  # noqa: BLE001 - a vendor whose lists need the filter's context: not stamped
                continue
            out.update({k: written[k] for k in v.stamped_keys if k in written})
        return out

    def remove_pod(self, uid: str) -> bool:
        """A pod was deleted (or its reservation must go): free its usage. True when something was freed."""
        with self._lock:
            self._decided.pop(uid, None)
            self._release_hold(uid)
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
                self._decided.pop(uid, None)
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
        """Count a live pod the filter did not see (a restart relearns the workload from the live pods).

        Incremental: a pod already counted (a relist lists every live pod again) is not parsed again."""
        if self.fragmentation.seen(uid):
            return
        try:
            containers = self.pod_requests(pod)
            annos = objects.annotations(pod)
            wanted = {r.vendor for c in containers for r in c.requests}
            selections = {v: self.vendors[v].selection(annos) for v in wanted}
        except InvalidRequest:
            return
        shapes = fragmentation.pod_shapes(containers, selections, fragmentation.pod_cpu_milli(pod))
        self.fragmentation.observe((s for ss in shapes.values() for s in ss), uid)

    def pod_requests(self, pod: Mapping[str, Any]) -> list[ContainerSpec]:
        """Per container (init first) its device requests. Raises InvalidRequest for bad quantities."""
        if not self._request_memo_size:
            return pods.requests(pod, self.vendors)
        spec = objects.spec(pod)
        key = repr((spec.get("initContainers"), spec.get("containers")))
        with self._lock:
            hit = self._request_memo.get(key)
        if hit is None:
            hit = pods.requests(pod, self.vendors)  # a bad request raises and is not kept
            with self._lock:
                memo = self._request_memo
                if len(memo) >= self._request_memo_size:
                    del memo[next(iter(memo))]  # the oldest first
                memo[key] = hit
        return list(hit)

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
            if policy.uses_fragmentation:
                self.learning = True
            model = self.fragmentation
            if self.learning:
                shapes = fragmentation.pod_shapes(containers, selections, cpu)
                model.observe((s for ss in shapes.values() for s in ss), uid)
            else:
                shapes = {}
            if policy.uses_fragmentation:
                policy = replace(policy, fragmentation=model)
            out = FilterOutcome(warnings=policy.warnings, policy=policy)
            self._drop_record(uid)
            self._decided.pop(uid, None)  # a new decision replaces it, or none stands (the pod is cleared)
            failed = out.failed_nodes
            needs = pod_needs(containers, selections)
            for v in needs:
                if self.vendors[v].custom_fit:
                    needs[v] = _PRESENCE_ONLY  # the vendor's own fit decides; the node must have its cards
            candidates = self._verdicts.candidates(self._nodes, node_names, needs, failed)
            if policy.node is NodePolicy.FRAGMENTATION:
                keyed = self._fragmentation_keys(candidates, shapes)
                order = keyed if isinstance(keyed, _KeyOrder) else _PolicyOrder.from_entries(keyed)
            else:
                sign = -1.0 if policy.node is NodePolicy.BINPACK else 1.0
                order = _PolicyOrder.by_score(candidates, sign)
            quota = None
            if self.quota.has_limits(ns):
                quota = lambda vendor, mem, cores: self.quota.fits(ns, vendor, mem, cores)  # noqa: E731
            chosen = None
            prio = pod_priority(pod) if self._holds else 0
            while order:
                n = order.pop()
                fit = fit_pod(
                    containers,
                    self._held_view(n, uid, prio) if self._holds else n.view(),
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
                    chosen,
                    fit,
                    order.entries(),
                    containers,
                    selections,
                    policy,
                    quota,
                    scorers,
                    failed if explain else None,
                )
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "pod %s/%s -> node %s: policy node=%s cards=%s, %s",
                    ns, objects.name(pod), chosen.name, policy.node.value,
                    ",".join(p.value for p in policy.cards), self._score_terms(chosen, shapes, policy),
                )  # fmt: skip
            grants = tuple(collapse_grants(fit.devices, [c.kind for c in containers]))
            self._release_hold(uid)  # placed: the reservation keeps its cards now
            self._add_record(_Pod.of(pod, chosen.name, grants, True, cpu))
            self._decided[uid] = _Decision(
                chosen.name, {v: [list(c) for c in lst] for v, lst in fit.devices.items()}
            )
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

    # ------------------------------------------------------------------------------------------
    # snapshots

    def rebuild(
        self,
        nodes: Iterable[Mapping[str, Any]],
        pods: Iterable[Mapping[str, Any]],
        quotas: Iterable[Mapping[str, Any]] = (),
        *,
        keep_reservations: bool = False,
        freeze_after: bool = False,
    ) -> None:
        """Replace the whole state by what these objects say (restart, relist, failover).

        With `freeze_after` the rebuilt state is moved out of the garbage collector's sight
        (``gc.freeze()``) before automatic collection resumes. For processes that freeze their
        long-lived objects anyway (the extender's ``--gc-freeze-interval``): otherwise the next young
        collection walks every object the rebuild allocated (about 1 s at 10,000 nodes and 70,000 pods
        on the development machine), stalling whatever runs then.

        With `keep_reservations`, reservations made by `filter` that no pod event has confirmed yet
        survive when the listed pods do not account for them (a relist in the middle of a leadership
        term must not free capacity whose patch is still in flight); at startup and failover the API
        server alone is the truth, so the default drops them.
        """
        with self._lock, _gc_paused():
            pending = [p for p in self._pods.values() if p.reserved] if keep_reservations else []
            if not keep_reservations:
                # A new term decides from the API server alone; another replica may have decided since.
                self._decided.clear()
            self._nodes.clear()
            self._pods.clear()
            self._verdicts.reset()
            self._cpu.clear()
            self._holds.clear()  # the listed pods' nominations make them again
            self.quota = QuotaState(self.vendors)
            for q in quotas:
                self.quota.upsert_quota(q)
            for n in nodes:
                self.upsert_node(n)
            for p in pods:
                try:
                    self.upsert_pod(p)
                except Exception:  # noqa: BLE001 - one unreadable pod must not cut the rebuild short
                    log.exception("pod %s: not counted, its allocation cannot be read", objects.ref(p))
            for p in pending:
                if p.uid not in self._pods:
                    self._add_record(p)
            # The listed pods were counted into the learned workload (`_learn`): score with it now
            # rather than with the prior until the next periodic check.
            self.fragmentation.refresh()
            if freeze_after:
                gc.freeze()

    def refresh_workload(self) -> bool:
        """Score with the learned workload now if it drifted (`FragmentationModel.refresh`), after
        pods were counted one by one outside a rebuild. True when it changed."""
        with self._lock:
            return self.fragmentation.refresh()

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
                prio = pod_priority(pod) if self._holds else 0
                for n in prefilter(self._nodes, node_names, needs, out.failed_nodes):
                    view = self._held_view(n, uid, prio) if self._holds else n.view()
                    fit = fit_pod(
                        containers,
                        view,
                        vendors=self.vendors,
                        selections=selections,
                        policy=policy,
                        quota=quota,
                    )
                    if fit.ok:
                        fits.add(n.name)
                    else:
                        out.failed_nodes[n.name] = fit.reason_text()
            finally:
                if own is not None:
                    self._add_record(own)
        return out, [n for n in dict.fromkeys(node_names) if n in fits]

