"""`hami explain`: why a pod is Pending (or where it went), from the real filter run on a `Snapshot`.

For a pending pod the scheduler extender's own filter (`ClusterState.filter`) runs against the snapshot
on every node kube-scheduler would send it (cordoned nodes are counted apart: kube-scheduler never sends
them), so every reason is the one the extender answers; the nodes are grouped by that reason and the
groups add up to every node listed. What would change the answer is found by trying, with the same
filter: the largest memory / cores / card count that fits now, the selection annotations that exclude
every card, and the fewest running pods of one node that would have to end. Each suggestion carries the
exact change, so it can be applied and checked. For a pod that outranks running pods, the pods the
extender's preempt verb would name on each node, and the node kube-scheduler would evict on.

The snapshot's state is the tool's own copy: every trial reservation is released and every pod taken
out for a trial is put back before the next one. Nothing is written to the API server.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami import objects
from hami.errors import AnnotationError, InvalidRequest, NotFound
from hami.model import PERCENTAGE_UNSET
from hami.nodelock import lock_age_s, read_node_lock
from hami.pods import ContainerSpec
from hami.preemption import pick_node, pod_priority
from hami.quota import containers_demand
from hami.reason_words import Reason
from hami.reasons import parse_reason_text, sentence
from hami.scoring import choose_policies, node_score, policy_errors
from hami.tools.render import age
from hami.tools.snapshot import Snapshot, unschedulable
from hami.vendors.nvidia_mig import mig_text

CORDONED = "node cordoned (spec.unschedulable): kube-scheduler sends it to no extender"
#: Nodes tried when looking for the fewest pods that would have to end (best free memory first).
MAX_EVICTION_NODES = 20


@dataclass(slots=True)
class ReasonGroup:
    """Nodes failing for one reason: `reason` the extender's text, `words` its sentence, `detail` a fact
    that helps (the largest free card, the excluded types, the quota)."""

    reason: str
    words: str
    nodes: list[str]
    detail: str = ""


@dataclass(slots=True)
class Suggestion:
    """A change that makes the pod fit now, found with the real filter.

    `kind`: ``memory`` / ``cores`` / ``cards`` (new per-container `limits`), ``annotations`` (remove
    `remove_annotations`), ``end-pods`` (the pods `end_pods` of `node` end). `node`: where it would go.
    """

    kind: str
    text: str
    node: str
    limits: dict[str, dict[str, str]] = field(default_factory=dict)
    remove_annotations: list[str] = field(default_factory=list)
    end_pods: list[str] = field(default_factory=list)


@dataclass(slots=True)
class PreemptionOption:
    """Where evicting lower-priority pods would make room: `victims` (namespace/name, most important
    first) on `node`, `pdb_violations` (budgets are not read by the tools: 0), `chosen` for the node
    kube-scheduler would pick among these (`hami.preemption.pick_node`)."""

    node: str
    victims: list[str]
    pdb_violations: int = 0
    chosen: bool = False


@dataclass(slots=True)
class RunnerUp:
    node: str
    score: float  # node utilisation score before the pod (0..30, hami.scoring.node_score)
    fits: bool


@dataclass(slots=True)
class Explanation:
    """`status`: ``pending`` (no node fits), ``fits-now`` (pending, but a node fits: the next retry
    places it), ``scheduled``, ``rejected`` (the admission webhook would deny it), ``no-devices``,
    ``finished``, ``other-scheduler`` (another scheduler's pod: the webhook did not run), ``bypassed``
    (``spec.nodeName`` set by hand, no card chosen)."""

    pod: str
    status: str
    phase: str
    requests: list[str]
    policy: str = ""
    nodes: int = 0
    groups: list[ReasonGroup] = field(default_factory=list)
    suggestions: list[Suggestion] = field(default_factory=list)
    quota: list[tuple[str, int, int]] = field(default_factory=list)  # (resource, used, limit)
    message: str = ""  # the webhook's message, the fitting node, ...
    node: str | None = None
    cards: dict[str, list[str]] = field(default_factory=dict)  # container -> ["uuid 8000 MiB 10 %"]
    runners_up: list[RunnerUp] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    priority: int = 0  # spec.priority
    preemption: list[PreemptionOption] = field(default_factory=list)  # pending pods: who would be evicted
    preemption_note: str = ""  # why there is nothing to preempt, when the pod outranks some pod


def describe_request(c: ContainerSpec) -> str:
    """``main: 2 NVIDIA cards, 8000 MiB and 10 % cores each`` (or ``the whole card's memory``)."""
    parts = []
    for r in c.requests:
        if r.memreq > 0:
            mem = f"{r.memreq} MiB"
        elif r.mem_percentage not in (PERCENTAGE_UNSET, 100):
            mem = f"{r.mem_percentage} % of the memory"
        else:
            mem = "the whole memory"
        each = " each" if r.nums > 1 else ""
        parts.append(
            f"{r.nums} {r.vendor} card{'s' if r.nums > 1 else ''}, {mem} and {r.coresreq} % cores{each}"
        )
    return f"{c.name}: " + "; ".join(parts)


@contextmanager
def _trial(snapshot: Snapshot, pod: Mapping[str, Any]) -> Iterator[None]:
    """Undo a trial filter's reservation on exit."""
    try:
        yield
    finally:
        snapshot.state.release_reservation(objects.uid(pod))


def _fits(snapshot: Snapshot, pod: Mapping[str, Any], names: Sequence[str]) -> str | None:
    """The node the real filter would choose for `pod` among `names` now, or None; reserves nothing."""
    with _trial(snapshot, pod):
        out = snapshot.state.filter(pod, list(names), explain=False)
    return out.node


def _schedulable(snapshot: Snapshot) -> list[str]:
    return [n for n in snapshot.node_names() if not unschedulable(snapshot.node(n) or {})]


def _usable_cards(
    snapshot: Snapshot, names: Sequence[str], vendor: str
) -> list[tuple[int, str, str, int, int]]:
    """(free MiB, node, uuid, free cores, card MiB) of healthy, uncordoned cards with a free slot."""
    stats = {(s.node, s.uuid): s for s in snapshot.state.card_stats()}
    out = []
    for n in names:
        if snapshot.state.node_unusable_reason(n):
            continue
        raw = objects.annotations(snapshot.node(n) or {}).get(A.DEVICE_CORDON, "")
        cordon = {u.strip() for u in raw.split(",")}
        for d in snapshot.devices.get(n, {}).get(vendor, []):
            s = stats.get((n, d.uuid))
            if s is None or not d.health or d.uuid in cordon or s.used >= s.count:
                continue
            out.append((s.devmem - s.usedmem, n, d.uuid, s.devcore - s.usedcores, s.devmem))
    return sorted(out, reverse=True)


def _detail(snapshot: Snapshot, reason: str, nodes: Sequence[str], containers: Sequence[ContainerSpec],
            annos: Mapping[str, str]) -> str:  # fmt: skip
    parsed = parse_reason_text(reason)
    if parsed is None:
        return ""
    counts = parsed[0]
    vendors = sorted({r.vendor for c in containers for r in c.requests})
    facts = []
    if Reason.CARD_INSUFFICIENT_MEMORY in counts:
        for v in vendors:
            cards = _usable_cards(snapshot, nodes, v)
            if cards:
                free, n, uuid, _, _ = cards[0]
                facts.append(f"largest free: {free} MiB on {n}/{uuid}")
    if Reason.CARD_TYPE_MISMATCH in counts:
        types = sorted({d.type for n in nodes for ds in snapshot.devices.get(n, {}).values() for d in ds})
        rules = [f"{k}={annos[k]}" for v in vendors for k in snapshot.state.vendors[v].user_annotation_keys()
                 if k in annos and "type" in k]  # fmt: skip
        facts.append(f"type {', '.join(types)} excluded by {', '.join(rules) or 'the pod'}")
    return "; ".join(facts)


def _locks(snapshot: Snapshot, names: Sequence[str]) -> list[str]:
    out = []
    for n in names:
        try:
            lock = read_node_lock(snapshot.node(n) or {})
        except AnnotationError:
            continue
        if lock is not None:
            who = f"{lock.namespace}/{lock.name}" if lock.name else "an unnamed pod"
            held = lock_age_s(lock, now=snapshot.now)
            if held > snapshot.lock_timeout_s:
                out.append(
                    f"{n}: node lock of {who} expired (held {age(held)}, past the {age(snapshot.lock_timeout_s)} "
                    "lock timeout): the next bind takes it over"
                )
            else:
                out.append(f"{n}: node lock held by {who} for {age(held)} (binds to it wait)")
    return out


def _with_limits(pod: Mapping[str, Any], limits: Mapping[str, Mapping[str, str | None]]) -> dict[str, Any]:
    """A copy of `pod` with container limits changed (None removes a resource); requests follow."""
    p = copy.deepcopy(dict(pod))
    p["metadata"]["uid"] = objects.uid(pod) + "-trial"
    for field_ in ("initContainers", "containers"):
        for c in p.get("spec", {}).get(field_) or []:
            change = limits.get(c.get("name", ""))
            if not change:
                continue
            for part in ("limits", "requests"):
                res = c.setdefault("resources", {}).get(part)
                if part == "requests" and res is None:
                    continue
                res = c["resources"].setdefault(part, {})
                for k, v in change.items():
                    if v is None:
                        res.pop(k, None)
                    else:
                        res[k] = v
    return p


def _smaller_requests(snapshot: Snapshot, pod: Mapping[str, Any], containers: Sequence[ContainerSpec],
                      names: Sequence[str], counts: Mapping[Reason, int]) -> list[Suggestion]:  # fmt: skip
    """The largest memory, cores and card count (one at a time, for every device container) that fits now."""
    out: list[Suggestion] = []
    dev = [c for c in containers if c.requests]
    if not dev:
        return out
    vendor = snapshot.state.vendors[dev[0].requests[0].vendor]
    rn = vendor.resource_names()
    cards = _usable_cards(snapshot, names, vendor.common_word)
    asked_mem = max((r.memreq if r.memreq > 0 else 0) for c in dev for r in c.requests)
    if (
        rn.memory
        and cards
        and (Reason.CARD_INSUFFICIENT_MEMORY in counts or Reason.NODE_INSUFFICIENT_DEVICE not in counts)
    ):
        values_set = {free for free, *_ in cards if free > 0 and (asked_mem == 0 or free < asked_mem)}
        if Reason.RESOURCE_QUOTA_NOT_FIT in counts:
            # The room left under the namespace's memory limit, shared by every card the pod asks.
            ns = objects.namespace(pod)
            limit = snapshot.state.quota.limit(ns, rn.memory)
            if limit is not None:
                cards_asked = sum(r.nums for c in dev for r in c.requests)
                room = (limit * rn.memory_factor - snapshot.state.quota.used(ns, rn.memory)) // max(
                    cards_asked, 1
                )
                if 0 < room and (asked_mem == 0 or room < asked_mem):
                    values_set.add(room)
        values = sorted(values_set, reverse=True)
        for v in values[:64]:
            change: dict[str, dict[str, str | None]] = {c.name: {rn.memory: str(v)} for c in dev}
            if rn.memory_percentage:
                for ch in change.values():
                    ch[rn.memory_percentage] = None
            node = _fits(snapshot, _with_limits(pod, change), names)
            if node:
                was = f"{asked_mem} MiB" if asked_mem else "a whole card"
                out.append(Suggestion("memory", f"asking {rn.memory}: {v} instead of {was} per card fits now on {node}",
                                      node, limits={k: {r: x for r, x in ch.items() if x is not None} for k, ch in change.items()}))  # fmt: skip
                break
    asked_cores = max(r.coresreq for c in dev for r in c.requests)
    if (
        rn.cores
        and cards
        and (Reason.CARD_INSUFFICIENT_CORE in counts or Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT in counts)
    ):
        values = sorted({fc for _, _, _, fc, _ in cards if 0 <= fc < asked_cores}, reverse=True)
        for v in values[:64]:
            change2 = {c.name: {rn.cores: str(v)} for c in dev}
            node = _fits(snapshot, _with_limits(pod, change2), names)
            if node:
                out.append(Suggestion("cores", f"asking {rn.cores}: {v} instead of {asked_cores} fits now on {node}",
                                      node, limits={k: dict(x) for k, x in change2.items()}))  # fmt: skip
                break
    asked_nums = max(r.nums for c in dev for r in c.requests)
    for n in range(asked_nums - 1, 0, -1):
        change3 = {c.name: {rn.count: str(n)} for c in dev}
        node = _fits(snapshot, _with_limits(pod, change3), names)
        if node:
            out.append(Suggestion("cards", f"asking {rn.count}: {n} instead of {asked_nums} fits now on {node}",
                                  node, limits={k: dict(x) for k, x in change3.items()}))  # fmt: skip
            break
    return out


def _without_selection(snapshot: Snapshot, pod: Mapping[str, Any], containers: Sequence[ContainerSpec],
                       names: Sequence[str]) -> list[Suggestion]:  # fmt: skip
    annos = objects.annotations(pod)
    keys = [k for c in containers for r in c.requests for k in snapshot.state.vendors[r.vendor].user_annotation_keys()
            if k in annos and ("type" in k or "uuid" in k)]  # fmt: skip
    keys = list(dict.fromkeys(keys))
    if not keys:
        return []
    p = copy.deepcopy(dict(pod))
    p["metadata"]["uid"] = objects.uid(pod) + "-trial"
    for k in keys:
        p["metadata"]["annotations"].pop(k, None)
    node = _fits(snapshot, p, names)
    if node is None:
        return []
    return [
        Suggestion(
            "annotations", f"without {', '.join(keys)} it fits now on {node}", node, remove_annotations=keys
        )
    ]


def _pods_to_end(
    snapshot: Snapshot, pod: Mapping[str, Any], names: Sequence[str], vendor: str
) -> Suggestion | None:
    """The node where the fewest running pods (then the least memory) would have to end for `pod` to fit.

    Pods of a node are taken out largest memory first until the filter accepts the pod there.
    """
    state = snapshot.state
    free_by_node: dict[str, int] = defaultdict(int)
    for s in state.card_stats():
        if s.node in names and s.vendor == vendor and s.health and not state.node_unusable_reason(s.node):
            free_by_node[s.node] += s.devmem - s.usedmem
    # Nodes the extender places nothing on, or without a healthy card, cannot be helped by ending pods.
    tried = sorted(free_by_node, key=lambda n: (-free_by_node[n], n))[:MAX_EVICTION_NODES]
    grants = {(ns, name): (nd, sum(g.usedmem for g in gs)) for ns, name, nd, gs in state.pod_grants()}
    best: tuple[int, int, str, list[str]] | None = None
    for n in tried:
        on_node = sorted(
            (p for p in snapshot.pods_on(n) if objects.uid(p) != objects.uid(pod)),
            key=lambda p: (-grants.get((objects.namespace(p), objects.name(p)), ("", 0))[1], objects.ref(p)),
        )
        removed: list[dict[str, Any]] = []
        try:
            for victim in on_node:
                state.remove_pod(objects.uid(victim))
                removed.append(victim)
                if best is not None and len(removed) > best[0]:
                    break
                if _fits(snapshot, pod, [n]):
                    mem = sum(
                        grants.get((objects.namespace(v), objects.name(v)), ("", 0))[1] for v in removed
                    )
                    cand = (len(removed), mem, n, [objects.ref(v) for v in removed])
                    if best is None or cand[:3] < best[:3]:
                        best = cand
                    break
        finally:
            for victim in removed:
                state.upsert_pod(victim)
    if best is None:
        return None
    k, mem, n, refs = best
    return Suggestion("end-pods", f"on {n}, if {', '.join(refs)} ended ({mem} MiB)", n, end_pods=refs)


def _preemption(snapshot: Snapshot, pod: Mapping[str, Any], names: Sequence[str], ex: Explanation) -> None:
    """Per node, the lower-priority pods the extender's preempt verb would name for `pod`
    (`ClusterState.plan_preemption`), and the node kube-scheduler would pick among them."""
    if (objects.spec(pod).get("preemptionPolicy") or "") == "Never":
        ex.preemption_note = "preemptionPolicy Never: the pod waits and evicts nobody"
        return
    plans = snapshot.state.plan_preemption(pod, dict.fromkeys(names))
    best = pick_node(plans)
    for node in sorted(plans, key=lambda n: (best is None or n != best.node, n)):
        plan = plans[node]
        refs = [f"{v.namespace}/{v.name}" for v in plan.victims]
        chosen = best is not None and node == best.node
        ex.preemption.append(PreemptionOption(node, refs, plan.pdb_violations, chosen))
    if not plans and any(r.priority < ex.priority for n in names for r in snapshot.state.residents(n)):
        ex.preemption_note = "evicting the pods of lower priority frees no card the pod fits on, on any node"


def _annotation_mistakes(snapshot: Snapshot, pod: Mapping[str, Any]) -> list[str]:
    """Resource names written as pod annotations: the scheduler reads only `resources.limits`, so such a pod
    silently asks for the defaults (for memory: a whole card)."""
    annos = objects.annotations(pod)
    names = {n for v in snapshot.state.vendors.values() for n in v.resource_names().all()}
    return [
        f"{k} is a pod annotation here; only resources.limits count, so it is ignored (move it to the "
        "container's resources.limits)"
        for k in sorted(annos)
        if k in names
    ]


def _rejection(snapshot: Snapshot, pod: Mapping[str, Any], containers: Sequence[ContainerSpec]) -> str | None:
    """The admission webhook's denial by the core's rules it applies: policy annotations, the quota
    pre-check (the pod alone over a namespace limit)."""
    errs = policy_errors(objects.annotations(pod))
    if errs:
        return "; ".join(str(e) for e in errs)
    return snapshot.state.quota.exceeds_alone(objects.namespace(pod), containers_demand(containers))


def _cards_of(snapshot: Snapshot, pod: Mapping[str, Any]) -> dict[str, list[str]]:
    from hami import pods as podrules

    names = podrules.container_names(pod)
    annos = objects.annotations(pod)
    out: dict[str, list[str]] = {}
    for v in snapshot.state.vendors.values():
        try:
            lists = v.pod_devices(annos, len(names))
        except AnnotationError:
            continue
        for i, cds in enumerate(lists or ()):
            if cds and i < len(names):
                out.setdefault(names[i], []).extend(
                    f"{d.uuid} {d.usedmem} MiB {d.usedcores} %" + (f" ({mig_text(d.mig)})" if d.mig else "")
                    for d in cds
                )
    return out


def _scheduled(snapshot: Snapshot, pod: Mapping[str, Any], ex: Explanation) -> Explanation:
    """Where the pod went, and how the other nodes compare (fit and score without this pod)."""
    state = snapshot.state
    ex.status = "scheduled"
    ex.node = objects.node_name(pod) or objects.annotations(pod).get(A.ASSIGNED_NODE)
    ex.cards = _cards_of(snapshot, pod)
    # Node scores before the pod (it is on none of the other nodes), summed once per node.
    sums: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0, 0])
    for st in state.card_stats():
        t = sums[st.node]
        for i, v in enumerate((st.count, st.used, st.devcore, st.usedcores, st.devmem, st.usedmem)):
            t[i] += v
    names = [n for n in _schedulable(snapshot) if n != ex.node]
    uid = objects.uid(pod)
    state.remove_pod(uid)
    try:
        for n in names:
            trial = copy.deepcopy(dict(pod))
            trial["metadata"]["uid"] = uid + "-trial"
            fits = _fits(snapshot, trial, [n]) is not None
            ex.runners_up.append(RunnerUp(n, round(node_score(*sums[n]), 2), fits))
    finally:
        state.upsert_pod(pod)
    ex.runners_up.sort(
        key=lambda r: (not r.fits, -r.score if "binpack" in ex.policy.split(" ")[0] else r.score, r.node)
    )
    return ex


