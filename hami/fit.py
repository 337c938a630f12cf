"""Fit one pod onto one node's cards (pure: usage in, assignment or reasons out).

The algorithm is HAMi's (hami-legacy-spec §2.4 for containers, §2.5 for the per-card checks, in that
order), so an operator reading HAMi's docs gets the same answers and the same reason words:
- init containers are fitted one by one on the node's usage as it is (they run before the app
  containers and one at a time), app containers one after another on one shared working copy, so
  several containers of a pod may share a card, each taking one slot;
- native sidecars (init containers with ``restartPolicy: Always``) run alongside the app containers and
  are counted with them (HAMi counts them as init containers and under-counts); an init container
  declared after a sidecar runs alongside that sidecar, so it is fitted next to it;
- a container asking N cards gets N distinct cards;
- every card failure is a `Reason` (the per-card checks are `hami.card_checks`); the node's failure text is HAMi's
  ``"1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted"``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hami.card_checks import check_card
from hami.model import (
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    PodDevices,
    Selection,
)
from hami.pods import ContainerKind, ContainerSpec, collapse_grants
from hami.reason_words import Reason
from hami.scoring import CardPolicy, PolicyChoice, best_combination, card_score, order_cards
from hami.vendors.base import Vendor


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the fit needs of a node: its cards per vendor, per-card usage, cordoned UUIDs, pair scores."""

    name: str
    devices: Mapping[str, Sequence[Device]]
    usage: Mapping[str, DeviceUsage]
    cordoned: frozenset[str] = frozenset()
    pair_scores: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


#: quota_ok(vendor, pod_mem_mib, pod_cores_percent) -> whether the namespace quota allows the pod that big.
QuotaCheck = Callable[[str, int, int], bool]


@dataclass(slots=True)
class NodeFit:
    """Result of fitting a pod on one node.

    `devices`: per vendor, one list per container (init first) — only when `ok`.
    `reasons`: per-card failure counts of the container that failed, `total` cards considered.
    """

    ok: bool
    devices: PodDevices = field(default_factory=dict)
    reasons: Counter[Reason] = field(default_factory=Counter)
    total: int = 0

    def reason_text(self) -> str:
        """HAMi's failure text: ``"1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted"`` (sorted)."""
        return ", ".join(sorted(f"{n}/{self.total} {r.value}" for r, n in self.reasons.items()))


_ZERO = DeviceUsage()


def fit_container(
    req: ContainerRequest,
    cards: Sequence[Device],
    usage: Callable[[str], DeviceUsage],
    *,
    vendor: Vendor,
    selection: Selection,
    policy: PolicyChoice,
    cordoned: frozenset[str] = frozenset(),
    pair_scores: Mapping[str, Mapping[str, int]] | None = None,
    quota_ok: Callable[[int, int], bool] | None = None,
) -> tuple[list[ContainerDevice] | None, Counter[Reason]]:
    """Choose `req.nums` distinct cards for one container request, or return the per-card reasons.

    A card the vendor lets one container take several times (`Vendor.card_repeats`: MIG instances)
    is taken again, right after itself, while the vendor's `card_rule` accepts one more device on it
    (HAMi revisits such a card in its loop); the vendor gives the devices their final form per card
    (`Vendor.finish_card`).
    """
    reasons: Counter[Reason] = Counter()
    repeating = {d.uuid for d in cards if vendor.card_repeats(d, selection)}
    if req.nums > len(cards) and not repeating:
        reasons[Reason.NODE_INSUFFICIENT_DEVICE] = len(cards) or 1
        return None, reasons
    passing: list[tuple[Device, DeviceUsage, int]] = []
    mutex = policy.mutex
    for d in cards:
        u = usage(d.uuid)
        mem = req.memory_on(d)
        r = check_card(d, u, req, mem, selection, vendor, mutex=mutex, cordoned=cordoned, quota_ok=quota_ok)
        if r is None:
            word = vendor.card_rule(d, u, req, mem, selection, ())
            r = Reason(word) if word else None
        if r is None:
            passing.append((d, u, mem))
        else:
            reasons[r] += 1
    cores = min(req.coresreq, 100)
    frag = policy.fragmentation
    if frag is not None and CardPolicy.FRAGMENTATION in policy.cards and passing:
        # The score is the negated increase of the node's expected fragmentation (hami.fragmentation).
        deltas = frag.card_deltas(cards, usage, [(d, m) for d, _, m in passing], cores)
        scored = [(d, u, -x) for (d, u, _), x in zip(passing, deltas, strict=True)]
    else:
        scored = [(d, u, card_score(d, u, mem=m, cores=cores, weights=policy.weights)) for d, u, m in passing]
    stopped = 0  # repeating cards that took their last device before the request was met
    if repeating and req.nums > 1:
        scored, stopped = _repeat_cards(scored, repeating, req, cores, selection, vendor)
    if selection.numa_bind and req.nums > 1:
        scored = _pick_numa_group(scored, req.nums, policy, reasons)
    if len(scored) < req.nums:
        if scored:
            reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += len(scored)
        if stopped:
            # HAMi revisits such a card once more and counts the refusal that ends its turn.
            reasons[Reason.CARD_MIG_TOPOLOGY_INFEASIBLE] += stopped
        return None, reasons
    ordered = order_cards(scored, policy.cards)
    if policy.topology_aware and len(ordered) > req.nums and not repeating:
        chosen = set(best_combination([d.uuid for d, _, _ in ordered], req.nums, pair_scores or {}))
        ordered = [x for x in ordered if x[0].uuid in chosen]
    if quota_ok is not None and req.nums > 1:
        ordered = _within_quota(ordered, req, cores, quota_ok, reasons)
        if ordered is None:
            return None, reasons
    out = [
        ContainerDevice(uuid=d.uuid, type=req.vendor, usedmem=req.memory_on(d), usedcores=cores)
        for d, _, _ in ordered[: req.nums]
    ]
    if repeating:
        out = _finish(out, {d.uuid: (d, u) for d, u, _ in ordered}, selection, vendor)
    return out, reasons


