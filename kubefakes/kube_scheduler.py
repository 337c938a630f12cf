"""A kube-scheduler stand-in for tests: one scheduling cycle at a time, kube-scheduler's own sequence,
the extender over real HTTP with the JSON kube-scheduler sends.

Why: whether preemption ever reaches the extender depends on what kube-scheduler does before calling
it, so the extender's preempt verb can only be tested end to end against something that does the same.
The sequence and rules follow kube-scheduler 1.23-1.33 (pkg/scheduler/schedule_one.go,
pkg/scheduler/framework/plugins/defaultpreemption, pkg/scheduler/framework/preemption):

1. a pod with `status.nominatedNodeName` tries that node first (`evaluateNominatedNode`);
2. the framework filter (NodeResourcesFit here: cpu, memory, pods and every extended resource not
   `ignoredByScheduler`, requests of the node's pods plus nominated pods of equal or higher
   priority), then the extender's filter with the feasible node names (or Node objects); its
   `FailedNodes` are Unschedulable, `FailedAndUnresolvable` UnschedulableAndUnresolvable;
3. one node passes: bind through the extender;
4. none: DefaultPreemption's PostFilter: `PodEligibleToPreemptOthers` (not `preemptionPolicy: Never`;
   not while a lower-priority pod on the nominated node is terminating), the potential nodes (every
   node not UnschedulableAndUnresolvable), `SelectVictimsOnNode` on each (remove every lower-priority
   pod, filter, then reprieve the most important first, PDB-violating ones before the others), a node
   with no victims is dropped (`placeholders` True: kept with an empty list, as kube-scheduler does
   since kubernetes/kubernetes#135486), the preempt verb with the candidates (`callExtenders`: every
   victim the extender names must be a pod on that node, every node it keeps must have one),
   `pickOneNodeForPreemption`, then `prepareCandidate`: the DisruptionTarget condition and a graceful
   DELETE per victim, lower-priority nominations on the node cleared, and the preemptor's
   `status.nominatedNodeName` set.

Reads come from the in-memory API server's store (kube-scheduler's informer cache); writes go through
it too. Not modelled: other filter plugins (affinity, taints, ports, volumes), scoring, the queue.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import aiohttp

from hami import pods as podrules
from hami.errors import InvalidRequest
from hami.preemption import parse_time, pod_priority
from hami.quantity import parse_quantity
from kubefakes.apiserver import FakeApiServer

UNSCHEDULABLE = "Unschedulable"
UNRESOLVABLE = "UnschedulableAndUnresolvable"
#: Resources NodeResourcesFit always counts (plus every extended resource not ignored).
_BASE = ("cpu", "memory", "ephemeral-storage")


@dataclass(slots=True)
class Cycle:
    """What one scheduling cycle did. `result`: bound, nominated, unschedulable or error.

    `preempt_args` / `preempt_reply`: the preempt verb's request and answer (None when not called).
    `victims`: the victims evicted (pod names, most important first). `statuses`: per node the
    (code, message) the filters gave.
    """

    result: str
    node: str | None = None
    message: str = ""
    victims: list[str] = field(default_factory=list)
    statuses: dict[str, tuple[str, str]] = field(default_factory=dict)
    proposed: dict[str, list[str]] | None = None
    preempt_args: dict[str, Any] | None = None
    preempt_reply: dict[str, Any] | None = None


def _qty(value: Any, resource: str) -> Fraction:
    try:
        return parse_quantity(value, resource=resource)[0]
    except (InvalidRequest, ValueError):
        return Fraction(0)


def pod_requests(pod: Mapping[str, Any]) -> dict[str, Fraction]:
    """kube-scheduler's `computePodResourceRequest`: per resource the larger of (app containers and
    sidecars summed) and (each init container with the sidecars before it); requests, else limits
    (the API server copies limits into unset requests)."""
    per: dict[str, list[tuple[podrules.ContainerKind, float]]] = {}
    for kind, c in podrules.entries(pod):
        res = c.get("resources") or {}
        values = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        for r, v in values.items():
            per.setdefault(r, []).append((kind, float(_qty(v, r))))
        for r in per:
            if r not in values:
                per[r].append((kind, 0.0))
    return {r: Fraction(podrules.peak(v)).limit_denominator(1000) for r, v in per.items()}


class KubeSchedulerStandIn:
    """One profile and one extender (`url`), as the chart configures kube-scheduler.

    `ignored`: the managed resources with `ignoredByScheduler: true`. `cache_capable`:
    `nodeCacheCapable`. `preempt`: whether `preemptVerb` is set. `placeholders`: keep nodes with no
    victims as empty candidates for the preempt verb (kube-scheduler with kubernetes/kubernetes#135486).
    `after_bind(pod, node)`: what the node does next (the device plugin's Allocate, in tests).
    """

    def __init__(
        self,
        api: FakeApiServer,
        session: aiohttp.ClientSession,
        url: str,
        *,
        ignored: Sequence[str] = (),
        cache_capable: bool = True,
        preempt: bool = True,
        placeholders: bool = False,
        scheduler_name: str = "hami-scheduler",
        after_bind: Callable[[dict[str, Any], str], Awaitable[None] | None] | None = None,
    ) -> None:
        self.api = api
        self.session = session
        self.url = url.rstrip("/")
        self.ignored = frozenset(ignored)
        self.cache_capable = cache_capable
        self.preempt_verb = preempt
        self.placeholders = placeholders
        self.scheduler_name = scheduler_name
        self.after_bind = after_bind
        self.calls: list[tuple[str, dict[str, Any]]] = []

    # -- the cache -----------------------------------------------------------------------------------

    def _nodes(self) -> list[dict[str, Any]]:
        return sorted(self.api.store.list("nodes"), key=lambda n: n["metadata"]["name"])

    def _pods_on(self, node: str) -> list[dict[str, Any]]:
        return [
            p
            for p in self.api.store.list("pods")
            if (p.get("spec") or {}).get("nodeName") == node and not podrules.is_terminal(p)
        ]

    def _nominated_on(self, node: str, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Pods nominated to `node` that kube-scheduler adds when filtering `pod` (priority >= its)."""
        prio, uid = pod_priority(pod), pod["metadata"]["uid"]
        return [
            p
            for p in self.api.store.list("pods")
            if (p.get("status") or {}).get("nominatedNodeName") == node
            and not (p.get("spec") or {}).get("nodeName")
            and p["metadata"]["uid"] != uid
            and pod_priority(p) >= prio
        ]

    # -- the framework filter ------------------------------------------------------------------------

    def fits(
        self, pod: Mapping[str, Any], node: Mapping[str, Any], residents: Sequence[Mapping[str, Any]]
    ) -> str | None:
        """NodeResourcesFit of `pod` on `node` holding `residents` (and the nominated pods); None when
        it fits, else kube-scheduler's reason (``Insufficient nvidia.com/gpumem``)."""
        alloc = {r: _qty(v, r) for r, v in ((node.get("status") or {}).get("allocatable") or {}).items()}
        want = pod_requests(pod)
        holders = [*residents, *self._nominated_on(node["metadata"]["name"], pod)]
        if len(holders) + 1 > alloc.get("pods", Fraction(110)):
            return "Too many pods"
        used: dict[str, Fraction] = {}
        for p in holders:
            for r, v in pod_requests(p).items():
                used[r] = used.get(r, Fraction(0)) + v
        for r, v in sorted(want.items()):
            if v <= 0 or r in self.ignored or r == "pods":
                continue
            if r not in _BASE and "/" not in r:
                continue
            if used.get(r, Fraction(0)) + v > alloc.get(r, Fraction(0)):
                return f"Insufficient {r}"
        return None

    # -- one cycle -------------------------------------------------------------------------------------

    async def _post(self, verb: str, body: dict[str, Any]) -> tuple[int, Any]:
        self.calls.append((verb, body))
        async with self.session.post(
            f"{self.url}/{verb}", data=json.dumps(body), headers={"Content-Type": "application/json"}
        ) as r:
            text = await r.text()
            try:
                return r.status, json.loads(text) if text else None
            except ValueError:
                return r.status, text

    @staticmethod
    def _view(obj: Mapping[str, Any]) -> dict[str, Any]:
        out = json.loads(json.dumps(obj))
        out.pop("apiVersion", None)
        out.pop("kind", None)
        return out

    async def _extender_filter(
        self, pod: dict[str, Any], nodes: Sequence[dict[str, Any]], statuses: dict[str, tuple[str, str]]
    ) -> list[str] | str:
        """The passing node names, or an error text."""
        if self.cache_capable:
            body = {
                "Pod": self._view(pod),
                "Nodes": None,
                "NodeNames": [n["metadata"]["name"] for n in nodes],
            }
        else:
            body = {
                "Pod": self._view(pod),
                "Nodes": {"metadata": {}, "items": [self._view(n) for n in nodes]},
                "NodeNames": None,
            }
        status, result = await self._post("filter", body)
        if status != 200 or not isinstance(result, dict) or result.get("Error"):
            return f"extender filter failed: {status} {result}"
        for n, msg in (result.get("FailedNodes") or {}).items():
            statuses[n] = (UNSCHEDULABLE, msg)
        for n, msg in (result.get("FailedAndUnresolvableNodes") or {}).items():
            statuses[n] = (UNRESOLVABLE, msg)
        if result.get("NodeNames") is not None:
            return list(result["NodeNames"])
        return [n["metadata"]["name"] for n in (result.get("Nodes") or {}).get("items") or []]

    async def _bind(self, pod: dict[str, Any], node: str) -> str | None:
        meta = pod["metadata"]
        body = {
            "PodName": meta["name"],
            "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"],
            "Node": node,
        }
        status, result = await self._post("bind", body)
        if status != 200 or (result or {}).get("Error"):
            return f"bind failed: {status} {result}"
        if self.after_bind is not None:
            done = self.after_bind(
                self.api.store.get("pods", meta["name"], namespace=meta["namespace"]), node
            )
            if done is not None:
                await done
        return None

    async def schedule(self, namespace: str, name: str) -> Cycle:
        """One scheduling cycle of pod `namespace/name` (kube-scheduler's `scheduleOne`)."""
        pod = self.api.store.get("pods", name, namespace=namespace)
        if pod is None:
            return Cycle("error", message="pod not found")
        nodes = {n["metadata"]["name"]: n for n in self._nodes()}
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        statuses: dict[str, tuple[str, str]] = {}
        if nominated in nodes:
            n = nodes[nominated]
            why = self.fits(pod, n, self._pods_on(nominated))
            if why is None:
                passed = await self._extender_filter(pod, [n], {})
                if isinstance(passed, list) and passed:
                    error = await self._bind(pod, passed[0])
                    return Cycle("error", message=error) if error else Cycle("bound", passed[0])
        feasible = []
        for nname, n in nodes.items():
            why = self.fits(pod, n, self._pods_on(nname))
            if why is None:
                feasible.append(n)
            else:
                statuses[nname] = (UNSCHEDULABLE, why)
        if feasible:
            passed = await self._extender_filter(pod, feasible, statuses)
            if isinstance(passed, str):
                return Cycle("error", message=passed, statuses=statuses)
            if passed:
                error = await self._bind(pod, passed[0])
                return (
                    Cycle("error", message=error) if error else Cycle("bound", passed[0], statuses=statuses)
                )
        return await self._post_filter(pod, nodes, statuses)

    # -- DefaultPreemption --------------------------------------------------------------------------------

    def _pdbs(self) -> list[dict[str, Any]]:
        return self.api.store.list("poddisruptionbudgets")

    @staticmethod
    def _violating(victims: Sequence[dict[str, Any]], pdbs: Sequence[dict[str, Any]]) -> set[str]:
        """kube-scheduler 1.23-1.33 `filterPodsWithPDBViolation` over victims in the given order: a pod
        without labels matches no budget, nor does an empty selector; a pod already in a budget's
        `disruptedPods` takes no allowance."""
        allowed = [int(((b.get("status") or {}).get("disruptionsAllowed")) or 0) for b in pdbs]
        out = set()
        for v in victims:
            labels = v["metadata"].get("labels") or {}
            if not labels:
                continue
            for i, b in enumerate(pdbs):
                sel = (b.get("spec") or {}).get("selector") or {}
                ml = sel.get("matchLabels") or {}
                if b["metadata"].get("namespace") != v["metadata"].get("namespace") or not ml:
                    continue
                if any(labels.get(k) != val for k, val in ml.items()):
                    continue
                if v["metadata"]["name"] in ((b.get("status") or {}).get("disruptedPods") or {}):
                    continue
                allowed[i] -= 1
                if allowed[i] < 0:
                    out.add(v["metadata"]["uid"])
        return out

    @staticmethod
    def _importance(p: Mapping[str, Any]) -> tuple[int, float]:
        status = p.get("status") or {}
        start = parse_time(status.get("startTime")) or parse_time(p["metadata"].get("creationTimestamp"))
        return (-pod_priority(p), start)

    def select_victims(
        self, pod: dict[str, Any], node: dict[str, Any], pdbs: Sequence[dict[str, Any]]
    ) -> tuple[list[dict[str, Any]], int, str | None]:
        """`SelectVictimsOnNode`: (victims most important first, PDB violations, None) or a failure reason."""
        prio = pod_priority(pod)
        on = self._pods_on(node["metadata"]["name"])
        potential = [p for p in on if pod_priority(p) < prio]
        if not potential:
            return [], 0, "No preemption victims found for incoming pod"
        keep = [p for p in on if pod_priority(p) >= prio]
        why = self.fits(pod, node, keep)
        if why is not None:
            return [], 0, why
        potential.sort(key=self._importance)
        bad = self._violating(potential, pdbs)
        victims: list[dict[str, Any]] = []
        violations = 0
        for p in [x for x in potential if x["metadata"]["uid"] in bad] + [
            x for x in potential if x["metadata"]["uid"] not in bad
        ]:
            if self.fits(pod, node, [*keep, p]) is None:
                keep.append(p)
            else:
                victims.append(p)
                violations += p["metadata"]["uid"] in bad
        victims.sort(key=self._importance)
        return victims, violations, None

    async def _post_filter(
        self, pod: dict[str, Any], nodes: Mapping[str, dict[str, Any]], statuses: dict[str, tuple[str, str]]
    ) -> Cycle:
        meta = pod["metadata"]
        prio = pod_priority(pod)
        cycle = Cycle("unschedulable", statuses=statuses)
        if (pod.get("spec") or {}).get("preemptionPolicy") == "Never":
            cycle.message = "not eligible: preemptionPolicy Never"
            return cycle
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if nominated and statuses.get(nominated, (UNSCHEDULABLE, ""))[0] != UNRESOLVABLE:
            for p in self._pods_on(nominated):
                if p["metadata"].get("deletionTimestamp") and pod_priority(p) < prio:
                    cycle.message = "not eligible: a lower-priority pod on the nominated node is terminating"
                    return cycle
        potential = [
            n for name, n in nodes.items() if statuses.get(name, (UNSCHEDULABLE, ""))[0] != UNRESOLVABLE
        ]
        pdbs = self._pdbs()
        candidates: dict[str, tuple[list[dict[str, Any]], int]] = {}
        for n in potential:
            victims, violations, why = self.select_victims(pod, n, pdbs)
            if why is None and (victims or self.placeholders):
                candidates[n["metadata"]["name"]] = (victims, violations)
        cycle.proposed = {k: [v["metadata"]["name"] for v in vs] for k, (vs, _) in candidates.items()}
        if not candidates:
            cycle.message = "preemption: no candidate node"
            await self._nominate(pod, "")
            return cycle
        if self.preempt_verb:
            result = await self._call_extender(pod, candidates, cycle)
            if isinstance(result, str):
                cycle.result, cycle.message = "error", result
                return cycle
            candidates = result
        candidates = {k: v for k, v in candidates.items() if v[0]}
        if not candidates:
            cycle.message = "preemption: the extender left no candidate"
            return cycle
        best = self._pick(candidates)
        victims = candidates[best][0]
        for v in victims:
            if v["metadata"].get("deletionTimestamp"):
                continue
            vm = v["metadata"]
            condition = {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "message": f"{self.scheduler_name}: preempting to accommodate a higher priority pod",
            }
            self.api.store.patch(
                "pods", vm["name"], {"status": {"conditions": [condition]}}, namespace=vm["namespace"],
                patch_type="application/strategic-merge-patch+json", subresource="status",
            )  # fmt: skip
            self.api.store.delete("pods", vm["name"], namespace=vm["namespace"], grace_period_s=None)
        for p in self.api.store.list("pods"):
            st = p.get("status") or {}
            if (
                st.get("nominatedNodeName") == best
                and pod_priority(p) < prio
                and p["metadata"]["uid"] != meta["uid"]
            ):
                await self._nominate(p, "")
        await self._nominate(pod, best)
        cycle.result, cycle.node = "nominated", best
        cycle.victims = [v["metadata"]["name"] for v in victims]
        return cycle

    async def _call_extender(
        self, pod: dict[str, Any], candidates: dict[str, tuple[list[dict[str, Any]], int]], cycle: Cycle
    ) -> dict[str, tuple[list[dict[str, Any]], int]] | str:
        """`callExtenders` -> `HTTPExtender.ProcessPreemption`: the candidates the extender keeps."""
        if self.cache_capable:
            body = {
                "Pod": self._view(pod),
                "NodeNameToVictims": None,
                "NodeNameToMetaVictims": {
                    k: {"Pods": [{"UID": v["metadata"]["uid"]} for v in vs], "NumPDBViolations": n}
                    for k, (vs, n) in candidates.items()
                },
            }
        else:
            body = {
                "Pod": self._view(pod),
                "NodeNameToVictims": {
                    k: {"Pods": [self._view(v) for v in vs], "NumPDBViolations": n}
                    for k, (vs, n) in candidates.items()
                },
                "NodeNameToMetaVictims": None,
            }
        cycle.preempt_args = body
        status, reply = await self._post("preempt", body)
        cycle.preempt_reply = reply if isinstance(reply, dict) else None
        if status != 200 or not isinstance(reply, dict):
            return f"failed preempt with extender, code {status}: {reply}"
        out: dict[str, tuple[list[dict[str, Any]], int]] = {}
        for node, mv in (reply.get("NodeNameToMetaVictims") or {}).items():
            on = {p["metadata"]["uid"]: p for p in self._pods_on(node)}
            victims = []
            for mp in (mv or {}).get("Pods") or []:
                uid = mp.get("UID")
                if uid not in on:
                    return f"extender claims to preempt pod (UID: {uid}) on node: {node}, but the pod is not found on that node"
                victims.append(on[uid])
            if not victims:
                if node in candidates and not candidates[node][0] and self.placeholders:
                    continue  # a placeholder the extender left empty: dropped below
                return f"expected at least one victim pod on node {node!r}"
            out[node] = (victims, int((mv or {}).get("NumPDBViolations") or 0))
        return out

    def _pick(self, candidates: Mapping[str, tuple[list[dict[str, Any]], int]]) -> str:
        """`pickOneNodeForPreemption`: fewest PDB violations, lowest highest victim priority, lowest sum
        of priorities, fewest victims, latest start of the highest-priority victims, then the first."""

        def key(node: str) -> tuple:
            vs, n = candidates[node]
            top = max(pod_priority(v) for v in vs)
            starts = [self._importance(v)[1] for v in vs if pod_priority(v) == top]
            return (n, top, sum(pod_priority(v) + 2**31 for v in vs), len(vs), -min(starts), node)

        return min(candidates, key=key)

    async def _nominate(self, pod: Mapping[str, Any], node: str) -> None:
        meta = pod["metadata"]
        current = self.api.store.get("pods", meta["name"], namespace=meta["namespace"])
        if current is None or (current.get("status") or {}).get("nominatedNodeName", "") == node:
            return
        self.api.store.patch(
            "pods", meta["name"], {"status": {"nominatedNodeName": node or None}}, namespace=meta["namespace"],
            subresource="status",
        )  # fmt: skip
