"""`ClusterState`'s side of preemption: plans (which pods to evict on which node, `hami.preemption`)
over the state's own cards, usage and quotas, and the holds that keep the cards a preemptor was
nominated for from going to a lower-priority pod while its victims terminate.

Why holds: kube-scheduler protects a nominated pod's room only in its own plugins
(`RunFilterPluginsWithNominatedPods` adds the nominated pods of equal or higher priority to the node);
the extender is never told. Without a hold, the cards freed by the victims could be taken by a
lower-priority pod filtered in between, and the preemptor would have to preempt again. A hold counts,
for every pod of lower priority than the nominee, the nominee's planned cards on top of what the
victims still hold there: per card the larger of the usage now and the usage once the victims are
gone and the nominee runs, so nothing is counted twice and nothing is freed early. Pods of higher
priority do not see it (kube-scheduler counts nominated pods of equal or higher priority); neither does
the nominee itself.

Pure: no I/O. A mixin that `hami.cluster.ClusterState` inherits; it expects the state's `_lock`,
`_nodes`, `_pods`, `quota`, `vendors`, `config` and `pod_requests`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hami import fragmentation, objects
from hami.errors import InvalidRequest
from hami.fit import NodeFit, NodeView, check_card, fit_pod
from hami.model import CardGrant, DeviceUsage, Selection
from hami.pods import ContainerSpec, collapse_grants
from hami.preemption import (
    DisruptionBudget,
    NodePlan,
    Resident,
    choose_victims,
    parse_time,
    pod_priority,
)
from hami.scoring import PolicyChoice, choose_policies

if TYPE_CHECKING:
    from hami.config import DeviceConfig
    from hami.node_order import _Node
    from hami.quota import QuotaState
    from hami.vendors.base import Vendor

#: How many preemptors' plans are kept for their nomination (oldest dropped first).
_PLANS_KEPT = 1000

_ZERO = DeviceUsage()


@dataclass(frozen=True, slots=True)
class Hold:
    """Cards kept for a nominated preemptor: its planned `grants` on `node`, seen by pods of lower
    priority than `priority`; `victims` are the UIDs whose usage on those cards the grants replace."""

    uid: str
    node: str
    priority: int
    grants: tuple[CardGrant, ...]
    victims: frozenset[str]


class ClusterPreemption:
    """Preemption plans and nomination holds of `ClusterState` (a mixin: the state's lock guards all)."""

    _lock: threading.RLock
    _nodes: dict[str, _Node]
    _pods: dict[str, Any]
    quota: QuotaState
    vendors: dict[str, Vendor]
    config: DeviceConfig
    #: nominee UID -> its hold; nominee UID -> node -> the hold its plan there would be (set up by
    #: `ClusterState.__init__`).
    _holds: dict[str, Hold]
    _plans: OrderedDict[str, dict[str, Hold]]

    def pod_requests(self, pod: Mapping[str, Any]) -> list[ContainerSpec]:  # provided by ClusterState
        raise NotImplementedError

    # -- holds ---------------------------------------------------------------------------------------

    def holds(self) -> list[Hold]:
        """Every active hold (for metrics, explain and tests)."""
        with self._lock:
            return sorted(self._holds.values(), key=lambda h: (h.node, h.uid))

    def _nominated(self, pod: Mapping[str, Any]) -> None:
        """A pod event of an unplaced pod of ours: follow its `status.nominatedNodeName` (called by
        `upsert_pod` under the lock). The hold is the plan this state made for that node when asked
        to preempt; without one (another replica answered, or a restart), a plan is made now."""
        uid = objects.uid(pod)
        node = objects.status(pod).get("nominatedNodeName")
        holds = self._holds
        if not isinstance(node, str) or not node:
            holds.pop(uid, None)
            return
        old = holds.get(uid)
        if old is not None and old.node == node:
            return
        hold = self._plans.get(uid, {}).get(node)
        if hold is None:
            plans = self.plan_preemption(pod, {node: None})
            plan = plans.get(node)
            if plan is not None:
                hold = self._remember(pod, plan)
            else:
                hold = self._hold_as_is(pod, node)  # the victims are gone already: hold its room now
        if hold is None:
            holds.pop(uid, None)
        else:
            holds[uid] = hold

    def _release_hold(self, uid: str) -> None:
        """The pod was placed, deleted or ended: its hold (and plans) go."""
        self._holds.pop(uid, None)
        self._plans.pop(uid, None)

    def _held_view(self, n: _Node, uid: str, priority: int) -> NodeView:
        """`n` as a pod of `priority` (UID `uid`) sees it with the holds on it (see the module doc)."""
        holds = [
            h for h in self._holds.values() if h.node == n.name and h.uid != uid and h.priority >= priority
        ]
        if not holds:
            return n.view()
        return NodeView(
            n.name, n.devices, self._usage_with_holds(n, n.usage, holds), n.cordoned, n.pair_scores
        )

    def _usage_with_holds(
        self, n: _Node, usage: Mapping[str, DeviceUsage], holds: Sequence[Hold]
    ) -> dict[str, DeviceUsage]:
        out = dict(usage)
        for h in holds:
            going: dict[str, list[int]] = {}
            for v in h.victims:
                p = self._pods.get(v)
                if p is not None and p.node == n.name:
                    for g in p.grants:
                        t = going.setdefault(g.uuid, [0, 0, 0])
                        t[0] += g.slots
                        t[1] += g.usedmem
                        t[2] += g.usedcores
            for g in h.grants:
                u = out.get(g.uuid) or _ZERO
                s, m, c = going.get(g.uuid, (0, 0, 0))
                out[g.uuid] = DeviceUsage(
                    max(u.used, u.used - s + g.slots),
                    max(u.usedmem, u.usedmem - m + g.usedmem),
                    max(u.usedcores, u.usedcores - c + g.usedcores),
                    u.mig + tuple(p for p in g.mig if p not in u.mig),  # the MIG placements it will take
                    u.mig_unknown,
                )
        return out

    # -- plans -----------------------------------------------------------------------------------------

    def _pod_inputs(
        self, pod: Mapping[str, Any]
    ) -> tuple[list[ContainerSpec], dict[str, Selection], PolicyChoice]:
        """The pod's container requests, selections per vendor and policies, as `filter` reads them.
        Raises InvalidRequest."""
        containers = self.pod_requests(pod)
        annos = objects.annotations(pod)
        wanted = {r.vendor for c in containers for r in c.requests}
        selections = {v: self.vendors[v].selection(annos) for v in wanted}
        sched = self.config.scheduler
        policy = choose_policies(
            annos, node_default=sched.nodeSchedulerPolicy, card_default=sched.gpuSchedulerPolicy
        )
        return containers, selections, policy

    def residents(self, node: str) -> list[Resident]:
        """Every pod counted on `node` (reserved ones included), as the victim choice sees it."""
        with self._lock:
            n = self._nodes.get(node)
            if n is None:
                return []
            out = []
            for uid in sorted(n.pods):
                p = self._pods.get(uid)
                if p is not None:
                    out.append(
                        Resident(
                            uid,
                            p.namespace,
                            p.name,
                            p.priority,
                            parse_time(p.created),
                            p.grants,
                            p.cpu,
                            p.labels,
                            p.terminating,
                        )
                    )
            return out

    def plan_preemption(
        self,
        pod: Mapping[str, Any],
        candidates: Mapping[str, Sequence[str] | None],
        *,
        budgets: Sequence[DisruptionBudget] = (),
        others: Mapping[str, Resident] | None = None,
        remember: bool = False,
    ) -> dict[str, NodePlan]:
        """Per candidate node (name -> kube-scheduler's proposed victim UIDs, or None), the victims
        that let `pod` fit there by the filter's own fit, for the nodes where some set does.

        `others`: proposed victims this state does not count (UID -> Resident without grants, e.g. pods
        of another scheduler) so that they can be kept as proposed. With `remember`, the plans are kept
        for the pod's nomination (`_nominated`). Nothing is reserved. Returns {} for a pod that asks
        for no managed device or cannot be parsed.
        """
        try:
            containers, selections, policy = self._pod_inputs(pod)
        except InvalidRequest:
            return {}
        if not any(c.requests for c in containers):
            return {}
        uid, ns = objects.uid(pod), objects.namespace(pod)
        prio = pod_priority(pod)
        cpu = fragmentation.pod_cpu_milli(pod)
        out: dict[str, NodePlan] = {}
        # One node at a time under the lock: a plan needs one node's state to hold still, and filters
        # must not wait for a preemption that looks at a hundred candidates.
        for name, proposed in candidates.items():
            with self._lock:
                n = self._nodes.get(name)
                if n is None or n.unusable is not None:
                    continue
                residents = [r for r in self.residents(name) if r.uid != uid]
                known = {r.uid for r in residents}
                for u in proposed or ():
                    if u not in known and others is not None and u in others:
                        residents.append(others[u])
                plan = choose_victims(
                    name,
                    residents,
                    priority=prio,
                    trial=self._trial(n, uid, ns, prio, cpu, containers, selections, policy),
                    proposed=proposed,
                    budgets=budgets,
                    relevant=self._relevance(n, cpu, containers, selections),
                )
            if plan is not None:
                out[name] = plan
        if remember and out:
            with self._lock:
                self._remember_all(pod, out)
        return out

    def _hold_as_is(self, pod: Mapping[str, Any], node: str) -> Hold | None:
        """The hold of a nominee that fits `node` as it is (no victim left), or None."""
        n = self._nodes.get(node)
        if n is None:
            return None
        try:
            containers, selections, policy = self._pod_inputs(pod)
        except InvalidRequest:
            return None
        uid, prio = objects.uid(pod), pod_priority(pod)
        trial = self._trial(
            n,
            uid,
            objects.namespace(pod),
            prio,
            fragmentation.pod_cpu_milli(pod),
            containers,
            selections,
            policy,
        )
        fit = trial([])
        if not fit.ok:
            return None
        grants = tuple(collapse_grants(fit.devices, [c.kind for c in containers]))
        return Hold(uid, node, prio, grants, frozenset())

    def _remember_all(self, pod: Mapping[str, Any], plans: Mapping[str, NodePlan]) -> None:
        uid = objects.uid(pod)
        kept = {node: self._hold_of(pod, plan) for node, plan in plans.items()}
        self._plans[uid] = kept
        self._plans.move_to_end(uid)
        while len(self._plans) > _PLANS_KEPT:
            self._plans.popitem(last=False)

    def _remember(self, pod: Mapping[str, Any], plan: NodePlan) -> Hold:
        hold = self._hold_of(pod, plan)
        self._plans.setdefault(objects.uid(pod), {})[plan.node] = hold
        return hold

    def _hold_of(self, pod: Mapping[str, Any], plan: NodePlan) -> Hold:
        kinds = [c.kind for c in self.pod_requests(pod)]
        return Hold(
            objects.uid(pod),
            plan.node,
            pod_priority(pod),
            tuple(collapse_grants(plan.fit.devices, kinds)),
            frozenset(v.uid for v in plan.victims),
        )

    def _trial(
        self,
        n: _Node,
        uid: str,
        ns: str,
        prio: int,
        cpu: int,
        containers: Sequence[ContainerSpec],
        selections: Mapping[str, Selection],
        policy: PolicyChoice,
    ):  # noqa: ANN202 - a hami.preemption.Trial
        """The fit of the pod on `n` with some residents removed: their cards, quota and CPU freed,
        other nominees' holds still counted."""
        holds = [h for h in self._holds.values() if h.node == n.name and h.uid != uid and h.priority >= prio]
        has_quota = self.quota.has_limits(ns)
        cpu_free = n.cpu_free()

        def trial(removed: Sequence[Resident]) -> NodeFit:
            if cpu_free is not None and cpu > 0 and cpu_free + sum(r.cpu for r in removed) < cpu:
                return NodeFit(ok=False)
            usage: dict[str, DeviceUsage] = dict(n.usage)
            freed: dict[str, list[int]] = {}
            for r in removed:
                for g in r.grants:
                    u = usage.get(g.uuid)
                    if u is None:
                        continue
                    u = usage[g.uuid] = u.copy()
                    u.sub(g.usedmem, g.usedcores, g.slots, g.mig)  # a victim's MIG instances go too
                    if r.namespace == ns:
                        f = freed.setdefault(g.vendor, [0, 0])
                        f[0] += g.usedmem
                        f[1] += g.usedcores
            if holds:
                usage = self._usage_with_holds(n, usage, holds)
            quota = None
            if has_quota:

                def quota(vendor: str, mem: int, cores: int) -> bool:
                    f = freed.get(vendor, (0, 0))
                    return self.quota.fits(ns, vendor, mem - f[0], cores - f[1])

            view = NodeView(n.name, n.devices, usage, n.cordoned, n.pair_scores)
            return fit_pod(
                containers, view, vendors=self.vendors, selections=selections, policy=policy, quota=quota
            )

        return trial

    def _relevance(
        self, n: _Node, cpu: int, containers: Sequence[ContainerSpec], selections: Mapping[str, Selection]
    ):  # noqa: ANN202 - Callable[[Resident], bool]
        """Whether removing a resident can change the pod's fit on `n`: it holds a card that one of the
        pod's requests could use on an idle node (health, cordon, type and UUID rules, size), or CPU
        that the node lacks for the pod."""
        usable: set[str] = set()
        for c in containers:
            for req in c.requests:
                vendor = self.vendors[req.vendor]
                cards = n.devices.get(req.vendor, ())
                sel = selections.get(req.vendor, Selection())
                for d in cards:
                    if (
                        vendor.custom_fit
                        or check_card(
                            d,
                            _ZERO,
                            req,
                            req.memory_on(d),
                            sel,
                            vendor,
                            mutex=False,
                            cordoned=n.cordoned,
                            quota_ok=None,
                        )
                        is None
                    ):
                        usable.add(d.uuid)
        free = n.cpu_free()
        short = free is not None and cpu > 0 and free < cpu

        def relevant(r: Resident) -> bool:
            return any(g.uuid in usable for g in r.grants) or (short and r.cpu > 0)

        return relevant