def _repeat_cards(
    scored: list[tuple[Device, DeviceUsage, float]],
    repeating: set[str],
    req: ContainerRequest,
    cores: int,
    selection: Selection,
    vendor: Vendor,
) -> tuple[list[tuple[Device, DeviceUsage, float]], int]:
    """Each repeating card as many times as the vendor's `card_rule` lets one container take it (up to
    the request), right after itself; and how many such cards ended below the request."""
    out: list[tuple[Device, DeviceUsage, float]] = []
    stopped = 0
    for item in scored:
        out.append(item)
        d, u, _ = item
        if d.uuid not in repeating:
            continue
        mem = req.memory_on(d)
        taken = [ContainerDevice(uuid=d.uuid, type=req.vendor, usedmem=mem, usedcores=cores)]
        while len(taken) < req.nums and vendor.card_rule(d, u, req, mem, selection, taken) is None:
            out.append(item)
            taken.append(taken[0])
        if len(taken) < req.nums:
            stopped += 1
    return out, stopped


def _finish(
    out: list[ContainerDevice],
    cards: Mapping[str, tuple[Device, DeviceUsage]],
    selection: Selection,
    vendor: Vendor,
) -> list[ContainerDevice]:
    """The container's devices in their final form, card by card (`Vendor.finish_card`), same order."""
    by_card: dict[str, list[int]] = {}
    for i, cd in enumerate(out):
        by_card.setdefault(cd.uuid, []).append(i)
    final = list(out)
    for uuid, positions in by_card.items():
        d, u = cards[uuid]
        finished = vendor.finish_card(d, u, [out[i] for i in positions], selection)
        for i, cd in zip(positions, finished, strict=True):
            final[i] = cd
    return final


def _within_quota(
    ordered: list[tuple[Device, DeviceUsage, float]],
    req: ContainerRequest,
    cores: int,
    quota_ok: Callable[[int, int], bool],
    reasons: Counter[Reason],
) -> list[tuple[Device, DeviceUsage, float]] | None:
    """Take cards in preference order while the namespace quota holds with all cards taken so far.

    HAMi's fitQuota counts the cards already chosen for this container: a 2-card container asking
    3000 MiB needs 6000 MiB of quota (HAMi#893), which a per-card check alone would let through.
    """
    taken: list[tuple[Device, DeviceUsage, float]] = []
    mem = core = 0
    for item in ordered:
        m = req.memory_on(item[0])
        if quota_ok(mem + m, core + cores):
            taken.append(item)
            mem, core = mem + m, core + cores
            if len(taken) == req.nums:
                return taken
        else:
            reasons[Reason.RESOURCE_QUOTA_NOT_FIT] += 1
    if taken:
        reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += len(taken)
    return None


