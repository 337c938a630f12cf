"""Device-aware preemption: which pods to evict on one node so that a higher-priority pod fits its cards.

Why this exists: kube-scheduler's DefaultPreemption counts `nvidia.com/gpu` as whole units and knows
nothing of memory, cores and slots per card, so on its own it either evicts pods that do not free a
card the preemptor can use, or finds no victims at all (docs/scheduler-extender.md, "Preemption").
kube-scheduler hands its candidate nodes and proposed victims to the extender's preempt verb; this
module decides, per node, the victims that really free cards, by the very fit the filter uses
(`hami.fit.fit_pod` through a caller's `Trial`, so memory, cores, sharer slots, type and UUID rules,
NUMA, several cards and quotas are judged once, in one place).

The choice on one node (kube-scheduler's rules where it has one, `SelectVictimsOnNode` and
`pickOneNodeForPreemption` in pkg/scheduler/framework/plugins/defaultpreemption and
pkg/scheduler/framework/preemption):
- only pods of strictly lower priority are victims;
- a victim kube-scheduler proposed that holds no card of the node stays a victim: it was proposed for
  something this module does not see (memory, host ports, inter-pod affinity);
- a lower-priority pod already terminating is going anyway: it is always part of the set, free;
- among the sets that let the preemptor fit, the best has the fewest PodDisruptionBudget violations,
  then the fewest pods, then the lowest highest priority, then the lowest sum of priorities, then the
  most recently created pods (the longest-running work is kept);
- a node where even removing every lower-priority pod does not make room gets no plan.

Pure: no I/O; the caller builds the residents, the budgets and the trial from its state.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hami import objects
from hami.fit import NodeFit
from hami.model import CardGrant, Device
from hami.vendors.base import ResourceNames

#: Fit trials one node's search may spend on exact minimal sets before it settles for kube-scheduler's
#: own greedy reprieve (a set from which no pod can be given back, not always the smallest).
DEFAULT_MAX_TRIALS = 512


def pod_priority(pod: Mapping[str, Any]) -> int:
    """`spec.priority` (the admission controller resolves `priorityClassName` into it); 0 when unset,
    as kube-scheduler's `corev1helpers.PodPriority` reads it."""
    value = objects.spec(pod).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def pod_created(pod: Mapping[str, Any]) -> float:
    """The pod's start time in Unix seconds (`pod_start`); 0.0 when absent or not RFC 3339."""
    return parse_time(pod_start(pod))


def pod_start(pod: Mapping[str, Any]) -> str | None:
    """`status.startTime` (set by the kubelet), else `metadata.creationTimestamp`, as written: the time
    kube-scheduler's `GetPodStartTime` orders victims by."""
    start = objects.status(pod).get("startTime")
    return start if isinstance(start, str) and start else objects.meta(pod).get("creationTimestamp")


def parse_time(value: Any) -> float:
    """An API `Time` (``2026-11-29T12:00:00Z``) in Unix seconds; 0.0 when not one."""
    if not isinstance(value, str) or not value:
        return 0.0
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def is_terminating(pod: Mapping[str, Any]) -> bool:
    """Graceful deletion has begun (`metadata.deletionTimestamp`): the containers still run, and hold
    their cards, until the kubelet reports them gone and the pod object is removed."""
    return bool(objects.meta(pod).get("deletionTimestamp"))


@dataclass(frozen=True, slots=True)
class Resident:
    """A pod counted on the node, as the victim choice sees it.

    `priority` is `spec.priority`; `created` its start time in Unix seconds (`pod_start`; 0 unknown); `grants` what it holds per card
    (`hami.pods.collapse_grants`); `cpu` its CPU request in millicores; `terminating` True once its
    deletion has begun.
    """

    uid: str
    namespace: str
    name: str
    priority: int = 0
    created: float = 0.0
    grants: tuple[CardGrant, ...] = ()
    cpu: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    terminating: bool = False


def more_important(a: Resident) -> tuple[int, float, str]:
    """Sort key, most important first: higher priority, then created earlier (kube-scheduler's
    `util.MoreImportantPod`, whose tie-break is the start time)."""
    return (-a.priority, a.created, a.uid)


