"""Fragmentation-aware placement: the expected fragmentation of cards and nodes under the arriving
workload, learned online, and the increase a placement causes (pure; no I/O, no clock).

The measure is the one of the FGD paper (Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing
Workloads with Fragmentation Gradient Descent", USENIX ATC '23): the fragmentation of a node for a task
is the node's unallocated GPU capacity that the task cannot use, and the expected fragmentation is its
mean over the workload's tasks. The paper counts one GPU dimension (its tasks ask for a share of a
card's compute, memory following). HAMi binds a card by three: cores (percent), memory (MiB) and
sharer slots, and a request states any of them (`nvidia.com/gpumem` alone is the most common), so the
measure counts each dimension a request takes, restated for HAMi's sharing model:

- a workload is a distribution over request *shapes* `Shape` (cards per container, memory per card in
  MiB or percent, cores percent per card, allowed models, the pod's CPU), each with a popularity `p_m`;
- a card *serves* a shape when HAMi's per-card fit would let one container of that shape onto it now:
  healthy, a free slot, the model allowed, free memory >= the shape's MiB on that card, and the core rule
  of `hami.card_checks.core_reason` (free cores, a 100 % request needs an idle 100 % card);
- a card's *share taken* is the largest of its used cores / devcore, used MiB / devmem and used slots /
  count (what binds it: a card whose memory is full takes no pod, whatever its cores), and its free
  capacity `c_g` is 1 minus that, in cards (`free_capacity`);
- for a shape m, card g could still take `k_g(m)` containers (`containers_on`: free slots, free MiB,
  free cores), which would raise its share taken by `u_g(m)` (`capacity_used`, at most `c_g`): each
  dimension moves by what the containers take of it, and the card's share is the largest again;
- the fragmentation of node n for m is the free capacity that containers of m could not take if only m
  arrived: ``F_n(m) = sum_g c_g - U x min(1, c_m nums_m / K)``, with ``K = sum_g k_g(m)``,
  ``U = sum_g u_g(m)`` and ``c_m = min(floor(K / nums_m), floor(cpu_free / cpu_m))`` the pods of m the
  node can run (cards and kube-scheduler's CPU fit); when the node cannot run m at all, all of its free
  capacity is a fragment for m (the paper's case "the task cannot be placed on the node");
- the expected fragmentation is ``F_n(M) = sum_m p_m F_n(m)`` (in cards), and a placement is scored by
  ``F_n(M)`` after minus before: the smaller (most negative) the better.

For shares that state cores and memory alike (the paper's tasks) the share taken is the compute share
and the measure is the paper's, with the residue a share leaves counted (a card with 0.9 free takes one
0.5 share and the other 0.4 is lost to that shape); for a memory-only request it is the memory.
Capacity figures are kept in multiples of 2**-30 cards (rounded to the nearest), so that their sums are exact in
any order: nodes in the same state have the same figures bit for bit, whatever the order of their cards.

Each vendor's cards are measured under that vendor's shapes only (a Cambricon pod says nothing about
which NVIDIA card is a fragment), with their popularities normalised within the vendor
(`FragmentationModel.of`, `hami.fragmentation_measure.VendorMeasure`); a vendor no pod has asked for
yet is measured under the prior. Per-card terms are memoised by card state (model, capacity, usage),
which repeats across a fleet, so a node's figure is a few dict lookups.

The distribution is learned from the pods the scheduler sees (`WorkloadHistogram`: exponentially
decaying counts with a prior that fades), kept only in memory; a restarted scheduler relearns it from
the live pods. Scores use a frozen copy (`FragmentationModel.version`) that is refreshed only when the
learned distribution has drifted (total variation distance), so memoised terms stay valid in between.
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from hami.fragmentation_measure import (
    GRAIN,
    Terms,
    VendorMeasure,
    capacity_used,
    card_of_state,
    card_state,
    containers_on,
    free_capacity,
    node_fragmentation,
    packed_fragmentation,
    serves,
    taken_share,
)
from hami.fragmentation_workload import (
    DEFAULT_PRIOR,
    Shape,
    WorkloadHistogram,
    node_cpu_milli,
    pod_cpu_milli,
    pod_shapes,
    shape_of,
    total_variation,
)
from hami.model import Device, DeviceUsage

__all__ = [
    "DEFAULT_PRIOR",
    "GRAIN",
    "FragmentationModel",
    "Shape",
    "Terms",
    "VendorMeasure",
    "WorkloadHistogram",
    "capacity_used",
    "card_of_state",
    "card_state",
    "containers_on",
    "free_capacity",
    "node_cpu_milli",
    "node_fragmentation",
    "packed_fragmentation",
    "pod_cpu_milli",
    "pod_delta",
    "pod_shapes",
    "serves",
    "shape_of",
    "taken_share",
    "total_variation",
    "usage_of",
]

_ZERO = DeviceUsage()

#: Weight of the CPU term of the measure (`VendorMeasure.cpu_weight`): the free capacity a node's CPU
#: cannot feed at the workload's CPU per card of capacity, counted as a fragment.
CPU_WEIGHT = 1.0

#: A learned shape's popularity is its count / (cards of capacity it asks) ** DEMAND_EXPONENT.
DEMAND_EXPONENT = 2.0

#: Per observation, the decay of the CPU-per-card average (a half-life of 4000 pods, as the shapes).
_CPU_DECAY = 2.0 ** (-1 / 4000)

#: The card the learned shapes' demand is measured on until a node of their vendor registers one:
#: 16 GiB, 100 cores, HAMi's default of 10 sharers.
REFERENCE_CARD = (16384, 100, 10)


def _vendor_of(devices: Sequence[Device]) -> str:
    return devices[0].vendor if devices else "NVIDIA"


class FragmentationModel:
    """The learned workload and, per vendor, the measure under it (`VendorMeasure`, memoised per-card
    terms); what the `fragmentation` policy scores with (`packed_fragmentation` of each vendor's cards
    under that vendor's part of the active distribution).

    Not thread-safe on its own: `hami.cluster.ClusterState` calls it under its lock.

    `observe` feeds arriving pods; the distribution used for scores (`active`: per vendor its
    `max_shapes` most popular shapes, popularities over all of them) is refreshed from the histogram
    every `check_every` observations when it has moved by more than `drift` (total variation), which
    bumps `version` and drops the measures and tables (node caches compare the version). `max_shapes`
    bounds the work per card. Figures are in cards of capacity (1.0 = one whole card).
    """

    def __init__(
        self,
        histogram: WorkloadHistogram | None = None,
        *,
        max_shapes: int = 32,
        drift: float = 0.05,
        check_every: int = 128,
        remember_uids: int = 20000,
        cpu_weight: float = CPU_WEIGHT,
    ) -> None:
        self.histogram = histogram or WorkloadHistogram()
        #: Weight of the CPU term (`VendorMeasure.cpu_weight`); 0 leaves it out.
        self.cpu_weight = cpu_weight
        # per vendor, decaying sums of the pods' CPU (millicores) and demand (cards of capacity)
        self._cpu_sums: dict[str, list[float]] = {}
        self.max_shapes, self.drift, self.check_every = max_shapes, drift, check_every
        self.version = 0
        self._since = 0
        self._every = check_every
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._remember = remember_uids
        #: Cards registered so far per vendor, by (devmem, devcore, count): the most common one is what
        #: a learned shape's demand (its popularity weight) is measured on.
        self._cards: dict[str, Counter[tuple[int, int, int]]] = {}
        self._reference: dict[str, tuple[int, int, int]] = {}
        self._set_active(self._live())

    def _set_active(self, dist: dict[Shape, float]) -> None:
        self.active = dist
        # the CPU per card of capacity each vendor's measure uses until the next refresh
        sums = getattr(self, "_cpu_sums", {})
        self._ratios = {v: c / d for v, (c, d) in sums.items() if d > 0}
        self._measures: dict[str, VendorMeasure] = {}
        #: Per vendor, the node terms of this distribution as columns (`hami.fragmentation_table`),
        #: built by the filter that scores with them; dropped with the measures.
        self.tables: dict[str, Any] = {}
        self.version += 1

    def _live(self) -> dict[Shape, float]:
        """The histogram's distribution, per vendor its `max_shapes` most popular shapes."""
        per: Counter[str] = Counter()
        kept = []
        for s, w in sorted(self.histogram.weights.items(), key=lambda kv: (-kv[1], kv[0])):
            if per[s.vendor] < self.max_shapes:
                per[s.vendor] += 1
                kept.append((s, w))
        z = sum(w for _, w in kept)
        return {s: w / z for s, w in kept} if z > 0 else {}

    def of(self, vendor: str) -> VendorMeasure:
        """The measure of `vendor`'s cards: its shapes of `active`, popularities normalised within the
        vendor; when no pod of the vendor has been counted, the prior's shapes as shares of memory
        (the one dimension every vendor registers; cores are counted in vendor units)."""
        m = self._measures.get(vendor)
        if m is None:
            sub = {s: p for s, p in self.active.items() if s.vendor == vendor}
            if not sub:
                sub = {s._replace(cores=0, vendor=vendor): p for s, p in DEFAULT_PRIOR.items()}
            z = sum(sub.values())
            ratio = self._ratios.get(vendor, 0.0)
            m = self._measures[vendor] = VendorMeasure(
                {s: p / z for s, p in sub.items()},
                self.version,
                cpu_weight=self.cpu_weight,
                cpu_per_card=ratio,
            )
        return m

    # -- learning ---------------------------------------------------------------------------------

    def note_cards(self, devices: Iterable[Device]) -> None:
        """Count registered cards (a node's registration), for the reference card of `demand`."""
        for d in devices:
            c = self._cards.setdefault(d.vendor, Counter())
            c[(d.devmem, d.devcore, d.count)] += 1
        for vendor, c in self._cards.items():
            self._reference[vendor] = c.most_common(1)[0][0]

    @property
    def reference(self) -> tuple[int, int, int]:
        """The NVIDIA reference card (devmem MiB, devcore, slots): the most common registered."""
        return self._reference.get("NVIDIA", REFERENCE_CARD)

    def demand(self, s: Shape) -> float:
        """Cards of capacity one container of `s` takes on its vendor's reference card (the most common
        card of the vendor registered): its share of that card (`Shape.share_on`) times its cards."""
        return s.share_on(*self._reference.get(s.vendor, REFERENCE_CARD)) * s.nums

    def seen(self, uid: str) -> bool:
        """Whether pod `uid` was counted recently (`observe` would skip it)."""
        return uid in self._seen

    def observe(self, shapes: Iterable[Shape], uid: str | None = None) -> bool:
        """Count one arriving pod's container shapes, each weighted 1 / (containers x (cards of capacity
        it asks, `demand`) squared), so the small shares that fill the last gaps count for more than
        their share of the pods. A `uid` seen recently (a retried filter, a pod event after the
        filter) is not counted again. True when counted."""
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
            sums = self._cpu_sums.setdefault(s.vendor, [0.0, 0.0])
            sums[0] = sums[0] * _CPU_DECAY + s.cpu  # the pod's CPU is on its first shape only
            sums[1] = sums[1] * _CPU_DECAY + self.demand(s)
            # Weighted count / cards asked squared: on the Alibaba trace (openb default, fill to 130 %,
            # seeds 1-10) this kept 0.4 points more GPU allocation than count / cards, and 0.6 more
            # than a plain count, by keeping room for the small shares that fill the last gaps.
            c = max(self.demand(s), 0.01)
            w = 1.0 / len(shapes) / c**DEMAND_EXPONENT
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
        live = self._live()
        if total_variation(live, self.active) <= self.drift:
            return False
        self._set_active(live)
        return True

    # -- the measure, by the vendor of the cards (or of the shape) --------------------------------

    def card_terms(self, d: Device, u: DeviceUsage) -> Terms:
        """`VendorMeasure.card_terms` of card `d` under its vendor's shapes."""
        return self.of(d.vendor).card_terms(d, u)

    def node_value(
        self, devices: Sequence[Device], usage: Callable[[str], DeviceUsage], cpu_free: float | None = None
    ) -> float:
        """`F_n(M)` of one vendor's cards of a node (cards; `VendorMeasure.node_value`)."""
        return self.of(_vendor_of(devices)).node_value(devices, usage, cpu_free)

    def node_terms(
        self, devices: Sequence[Device], usage: Callable[[str], DeviceUsage]
    ) -> tuple[float, tuple[int, ...], tuple[float, ...]]:
        """`VendorMeasure.node_terms` of one vendor's cards of a node."""
        return self.of(_vendor_of(devices)).node_terms(devices, usage)

    def value_of(
        self,
        free: float,
        k: Sequence[int],
        use: Sequence[float],
        cpu_free: float | None,
        vendor: str = "NVIDIA",
    ) -> float:
        """`VendorMeasure.value_of` under `vendor`'s shapes."""
        return self.of(vendor).value_of(free, k, use, cpu_free)

    node_states = staticmethod(VendorMeasure.node_states)

    def gpu_move(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        shape: Shape,
        states: tuple | None = None,
    ) -> tuple[float, tuple[int, ...], tuple[float, ...]] | None:
        """`VendorMeasure.gpu_move` under the shape's vendor."""
        return self.of(shape.vendor).gpu_move(devices, usage, shape, states)

    def card_deltas(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        candidates: Sequence[tuple[Device, int]],
        cores: int,
    ) -> list[float]:
        """`VendorMeasure.card_deltas` of one vendor's cards."""
        return self.of(_vendor_of(devices)).card_deltas(devices, usage, candidates, cores)

    def placement_delta(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        shape: Shape,
        cpu_free: float | None = None,
    ) -> float | None:
        """`VendorMeasure.placement_delta` under the shape's vendor."""
        return self.of(shape.vendor).placement_delta(devices, usage, shape, cpu_free)


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