def _pick_numa_group(
    scored: list[tuple[Device, DeviceUsage, float]], nums: int, policy: PolicyChoice, reasons: Counter[Reason]
) -> list[tuple[Device, DeviceUsage, float]]:
    """All cards of a numa-bind container on one NUMA node: pick the group the card policy prefers.

    Groups are compared by the card policy chain, key by key, on their best `nums` cards (binpack:
    fullest, spread: emptiest, numa: lowest NUMA node), so under `spread` NUMA never outranks
    utilisation. Cards of groups too small for the request count as NumaNotFit.
    """
    groups: dict[int, list[tuple[Device, DeviceUsage, float]]] = {}
    for item in scored:
        groups.setdefault(item[0].numa, []).append(item)
    big = {n: order_cards(g, policy.cards)[:nums] for n, g in groups.items() if len(g) >= nums}
    for n, g in groups.items():
        if n not in big:
            reasons[Reason.NUMA_NOT_FIT] += len(g)
    if not big:
        return []

    def group_key(n: int) -> tuple[float, ...]:
        # The card policy chain decides, key by key (a bare `numa`: lowest NUMA node first); without
        # a utilisation or numa key (mutex, topology-aware) the emptiest group, as under spread.
        s = sum(x[2] for x in big[n])
        k = [
            -s if p is CardPolicy.BINPACK else s if p is CardPolicy.SPREAD else n
            for p in policy.cards
            if p in (CardPolicy.BINPACK, CardPolicy.SPREAD, CardPolicy.NUMA)
        ]
        return (*(k or [s]), n)

    return groups[min(big, key=group_key)]


def fit_pod(
    containers: Sequence[ContainerSpec],
    node: NodeView,
    *,
    vendors: Mapping[str, Vendor],
    selections: Mapping[str, Selection],
    policy: PolicyChoice,
    quota: QuotaCheck | None = None,
) -> NodeFit:
    """Fit every container of a pod on `node` (§2.4). Returns NodeFit; never raises for a misfit."""
    base = node.usage
    work: dict[str, DeviceUsage] = {}

    def app_usage(uuid: str) -> DeviceUsage:
        return work.get(uuid) or base.get(uuid) or _ZERO

    def base_usage(uuid: str) -> DeviceUsage:
        return base.get(uuid) or _ZERO

    wanted = {r.vendor for c in containers for r in c.requests}
    devices: PodDevices = {v: [[] for _ in containers] for v in wanted}
    pod_totals: dict[str, list[int]] = {v: [0, 0] for v in wanted}
    for i, c in enumerate(containers):
        shared = c.kind is not ContainerKind.INIT
        for req in c.requests:
            cards = node.devices.get(req.vendor, ())
            q = None
            if quota is not None:
                t = pod_totals[req.vendor] if shared else [0, 0]
                q = _bind_quota(quota, req.vendor, t)
            vendor = vendors[req.vendor]
            if vendor.custom_fit:
                # The vendor's own algorithm (topology, profiles, "same card" rules): it sees this
                # vendor's devices of the pod's earlier containers of the same phase.
                got, reasons = vendor.fit_cards(
                    req,
                    cards,
                    app_usage,
                    selection=selections.get(req.vendor, Selection()),
                    policy=policy,
                    earlier=[
                        devices[req.vendor][j]
                        for j in range(i)
                        if (containers[j].kind is ContainerKind.INIT) is not shared
                    ],
                    quota_ok=q,
                )
            else:
                got, reasons = fit_container(
                    req,
                    cards,
                    app_usage,  # for an init container: the node plus the sidecars started before it
                    vendor=vendor,
                    selection=selections.get(req.vendor, Selection()),
                    policy=policy,
                    cordoned=node.cordoned,
                    pair_scores=node.pair_scores,
                    quota_ok=q,
                )
            if got is None:
                return NodeFit(ok=False, reasons=reasons, total=max(len(cards), 1))
            devices[req.vendor][i] = got
            if shared:
                for cd in got:
                    u = work.get(cd.uuid)
                    if u is None:
                        u = work[cd.uuid] = base_usage(cd.uuid).copy()
                    u.add(cd.usedmem, cd.usedcores, mig=(cd.mig.placement,) if cd.mig else ())
                    pod_totals[req.vendor][0] += cd.usedmem
                    pod_totals[req.vendor][1] += cd.usedcores
    if quota is not None:
        # The pod's collapsed usage is what the namespace is charged: an init container on a card the
        # app containers do not use adds to it (HAMi#3052), while one on a shared card is not counted twice.
        totals: dict[str, list[int]] = {}
        for g in collapse_grants(devices, [c.kind for c in containers]):
            t = totals.setdefault(g.vendor, [0, 0])
            t[0] += g.usedmem
            t[1] += g.usedcores
        for v, (mem, cores) in totals.items():
            if not quota(v, mem, cores):
                n = max(len(node.devices.get(v, ())), 1)
                return NodeFit(ok=False, reasons=Counter({Reason.RESOURCE_QUOTA_NOT_FIT: n}), total=n)
    return NodeFit(ok=True, devices=devices)


def _bind_quota(quota: QuotaCheck, vendor: str, totals: list[int]) -> Callable[[int, int], bool]:
    return lambda mem, cores: quota(vendor, totals[0] + mem, totals[1] + cores)
