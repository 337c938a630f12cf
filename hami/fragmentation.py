"""Fragmentation-aware placement: the expected fragmentation of cards and nodes under the arriving
workload, learned online, and the increase a placement causes (pure; no I/O, no clock).

The measure is the one of the FGD paper (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC '23), restated for HAMi's sharing model:

- a workload is a distribution over request *shapes* `Shape` (cards per container, memory per card in
  MiB or percent, cores percent per card, allowed models), each with a popularity `p_m`;
- a card *serves* a shape when HAMi's per-card fit would let one container of that shape onto it now:
  healthy, a free slot, the model allowed, free memory >= the shape's MiB on that card, and the core rule
  of `hami.fit.core_reason` (free cores, a 100 % request needs an idle 100 % card);
- a card's free compute `r_g` is ``(devcore - usedcores) / 100`` cards;
- the fragmentation of node n for shape m is the free compute no container of m can use:
  ``F_n(m) = sum_g [not serves(g, m)] r_g``, plus, when fewer than `nums` cards serve m (the shape
  cannot run on n at all), the free compute of the cards that do serve it: then every free card share
  of the node is a fragment for m (the paper's case "the task cannot be placed on the node");
- the expected fragmentation is ``F_n(M) = sum_m p_m F_n(m)`` (in cards), and a placement is scored by
  ``F_n(M)`` after minus before: the smaller (most negative) the better.

The sums split into per-card terms (`phi_g = r_g sum_m p_m [not serves(g, m)]`) and, for multi-card
shapes only, a node term that needs the count of serving cards. Per-card terms are memoised by card
state (model, capacity, usage), which repeats across a fleet, so a node's figure is a few dict lookups.

The distribution is learned from the pods the scheduler sees (`WorkloadHistogram`: exponentially
decaying counts with a prior that fades), kept only in memory; a restarted scheduler relearns it from
the live pods. Scores use a frozen copy (`FragmentationModel.version`) that is refreshed only when the
learned distribution has drifted (total variation distance), so memoised terms stay valid in between.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from hami import objects, pods
from hami.errors import InvalidRequest
from hami.fit import core_reason
from hami.model import PERCENTAGE_UNSET, ContainerRequest, Device, DeviceUsage, Selection
from hami.pods import ContainerKind, ContainerSpec
from hami.quantity import parse_quantity

_ZERO = DeviceUsage()


class Shape(NamedTuple):
    """One container's per-card request for one vendor, as the fragmentation measure sees it.

    `nums` cards; per card `mem` MiB (> 0) or else `pct` percent of the card's memory (100 when the
    request gives neither: the whole card's memory, HAMi's default); `cores` percent (clamped to 100);
    `types` lower-case substrings of allowed card types (``nvidia.com/use-gputype``), () for any;
    `cpu` the pod's CPU request in millicores (kube-scheduler's fit: a node without that much free CPU
    cannot run the shape, so all its free card compute is a fragment for it), 0 when not known.
    """

    nums: int
    mem: int
    pct: int
    cores: int
    types: tuple[str, ...] = ()
    cpu: int = 0

    def mem_on(self, devmem: int) -> int:
        """MiB this shape takes on a card of `devmem` MiB (`ContainerRequest.memory_on`'s rule)."""
        return self.mem if self.mem > 0 else devmem * self.pct // 100


def shape_of(req: ContainerRequest, selection: Selection | None = None, cpu: int = 0) -> Shape:
    """The `Shape` of one container request, its vendor's selection (use-types only) and the pod's CPU
    request (millicores)."""
    pct = 0
    if req.memreq <= 0:
        pct = req.mem_percentage if req.mem_percentage != PERCENTAGE_UNSET else 100
    types = tuple(sorted(t.lower() for t in selection.use_types)) if selection is not None else ()
    return Shape(max(1, req.nums), max(0, req.memreq), pct, min(max(req.coresreq, 0), 100), types, max(0, cpu))


def _millicores(value: object) -> int:
    try:
        q, _ = parse_quantity(value, resource="cpu")
    except InvalidRequest:
        return 0
    return max(0, math.ceil(q * 1000))


def pod_cpu_milli(pod: Mapping[str, Any]) -> int:
    """The pod's CPU request in millicores as kube-scheduler counts it (requests, else limits, per
    container; app containers and sidecars summed, or the largest init container with the sidecars
    before it, `hami.pods.peak`); unparseable values count 0."""
    values = []
    for kind, c in pods.entries(pod):
        res = c.get("resources") if isinstance(c, Mapping) else None
        res = res if isinstance(res, Mapping) else {}
        req, lim = res.get("requests"), res.get("limits")
        v = (req or {}).get("cpu") if isinstance(req, Mapping) else None
        if v is None and isinstance(lim, Mapping):
            v = lim.get("cpu")
        values.append((kind, _millicores(v) if v is not None else 0))
    return int(pods.peak(values))


def node_cpu_milli(node: Mapping[str, Any]) -> int | None:
    """A Node's allocatable CPU in millicores, None when it does not say."""
    alloc = objects.status(node).get("allocatable")
    v = alloc.get("cpu") if isinstance(alloc, Mapping) else None
    return None if v is None else _millicores(v)


def serves(d: Device, u: DeviceUsage, s: Shape) -> bool:
    """Whether card `d` with usage `u` can take one container of shape `s` now (HAMi's per-card rules
    on health, slots, allowed type, memory and cores; cordons and UUID rules are per pod, not shapes)."""
    if not d.health or u.used >= d.count:
        return False
    if s.types:
        t = d.type.lower()
        if not any(x in t for x in s.types):
            return False
    if d.devmem - u.usedmem < s.mem_on(d.devmem):
        return False
    return core_reason(d.devcore, u.usedcores, u.used, s.cores) is None


def free_compute(d: Device, u: DeviceUsage) -> float:
    """`r_g`: the card's unallocated compute in cards (percent / 100), 0 when none is left."""
    return max(0, d.devcore - u.usedcores) / 100.0


def node_fragmentation(
    devices: Sequence[Device],
    usage: Callable[[str], DeviceUsage],
    dist: Mapping[Shape, float],
    cpu_free: float = math.inf,
) -> float:
    """`F_n(M)` of one node (cards) by the definition, computed from scratch (no memo): the reference
    the incremental path is checked against, and a reader's statement of the measure. `cpu_free` is
    the node's unrequested CPU in millicores (a shape asking more is served by no card)."""
    total = 0.0
    for s, p in dist.items():
        rs = [
            (free_compute(d, usage(d.uuid)), s.cpu <= cpu_free and serves(d, usage(d.uuid), s)) for d in devices
        ]
        frag = sum(r for r, ok in rs if not ok)
        if sum(1 for _, ok in rs if ok) < s.nums:
            frag += sum(r for r, ok in rs if ok)
        total += p * frag
    return total


# ----------------------------------------------------------------------------------------------
# the learned workload


#: The distribution before anything is observed: a mix of whole cards, common shares and multi-card
#: pods, in the proportions of the public Alibaba GPU trace (about half whole single cards, a third
#: shares, the rest 2-8 cards). It fades as real pods arrive.
DEFAULT_PRIOR: dict[Shape, float] = {
    Shape(1, 0, 100, 100): 0.40,
    Shape(1, 0, 50, 50): 0.15,
    Shape(1, 0, 25, 25): 0.12,
    Shape(1, 0, 10, 10): 0.08,
    Shape(1, 0, 75, 75): 0.05,
    Shape(2, 0, 100, 100): 0.08,
    Shape(4, 0, 100, 100): 0.05,
    Shape(8, 0, 100, 100): 0.07,
}


class WorkloadHistogram:
    """Exponentially decaying counts of request shapes, starting from a prior.

    Each `observe` multiplies every earlier weight by ``2 ** (-1 / half_life)`` (done lazily, by growing
    the increment), so a shape seen `half_life` observations ago counts half. The prior enters as
    `prior_weight` pseudo-observations that decay like the rest. Raises ValueError for a non-positive
    `half_life` or a negative `prior_weight`.
    """

    def __init__(
        self,
        prior: Mapping[Shape, float] | None = None,
        *,
        prior_weight: float = 8.0,
        half_life: float = 4000.0,
    ) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life: {half_life!r} must be > 0 (observations)")
        if prior_weight < 0:
            raise ValueError(f"prior_weight: {prior_weight!r} must be >= 0")
        prior = DEFAULT_PRIOR if prior is None else prior
        z = sum(prior.values()) or 1.0
        self.weights: dict[Shape, float] = {s: prior_weight * p / z for s, p in prior.items() if p > 0}
        self._grow = 2.0 ** (1.0 / half_life)
        self._inc = 1.0
        self.observed = 0

    def observe(self, shape: Shape, weight: float = 1.0) -> None:
        """Count one arriving container request of `shape` (`weight` of one pod, e.g. 1/containers)."""
        self._inc *= self._grow
        self.weights[shape] = self.weights.get(shape, 0.0) + weight * self._inc
        self.observed += 1
        if self._inc > 1e100:  # renormalise before floats overflow; ratios are unchanged
            self.weights = {s: w / self._inc for s, w in self.weights.items() if w / self._inc > 1e-12}
            self._inc = 1.0

    def distribution(self, max_shapes: int | None = None) -> dict[Shape, float]:
        """Normalised popularity per shape (sums to 1), the `max_shapes` most popular when given."""
        items = sorted(self.weights.items(), key=lambda kv: (-kv[1], kv[0]))
        if max_shapes is not None:
            items = items[:max_shapes]
        z = sum(w for _, w in items)
        return {s: w / z for s, w in items} if z > 0 else {}


def total_variation(a: Mapping[Shape, float], b: Mapping[Shape, float]) -> float:
    """Total variation distance (0..1) of two distributions over shapes."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# ----------------------------------------------------------------------------------------------
# the model the scheduler scores with


def card_state(d: Device, u: DeviceUsage) -> tuple:
    """What a card's terms depend on: (type, devmem, devcore, count, health, used, usedmem, usedcores)."""
    return (d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores)


def card_of_state(state: tuple) -> tuple[Device, DeviceUsage]:
    """A card and its usage in the given `card_state` (no UUID: for the measure only)."""
    typ, devmem, devcore, count, health, used, usedmem, usedcores = state
    return Device("", 0, count, devmem, devcore, typ, health=health), DeviceUsage(used, usedmem, usedcores)


_state = card_state


def containers_on(d: Device, u: DeviceUsage, s: Shape) -> int:
    """How many more containers of shape `s` card `d` could take on its own (slots, memory and cores
    left; 0 when it does not `serve` the shape at all)."""
    if not serves(d, u, s):
        return 0
    n = d.count - u.used
    mem = s.mem_on(d.devmem)
    if mem > 0:
        n = min(n, (d.devmem - u.usedmem) // mem)
    if s.cores > 0:
        n = min(n, 1 if d.devcore == 100 and s.cores == 100 else (d.devcore - u.usedcores) // s.cores)
    return max(n, 1)


def packed_fragmentation(
    devices: Sequence[Device],
    usage: Callable[[str], DeviceUsage],
    dist: Mapping[Shape, float],
    cpu_free: float = math.inf,
) -> float:
    """The measure the `fragmentation` policy scores with, from scratch (the reference of the memoised
    path): for each shape m, the node's free compute that m could not use if only m arrived,

    ``F_n(m) = R_n - (cores_m / 100) x nums_m x min(floor(K_m / nums_m), floor(cpu_free / cpu_m))``,

    with ``R_n = sum_g r_g`` and ``K_m = sum_g containers_on(g, m)``; ``F_n(M) = sum_m p_m F_n(m)``.
    For whole cards it is `node_fragmentation` (the paper's measure); it also counts the residue a share
    leaves on a card (a 0.9 free card serves one 0.5 share, the other 0.4 is lost) and the cards the
    node's CPU cannot feed (4 free cards and the CPU of one pod: 3 are lost), which the paper's
    per-card test does not see.
    """
    free = sum(free_compute(d, usage(d.uuid)) for d in devices)
    total = 0.0
    for s, p in dist.items():
        k = sum(containers_on(d, usage(d.uuid), s) for d in devices) // s.nums
        if s.cpu > 0:
            k = min(k, max(0, int(cpu_free // s.cpu))) if math.isfinite(cpu_free) else k
        total += p * (free - min(free, s.cores / 100 * s.nums * k))
    return total


class FragmentationModel:
    """The learned workload and the memoised per-card terms; what the `fragmentation` policy scores with
    (`packed_fragmentation` under the active distribution).

    Not thread-safe on its own: `hami.cluster.ClusterState` calls it under its lock.

    `observe` feeds arriving pods; the distribution used for scores (`active`) is refreshed from the
    histogram every `check_every` observations when it has moved by more than `drift` (total variation),
    which bumps `version` and drops the memo (node caches compare the version). `max_shapes` bounds the
    work per card. Figures are in cards of compute (1.0 = one whole card's cores).
    """

    def __init__(
        self,
        histogram: WorkloadHistogram | None = None,
        *,
        max_shapes: int = 32,
        drift: float = 0.05,
        check_every: int = 128,
        remember_uids: int = 20000,
    ) -> None:
        self.histogram = histogram or WorkloadHistogram()
        self.max_shapes, self.drift, self.check_every = max_shapes, drift, check_every
        self.version = 0
        self._since = 0
        self._every = check_every
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_uids
        self._set_active(self.histogram.distribution(max_shapes))

    def _set_active(self, dist: dict[Shape, float]) -> None:
        self.active = dist
        self._shapes = tuple(dist)
        self._p = tuple(dist.values())
        # Compute (cards) one container of each shape uses, over all its cards.
        self._use = tuple(s.cores / 100 * s.nums for s in self._shapes)
        self._nums = tuple(s.nums for s in self._shapes)
        self._cpu = tuple(s.cpu for s in self._shapes)
        self._memo: dict[tuple, tuple[float, tuple[int, ...]]] = {}
        self._moves: dict[tuple, tuple[float, tuple[int, ...]] | None] = {}
        #: Per vendor, the node terms of this distribution as columns (`hami.fragmentation_table`),
        #: built by the filter that scores with them; dropped with the memo.
        self.tables: dict[str, Any] = {}
        self.version += 1

    # -- learning ---------------------------------------------------------------------------------

    def observe(self, shapes: Iterable[Shape], uid: str | None = None) -> bool:
        """Count one arriving pod's container shapes, each weighted 1 / (containers x (cards of compute
        it asks) squared), so the small shares that fill the last gaps count for more than their share of
        the pods. A `uid` seen recently (a retried filter,
        a pod event after the filter) is not counted again. True when counted."""
        if uid is not None:
            if uid in self._seen:
                self._seen.move_to_end(uid)
                return False
            self._seen[uid] = None
            if len(self._seen) > self._remember:
                self._seen.popitem(last=False)
        shapes = list(shapes)
        if not shapes:
            return False
        for s in shapes:
            # Weighted count / cards asked squared: on the Alibaba trace (openb default, fill to 130 %,
            # seeds 1-10) this kept 0.4 points more GPU allocation than count / cards, and 0.6 more
            # than a plain count, by keeping room for the small shares that fill the last gaps.
            c = max(s.cores / 100 * s.nums, 0.01)
            w = 1.0 / len(shapes) / (c * c)
            self.histogram.observe(s, w)
        self._since += 1
        if self._since >= self._every and self.refresh():
            # Each refresh drops every cached node figure, so checks space out while the
            # workload stays put (a large change is still taken within a few intervals).
            self._every = min(self._every * 2, self.check_every * 16)
        return True

    def refresh(self) -> bool:
        """Score with the learned distribution now when it has drifted from the active one (after a
        batch of live pods was counted at once: a restart or relist relearning the workload, or a
        simulator start state), instead of at the next periodic check. True when it changed."""
        self._since = 0
        live = self.histogram.distribution(self.max_shapes)
        if total_variation(live, self.active) <= self.drift:
            return False
        self._set_active(live)
        return True

    # -- terms ------------------------------------------------------------------------------------

    def card_terms(self, d: Device, u: DeviceUsage) -> tuple[float, tuple[int, ...]]:
        """(free compute in cards, containers of each active shape it could take), memoised by state."""
        key = (d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores)
        t = self._memo.get(key)
        if t is None:
            if len(self._memo) > 200_000:
                self._memo.clear()  # bound memory on fleets with very many distinct card states
            t = self._memo[key] = (free_compute(d, u), tuple(containers_on(d, u, s) for s in self._shapes))
        return t

    def _value(self, free: float, k: Sequence[int], cpu_free: float | None) -> float:
        used = 0.0
        for p, use, n, cpu, km in zip(self._p, self._use, self._nums, self._cpu, k, strict=True):
            c = km // n
            if cpu > 0 and cpu_free is not None:
                c = min(c, int(cpu_free // cpu)) if cpu_free > 0 else 0
            if c:
                x = use * c
                used += p * (x if x < free else free)
        return free - used

    def node_value(
        self, devices: Sequence[Device], usage: Callable[[str], DeviceUsage], cpu_free: float | None = None
    ) -> float:
        """`F_n(M)` of a node (cards) from the memoised per-card terms; `cpu_free` millicores (None: no
        CPU limit). Equals `packed_fragmentation` over `active` (a property test holds that)."""
        terms = [self.card_terms(d, usage(d.uuid)) for d in devices]
        free = sum(t[0] for t in terms)
        k = [sum(col) for col in zip(*(t[1] for t in terms), strict=True)] if terms else [0] * len(self._p)
        return self._value(free, k, cpu_free)

    def _deltas(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        candidates: Sequence[tuple[int, int]],
        cores: int,
        cpu_free: float | None,
        cpu: int,
    ) -> list[float]:
        terms = [self.card_terms(d, usage(d.uuid)) for d in devices]
        free = sum(t[0] for t in terms)
        k = [sum(col) for col in zip(*(t[1] for t in terms), strict=True)] if terms else [0] * len(self._p)
        before = self._value(free, k, cpu_free)
        after_cpu = None if cpu_free is None else cpu_free - cpu
        out = []
        for i, mem in candidates:
            d = devices[i]
            u = usage(d.uuid)
            r0, k0 = terms[i]
            r1, k1 = self.card_terms(d, DeviceUsage(u.used + 1, u.usedmem + mem, u.usedcores + cores))
            k2 = [a - b + c for a, b, c in zip(k, k0, k1, strict=True)]
            out.append(self._value(free - r0 + r1, k2, after_cpu) - before)
        return out

    def node_terms(
        self, devices: Sequence[Device], usage: Callable[[str], DeviceUsage]
    ) -> tuple[float, tuple[int, ...]]:
        """(free compute in cards, containers of each active shape) summed over a node's cards."""
        terms = [self.card_terms(d, usage(d.uuid)) for d in devices]
        free = sum(t[0] for t in terms)
        k = tuple(sum(col) for col in zip(*(t[1] for t in terms), strict=True)) if terms else (0,) * len(self._p)
        return free, k

    def value_of(self, free: float, k: Sequence[int], cpu_free: float | None) -> float:
        """`F_n(M)` of a node from its `node_terms` and free CPU (millicores, None: no limit)."""
        return self._value(free, k, cpu_free)

    @staticmethod
    def node_states(devices: Sequence[Device], usage: Callable[[str], DeviceUsage]) -> tuple:
        """The node's card states, sorted: nodes with equal states have equal terms (up to the order
        in which their free compute is summed) and the same `gpu_move`."""
        return tuple(sorted(_state(d, usage(d.uuid)) for d in devices))

    def gpu_move(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        shape: Shape,
        states: tuple | None = None,
    ) -> tuple[float, tuple[int, ...]] | None:
        """The node's `node_terms` after one container of `shape` goes where the GPU terms prefer
        (its `nums` cards of lowest increase, judged without CPU, as the fit orders them), or None when
        fewer than `nums` cards serve it. The pod's CPU is applied by the caller (`value_of`).
        `states` is the node's `node_states` when the caller has it already."""
        # Nodes in the same state (idle ones, full ones: most of a fleet) share the answer.
        if states is None:
            states = self.node_states(devices, usage)
        mkey = (states, shape)
        if mkey in self._moves:
            return self._moves[mkey]
        if len(self._moves) > 100_000:
            self._moves.clear()
        terms = [self.card_terms(d, usage(d.uuid)) for d in devices]
        cands = []
        seen = set()
        for i, d in enumerate(devices):
            u = usage(d.uuid)
            k = (d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores)
            if k in seen or not serves(d, u, shape):
                continue  # cards in one state are interchangeable: try one of them
            seen.add(k)
            cands.append((i, shape.mem_on(d.devmem)))
        serving = sum(1 for d in devices if serves(d, usage(d.uuid), shape)) if shape.nums > 1 else len(cands)
        if serving < shape.nums:
            self._moves[mkey] = None
            return None
        if shape.nums > 1:
            cands = [(i, shape.mem_on(d.devmem)) for i, d in enumerate(devices) if serves(d, usage(d.uuid), shape)]
        deltas = self._deltas(devices, usage, cands, shape.cores, None, 0)
        best = sorted(range(len(cands)), key=lambda j: (deltas[j], j))[: shape.nums]
        for j in best:
            i, mem = cands[j]
            d, u = devices[i], usage(devices[i].uuid)
            terms[i] = self.card_terms(d, DeviceUsage(u.used + 1, u.usedmem + mem, u.usedcores + shape.cores))
        free = sum(t[0] for t in terms)
        out = self._moves[mkey] = (free, tuple(sum(col) for col in zip(*(t[1] for t in terms), strict=True)))
        return out

    def card_deltas(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        candidates: Sequence[tuple[Device, int]],
        cores: int,
    ) -> list[float]:
        """For each (card, MiB) in `candidates` (cards of `devices`), the increase of the node's
        `F_n(M)` when one container taking that MiB and `cores` percent is put on that card alone (CPU
        leaves the order of one node's cards unchanged, so it is not counted here)."""
        index = {d.uuid: i for i, d in enumerate(devices)}
        return self._deltas(devices, usage, [(index[d.uuid], m) for d, m in candidates], cores, None, 0)

    def placement_delta(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        shape: Shape,
        cpu_free: float | None = None,
    ) -> float | None:
        """The smallest increase of the node's `F_n(M)` over the ways to place one container of `shape`
        (the pod takes `shape.cpu` of the node's free CPU; a multi-card container is judged by the sum
        of its `nums` best single-card increases), or None when fewer than `nums` cards serve it."""
        cands = [(i, shape.mem_on(d.devmem)) for i, d in enumerate(devices) if serves(d, usage(d.uuid), shape)]
        if len(cands) < shape.nums:
            return None
        deltas = self._deltas(devices, usage, cands, shape.cores, cpu_free, shape.cpu)
        if shape.nums == 1:
            return min(deltas)
        # The cards the fit would take (lowest single-card increase first), judged together.
        best = sorted(range(len(cands)), key=lambda j: (deltas[j], j))[: shape.nums]
        terms = [self.card_terms(d, usage(d.uuid)) for d in devices]
        before = self.node_value(devices, usage, cpu_free)
        for j in best:
            i, mem = cands[j]
            d, u = devices[i], usage(devices[i].uuid)
            terms[i] = self.card_terms(d, DeviceUsage(u.used + 1, u.usedmem + mem, u.usedcores + shape.cores))
        free = sum(t[0] for t in terms)
        k = [sum(col) for col in zip(*(t[1] for t in terms), strict=True)]
        return self._value(free, k, None if cpu_free is None else cpu_free - shape.cpu) - before


def pod_shapes(
    containers: Sequence[ContainerSpec], selections: Mapping[str, Selection], cpu: int = 0
) -> dict[str, tuple[Shape, ...]]:
    """Per vendor, the shapes of a pod's long-running containers (app containers and sidecars; the
    init containers only when the pod has nothing else), one per container request; `cpu` is the
    pod's CPU request (millicores), given to its first shape only (the pod takes it once)."""
    running = [c for c in containers if c.kind is not ContainerKind.INIT and c.requests]
    out: dict[str, list[Shape]] = {}
    for c in running or containers:
        for r in c.requests:
            out.setdefault(r.vendor, []).append(shape_of(r, selections.get(r.vendor), cpu))
            cpu = 0
    return {v: tuple(x) for v, x in out.items()}


def usage_of(usage: Mapping[str, DeviceUsage]) -> Callable[[str], DeviceUsage]:
    """A usage lookup over a node's usage map (cards without an entry are idle)."""
    get = usage.get
    return lambda uuid: get(uuid) or _ZERO


def pod_delta(
    model: FragmentationModel,
    devices: Mapping[str, Sequence[Device]],
    usage: Mapping[str, DeviceUsage],
    shapes: Mapping[str, tuple[Shape, ...]],
    cpu_free: float | None = None,
) -> float:
    """A node's key under the `fragmentation` node policy: the sum over the pod's shapes of the
    smallest increase of expected fragmentation (cards), `math.inf` when a shape cannot be served.
    Each container is judged alone on the node as it is (containers of one pod rarely share a card);
    `cpu_free` is the node's unrequested CPU (millicores, None when unknown)."""
    look = usage_of(usage)
    total = 0.0
    for v, ss in shapes.items():
        cards = devices.get(v, ())
        for s in ss:
            x = model.placement_delta(cards, look, s, cpu_free)
            if x is None:
                return math.inf
            total += x
    return total