def explain_pod(snapshot: Snapshot, namespace: str, name: str) -> Explanation:
    """Explain pod `namespace`/`name` of the snapshot. Raises NotFound when it is not there."""
    pod = snapshot.pod(namespace, name)
    if pod is None:
        raise NotFound(f"pod {namespace}/{name} not found")
    ref = f"{namespace}/{name}"
    state = snapshot.state
    phase = objects.phase(pod) or "Pending"
    ex = Explanation(ref, "pending", phase, [])
    try:
        containers = state.pod_requests(pod)
    except InvalidRequest as e:
        ex.status, ex.message = "rejected", str(e)
        return ex
    ex.requests = [describe_request(c) for c in containers if c.requests]
    if not ex.requests:
        ex.status, ex.message = "no-devices", "the pod asks for no device this scheduler manages"
        return ex
    sched = state.config.scheduler
    policy = choose_policies(objects.annotations(pod), node_default=sched.nodeSchedulerPolicy,
                             card_default=sched.gpuSchedulerPolicy)  # fmt: skip
    ex.policy = f"{policy.node.value} nodes, {','.join(p.value for p in policy.cards)} cards"
    ex.warnings = list(policy.warnings)
    if phase in ("Succeeded", "Failed"):
        ex.status, ex.message = "finished", f"the pod has finished (phase {phase}) and holds no card"
        return ex
    ex.warnings += _annotation_mistakes(snapshot, pod)
    if state.pod_node(objects.uid(pod)) is not None:
        return _scheduled(snapshot, pod, ex)
    want = state.scheduler_name
    if want and objects.scheduler_name(pod) != want:
        ex.status = "other-scheduler"
        ex.message = (
            f"spec.schedulerName is {objects.scheduler_name(pod)!r}, not {want!r}: this scheduler never sees the pod; "
            "the admission webhook sets it for device pods, so check that the webhook ran (its failurePolicy, "
            "certificate and namespaceSelector, a hami.io/webhook: ignore label)"
        )
        return ex
    if objects.node_name(pod):
        ex.status, ex.node = "bypassed", objects.node_name(pod)
        ex.message = (
            f"spec.nodeName {ex.node!r} was set without the scheduler: no card was chosen for it, so the device "
            "plugin cannot allocate; remove spec.nodeName (use a nodeSelector) and create the pod again"
        )
        return ex
    rejected = _rejection(snapshot, pod, containers)
    if rejected:
        ex.status, ex.message = "rejected", rejected
        return ex
    all_nodes = snapshot.node_names()
    sent = _schedulable(snapshot)
    ex.nodes = len(all_nodes)
    with _trial(snapshot, pod):
        out = state.filter(pod, sent)
    if out.error:
        ex.status, ex.message = "rejected", out.error
        return ex
    if out.node is not None:
        ex.status, ex.node = "fits-now", out.node
        ex.message = f"fits now on {out.node}: the scheduler places it at its next retry"
        return ex
    failed: dict[str, list[str]] = defaultdict(list)
    for n in sent:
        failed[out.failed_nodes.get(n, "no fit")].append(n)
    annos = objects.annotations(pod)
    counts_all: dict[Reason, int] = defaultdict(int)
    for reason, nodes in sorted(failed.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        parsed = parse_reason_text(reason)
        words = sentence(parsed[0], parsed[1], containers) if parsed else ""
        if parsed:
            for r, k in parsed[0].items():
                counts_all[r] += k
        ex.groups.append(
            ReasonGroup(reason, words, sorted(nodes), _detail(snapshot, reason, nodes, containers, annos))
        )
    cordoned = [n for n in all_nodes if n not in sent]
    if cordoned:
        ex.groups.append(ReasonGroup(CORDONED, "", cordoned))
    if Reason.RESOURCE_QUOTA_NOT_FIT in counts_all or state.quota.has_limits(namespace):
        ex.quota = [(res, used, limit) for ns, res, used, limit in state.quota_stats() if ns == namespace]
    ex.warnings += _locks(snapshot, sent)
    ex.priority = pod_priority(pod)
    _preemption(snapshot, pod, sent, ex)
    ex.suggestions = _smaller_requests(snapshot, pod, containers, sent, counts_all)
    if Reason.CARD_TYPE_MISMATCH in counts_all or Reason.CARD_UUID_MISMATCH in counts_all:
        ex.suggestions += _without_selection(snapshot, pod, containers, sent)
    if Reason.RESOURCE_QUOTA_NOT_FIT not in counts_all:
        end = _pods_to_end(snapshot, pod, sent, containers[0].requests[0].vendor if containers[0].requests
                           else next(r.vendor for c in containers for r in c.requests))  # fmt: skip
        if end is not None:
            ex.suggestions.append(end)
    return ex