# -- PodDisruptionBudgets ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Requirement:
    """One `matchExpressions` entry: `operator` In, NotIn, Exists or DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        return False  # an operator the API would have refused: match nothing


@dataclass(frozen=True, slots=True)
class DisruptionBudget:
    """A policy/v1 PodDisruptionBudget as preemption reads it.

    `selector` None is a nil selector (matches no pod); an empty one matches every pod of the namespace
    (policy/v1 semantics). `disruptions_allowed` is `status.disruptionsAllowed`, `disrupted` the pod
    names in `status.disruptedPods` (evictions the API server already counted).
    """

    namespace: str
    name: str
    selector: tuple[tuple[tuple[str, str], ...], tuple[Requirement, ...]] | None
    disruptions_allowed: int
    disrupted: frozenset[str] = frozenset()

    @classmethod
    def from_object(cls, pdb: Mapping[str, Any]) -> DisruptionBudget:
        """From the API object; fields of the wrong type read as absent (a nil selector matches none)."""
        spec = pdb.get("spec") if isinstance(pdb.get("spec"), Mapping) else {}
        status = pdb.get("status") if isinstance(pdb.get("status"), Mapping) else {}
        raw = spec.get("selector")
        selector = None
        if isinstance(raw, Mapping):
            ml = raw.get("matchLabels") if isinstance(raw.get("matchLabels"), Mapping) else {}
            exprs = []
            for e in raw.get("matchExpressions") or ():
                if isinstance(e, Mapping) and isinstance(e.get("key"), str):
                    vals = tuple(str(v) for v in e.get("values") or ())
                    exprs.append(Requirement(e["key"], str(e.get("operator", "")), vals))
            selector = (tuple(sorted((str(k), str(v)) for k, v in ml.items())), tuple(exprs))
        allowed = status.get("disruptionsAllowed")
        disrupted = status.get("disruptedPods")
        return cls(
            namespace=objects.namespace(pdb),
            name=objects.name(pdb),
            selector=selector,
            disruptions_allowed=allowed if isinstance(allowed, int) and not isinstance(allowed, bool) else 0,
            disrupted=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
        )

    def covers(self, pod: Resident) -> bool:
        if self.selector is None or pod.namespace != self.namespace:
            return False
        match_labels, exprs = self.selector
        return all(pod.labels.get(k) == v for k, v in match_labels) and all(
            r.matches(pod.labels) for r in exprs
        )


def pdb_violations(victims: Sequence[Resident], budgets: Sequence[DisruptionBudget]) -> int:
    """How many of `victims` evicting all of them would violate a budget, counted as kube-scheduler's
    `filterPodsWithPDBViolation` does: most important victim first, each covering budget's allowance
    taken by one (a pod the API server already counted as disrupted takes none), and a pod whose budget
    is then overdrawn violates it."""
    if not budgets:
        return 0
    allowed = [b.disruptions_allowed for b in budgets]
    count = 0
    for v in sorted(victims, key=more_important):
        violated = False
        for i, b in enumerate(budgets):
            if not b.covers(v) or v.name in b.disrupted:
                continue
            allowed[i] -= 1
            if allowed[i] < 0:
                violated = True
        count += violated
    return count


# -- the choice on one node ------------------------------------------------------------------------------

#: With these residents removed from the node, the preemptor's fit there (the caller's `fit_pod`).
Trial = Callable[[Sequence[Resident]], NodeFit]


@dataclass(frozen=True, slots=True)
class NodePlan:
    """The victims on one node and where the preemptor's containers go once they are gone.

    `victims` are ordered most important first (kube-scheduler reads `Pods[0]` as the highest-priority
    victim). `kept` are the UIDs of victims kube-scheduler proposed and that hold no card here (kept as
    proposed), `added` the UIDs this choice added to kube-scheduler's proposal, `dropped` the proposed
    UIDs it did not need. `exact` is False when the search ran out of trials and the set is
    kube-scheduler's greedy one (no victim can be spared, but a smaller set may exist).
    """

    node: str
    victims: tuple[Resident, ...]
    pdb_violations: int
    fit: NodeFit
    kept: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    exact: bool = True


def _key(chosen: Sequence[Resident], base: Sequence[Resident], budgets: Sequence[DisruptionBudget]) -> tuple:
    """Smaller is better: PDB violations, pods, highest priority, priority sum, then most recent."""
    every = [*base, *chosen]
    # The set whose earliest-created pod is the newest wins (then the next earliest, ...): the
    # longest-running work survives, as kube-scheduler's latest-start-time rule between nodes.
    recency = tuple(-c for c in sorted(v.created for v in chosen))
    return (
        pdb_violations(every, budgets),
        len(chosen),
        max((v.priority for v in chosen), default=-math.inf),
        sum(v.priority for v in chosen),
        recency,
        tuple(sorted(v.uid for v in chosen)),
    )


def choose_victims(
    node: str,
    residents: Sequence[Resident],
    *,
    priority: int,
    trial: Trial,
    proposed: Sequence[str] | None = None,
    budgets: Sequence[DisruptionBudget] = (),
    relevant: Callable[[Resident], bool] | None = None,
    max_trials: int = DEFAULT_MAX_TRIALS,
) -> NodePlan | None:
    """The victims on `node` for a preemptor of `priority`, or None when no set of lower-priority pods
    makes room (or the preemptor fits already: there is nothing to preempt there).

    `residents`: every pod counted on the node. `proposed`: kube-scheduler's victim UIDs for the node
    (None or empty: none proposed; the choice starts from scratch; a UID that is not a resident is
    ignored, so callers list proposed pods they do not count as residents without grants). `relevant(r)`: whether removing
    `r` can change the fit at all (it holds a card the preemptor could use, or CPU it lacks); pods it
    rejects are never added (None: every lower-priority pod may be). The search tries sets in order of
    size and stops after `max_trials` fits, then takes kube-scheduler's greedy set.
    """
    by_uid = {r.uid: r for r in residents}
    lower = [r for r in residents if r.priority < priority]
    proposed_set = [u for u in dict.fromkeys(proposed or ()) if u]
    # Kept as proposed: victims holding no card here (kube-scheduler's reason is one we cannot see).
    kept = [
        by_uid[u]
        for u in proposed_set
        if u in by_uid and not by_uid[u].grants and by_uid[u].priority < priority
    ]
    base = list({r.uid: r for r in [*(r for r in lower if r.terminating), *kept]}.values())
    base_ids = {r.uid for r in base}
    pool = [r for r in lower if r.uid not in base_ids and (relevant is None or relevant(r))]
    # Least important first: the first sets of each size tried are the likeliest best.
    pool.sort(key=more_important, reverse=True)
    if not trial([*base, *pool]).ok:
        return None
    trials = 1
    best: tuple[tuple, tuple[Resident, ...], NodeFit] | None = None
    exact = True
    for size in range(0, len(pool) + 1):
        if size == 0 and not base:
            if trial([]).ok:
                return None  # fits as the node is: nothing to preempt here
            trials += 1
            continue
        for combo in itertools.combinations(pool, size):
            if trials >= max_trials:
                exact = False
                break
            key = _key(combo, base, budgets)
            if best is not None and key >= best[0]:
                continue
            trials += 1
            fit = trial([*base, *combo])
            if fit.ok:
                best = (key, combo, fit)
        if not exact or (best is not None and best[0][0] == 0):
            break  # no smaller set exists, and no larger one can violate fewer budgets than none
    if best is None:
        chosen, fit = _greedy(base, pool, trial)
    else:
        chosen, fit = list(best[1]), best[2]
    victims = tuple(sorted([*base, *chosen], key=more_important))
    ids = {v.uid for v in victims}
    proposed_ids = set(proposed_set)
    return NodePlan(
        node=node,
        victims=victims,
        pdb_violations=pdb_violations(victims, budgets),
        fit=fit,
        kept=tuple(r.uid for r in kept),
        added=tuple(v.uid for v in victims if v.uid not in proposed_ids) if proposed_set else (),
        dropped=tuple(u for u in proposed_set if u in by_uid and u not in ids),
        exact=exact,
    )


def _greedy(base: list[Resident], pool: list[Resident], trial: Trial) -> tuple[list[Resident], NodeFit]:
    """kube-scheduler's reprieve (`SelectVictimsOnNode`): remove every candidate, then give back the
    most important ones first while the preemptor still fits."""
    removed = list(pool)
    fit = trial([*base, *removed])
    for r in sorted(pool, key=more_important):
        without = [x for x in removed if x is not r]
        f = trial([*base, *without])
        if f.ok:
            removed, fit = without, f
    return removed, fit


# -- what kube-scheduler must count for its dry run to find victims ---------------------------------------


def advertised_totals(cards: Sequence[Device], names: ResourceNames) -> dict[str, int]:
    """The node-level extended resources that let kube-scheduler's own preemption dry run see a node as
    full: the cards' memory in the unit pods request it (`names.memory`: MiB / `memory_factor`) and
    their cores in percent (`names.cores`), summed over the node's cards. {} without cards.

    Why sums: kube-scheduler's NodeResourcesFit adds up each pod's per-container request, which is
    never more than what the pod holds on its cards (a two-card pod asking 8000 MiB holds 16000), so
    with these capacities neither kube-scheduler nor the kubelet's admission ever refuses a pod the
    extender's per-card fit accepts, while a node whose requests add up to its totals is full for
    kube-scheduler too, so its dry run removes lower-priority pods and calls the preempt verb.
    """
    if not cards:
        return {}
    out: dict[str, int] = {}
    if names.memory:
        out[names.memory] = sum(d.devmem for d in cards) // max(1, names.memory_factor)
    if names.cores:
        out[names.cores] = sum(d.devcore for d in cards)
    return out


def pick_node(plans: Mapping[str, NodePlan]) -> NodePlan | None:
    """The node kube-scheduler evicts on among the extender's plans (`pickOneNodeForPreemption`): the
    fewest PDB violations, then the lowest highest victim priority, the lowest sum of priorities, the
    fewest victims, the latest earliest-creation among the highest-priority victims, then the first
    name. None without plans."""

    def key(p: NodePlan) -> tuple:
        top = max(v.priority for v in p.victims)
        earliest = min(v.created for v in p.victims if v.priority == top)
        return (
            p.pdb_violations,
            top,
            sum(v.priority + 2**31 for v in p.victims),
            len(p.victims),
            -earliest,
            p.node,
        )

    usable = [p for p in plans.values() if p.victims]
    return min(usable, key=key) if usable else None
