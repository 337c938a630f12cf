"""The fragmentation measure of one node's cards and its memoised per-card terms under one vendor's
distribution of request shapes (pure; no I/O, no clock). The measure is stated in `hami.fragmentation`,
which re-exports these names and holds the learned workload (`FragmentationModel`) that builds one
`VendorMeasure` per vendor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from hami.card_checks import core_reason
from hami.fragmentation_workload import Shape
from hami.model import Device, DeviceUsage

#: Capacity figures are multiples of 1 / GRAIN cards (rounded to the nearest): sums of them are exact
#: in any order (30 bits of fraction leave 23 bits for whole cards, far above a node's or a fleet's).
GRAIN = float(1 << 30)


def _grain(x: float) -> float:
    return round(x * GRAIN) / GRAIN


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


def taken_share(d: Device, u: DeviceUsage) -> float:
    """The card's share taken (0..1 and above when over-committed): the largest of its used share of
    cores, of memory and of sharer slots. A dimension the card does not register (0) is left out; a
    card without slots takes nothing (1)."""
    share = u.used / d.count if d.count > 0 else 1.0
    if d.devcore > 0:
        share = max(share, u.usedcores / d.devcore)
    if d.devmem > 0:
        share = max(share, u.usedmem / d.devmem)
    return share


def free_capacity(d: Device, u: DeviceUsage) -> float:
    """`c_g`: the card's free capacity in cards (0..1): 1 minus its `taken_share`."""
    return _grain(min(1.0, max(0.0, 1.0 - taken_share(d, u))))


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


def capacity_used(d: Device, u: DeviceUsage, s: Shape, k: int) -> float:
    """`u_g`: how far `k` more containers of `s` raise card `d`'s share taken (cards), at most its
    free capacity: each dimension moves by what the containers take of it (cores, MiB, one slot
    each) and the card's share is the largest of the three again."""
    if k <= 0:
        return 0.0
    before = taken_share(d, u)
    after = (u.used + k) / d.count if d.count > 0 else 1.0
    if d.devcore > 0:
        after = max(after, (u.usedcores + k * s.cores) / d.devcore)
    if d.devmem > 0:
        after = max(after, (u.usedmem + k * s.mem_on(d.devmem)) / d.devmem)
    return min(free_capacity(d, u), _grain(max(0.0, after - before)))


def node_fragmentation(
    devices: Sequence[Device],
    usage: Callable[[str], DeviceUsage],
    dist: Mapping[Shape, float],
    cpu_free: float = math.inf,
) -> float:
    """The paper's per-card measure of one node (cards), from scratch: for each shape, the free
    capacity of the cards that cannot take one container of it (all of the node's when fewer than
    `nums` cards can, or its CPU cannot feed the pod). `cpu_free` is the node's unrequested CPU in
    millicores. A reader's statement of the paper's measure; the policy scores with
    `packed_fragmentation`, which also counts residues and CPU-starved cards."""
    total = 0.0
    for s, p in dist.items():
        rs = [
            (free_capacity(d, usage(d.uuid)), s.cpu <= cpu_free and serves(d, usage(d.uuid), s))
            for d in devices
        ]
        frag = sum(r for r, ok in rs if not ok)
        if sum(1 for _, ok in rs if ok) < s.nums:
            frag += sum(r for r, ok in rs if ok)
        total += p * frag
    return total


def _pods_of(s: Shape, k: int, cpu_free: float | None) -> int:
    """Pods of `s` a node with `k` containers' room on its cards and `cpu_free` millicores can run."""
    c = k // s.nums
    if s.cpu > 0 and cpu_free is not None:
        c = min(c, int(cpu_free // s.cpu)) if cpu_free > 0 else 0
    return c


def packed_fragmentation(
    devices: Sequence[Device],
    usage: Callable[[str], DeviceUsage],
    dist: Mapping[Shape, float],
    cpu_free: float = math.inf,
    *,
    cpu_weight: float = 0.0,
    cpu_per_card: float = 0.0,
) -> float:
    """The measure the `fragmentation` policy scores with, from scratch (the reference of the memoised
    path): for each shape m, the node's free capacity that m could not take if only m arrived,

    ``F_n(m) = C - U x min(1, c nums / K)``, ``c = min(floor(K / nums), floor(cpu_free / cpu_m))``,

    with ``C = sum_g free_capacity``, ``K = sum_g containers_on`` and ``U = sum_g capacity_used`` (of
    the `K` containers); ``F_n(M) = sum_m p_m F_n(m)``. It counts the residue a share leaves on a card
    (a 0.9 free card serves one 0.5 share, the other 0.4 is lost), the cards the node's CPU cannot feed
    (4 free cards and the CPU of one pod: 3 are lost), and the dimension a shape leaves unusable (a
    card whose memory is taken has no free capacity left, whatever its cores). With `cpu_weight`, plus
    the CPU term ``cpu_weight x min(C, max(0, C - cpu_free / cpu_per_card))``: the free capacity that the
    node's CPU cannot feed at the workload's CPU per card of capacity (`FragmentationModel`).
    """
    look = [(d, usage(d.uuid)) for d in devices]
    free = sum(free_capacity(d, u) for d, u in look)
    cpu = None if math.isinf(cpu_free) else cpu_free
    total = 0.0
    for s, p in dist.items():
        ks = [containers_on(d, u, s) for d, u in look]
        k = sum(ks)
        big_u = sum(capacity_used(d, u, s, x) for (d, u), x in zip(look, ks, strict=True))
        c = _pods_of(s, k, cpu)
        x = 0.0
        if c:
            x = big_u if c * s.nums >= k else big_u * (c * s.nums / k)
        total += p * (free - min(free, x))
    if cpu_weight and cpu_per_card > 0 and cpu is not None:
        # the CPU term: free capacity the node's CPU cannot feed at `cpu_per_card` millicores per card
        total += cpu_weight * min(free, max(0.0, free - cpu / cpu_per_card))
    return total


def card_state(d: Device, u: DeviceUsage) -> tuple:
    """What a card's terms depend on: (type, devmem, devcore, count, health, used, usedmem, usedcores)."""
    return (d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores)


def card_of_state(state: tuple) -> tuple[Device, DeviceUsage]:
    """A card and its usage in the given `card_state` (no UUID: for the measure only)."""
    typ, devmem, devcore, count, health, used, usedmem, usedcores = state
    return Device("", 0, count, devmem, devcore, typ, health=health), DeviceUsage(used, usedmem, usedcores)


_state = card_state

#: (free capacity, containers of each active shape, capacity they would take): one card's terms.
Terms = tuple[float, tuple[int, ...], tuple[float, ...]]


class VendorMeasure:
    """`packed_fragmentation` of one vendor's cards under a distribution of that vendor's shapes (the
    popularities sum to 1), with the per-card terms memoised by card state; built by
    `FragmentationModel.of` for its active distribution and dropped with it.

    Not thread-safe on its own: `hami.cluster.ClusterState` calls it under its lock.
    """

    def __init__(
        self,
        dist: Mapping[Shape, float],
        version: int = 0,
        *,
        cpu_weight: float = 0.0,
        cpu_per_card: float = 0.0,
    ) -> None:
        self.dist = dict(dist)
        #: The learned workload's version this measure belongs to (tables compare it).
        self.version = version
        #: The CPU term (`_value`): the weight of a node's free capacity that its free CPU cannot feed
        #: at `cpu_per_card` millicores per card of capacity (the workload's own ratio); 0: none.
        self.cpu_weight = cpu_weight if cpu_per_card > 0 else 0.0
        self.cpu_per_card = cpu_per_card
        self._shapes = tuple(self.dist)
        self._p = tuple(self.dist.values())
        self._nums = tuple(s.nums for s in self._shapes)
        self._cpu = tuple(s.cpu for s in self._shapes)
        self._memo: dict[tuple, Terms] = {}
        self._moves: dict[tuple, tuple[float, tuple[int, ...], tuple[float, ...]] | None] = {}

    def card_terms(self, d: Device, u: DeviceUsage) -> Terms:
        """(free capacity in cards, containers of each active shape it could take, capacity they would
        take in cards), memoised by state."""
        key = (d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores)
        t = self._memo.get(key)
        if t is None:
            if len(self._memo) > 200_000:
                self._memo.clear()  # bound memory on fleets with very many distinct card states
            ks = tuple(containers_on(d, u, s) for s in self._shapes)
            us = tuple(capacity_used(d, u, s, k) for s, k in zip(self._shapes, ks, strict=True))
            t = self._memo[key] = (free_capacity(d, u), ks, us)
        return t

    def _value(self, free: float, k: Sequence[int], use: Sequence[float], cpu_free: float | None) -> float:
        used = 0.0
        for p, n, cpu, km, um in zip(self._p, self._nums, self._cpu, k, use, strict=True):
            c = km // n
            if cpu > 0 and cpu_free is not None:
                c = min(c, int(cpu_free // cpu)) if cpu_free > 0 else 0
            if c:
                cn = c * n
                x = um if cn >= km else um * (cn / km)
                used += p * (x if x < free else free)
        out = free - used
        if self.cpu_weight and cpu_free is not None:
            # capacity the node's CPU cannot feed at the workload's CPU per card (0 while it can)
            starved = free - cpu_free / self.cpu_per_card
            starved = free if starved > free else (starved if starved > 0.0 else 0.0)  # 0..free
            out += self.cpu_weight * starved
        return out

    def _sum(self, terms: Sequence[Terms]) -> tuple[float, tuple[int, ...], tuple[float, ...]]:
        free = sum(t[0] for t in terms)
        if not terms:
            return free, (0,) * len(self._p), (0.0,) * len(self._p)
        k = tuple(sum(col) for col in zip(*(t[1] for t in terms), strict=True))
        use = tuple(sum(col) for col in zip(*(t[2] for t in terms), strict=True))
        return free, k, use

    def node_value(
        self, devices: Sequence[Device], usage: Callable[[str], DeviceUsage], cpu_free: float | None = None
    ) -> float:
        """`F_n(M)` of a node (cards) from the memoised per-card terms; `cpu_free` millicores (None: no
        CPU limit). Equals `packed_fragmentation` over `active` (a property test holds that)."""
        return self._value(*self._sum([self.card_terms(d, usage(d.uuid)) for d in devices]), cpu_free)

    def _after(self, d: Device, u: DeviceUsage, mem: int, cores: int) -> Terms:
        return self.card_terms(d, DeviceUsage(u.used + 1, u.usedmem + mem, u.usedcores + cores))

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
        free, k, use = self._sum(terms)
        before = self._value(free, k, use, cpu_free)
        after_cpu = None if cpu_free is None else cpu_free - cpu
        out = []
        seen: dict[tuple, float] = {}  # cards in one state (and memory asked) have one increase
        for i, mem in candidates:
            d = devices[i]
            u = usage(d.uuid)
            key = (d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores, mem)
            x = seen.get(key)
            if x is None:
                r0, k0, u0 = terms[i]
                r1, k1, u1 = self._after(d, u, mem, cores)
                k2 = [a - b + c for a, b, c in zip(k, k0, k1, strict=True)]
                u2 = [a - b + c for a, b, c in zip(use, u0, u1, strict=True)]
                x = seen[key] = self._value(free - r0 + r1, k2, u2, after_cpu) - before
            out.append(x)
        return out

    def node_terms(
        self, devices: Sequence[Device], usage: Callable[[str], DeviceUsage]
    ) -> tuple[float, tuple[int, ...], tuple[float, ...]]:
        """(free capacity in cards, containers of each active shape, capacity they would take) summed
        over a node's cards."""
        return self._sum([self.card_terms(d, usage(d.uuid)) for d in devices])

    def value_of(self, free: float, k: Sequence[int], use: Sequence[float], cpu_free: float | None) -> float:
        """`F_n(M)` of a node from its `node_terms` and free CPU (millicores, None: no limit)."""
        return self._value(free, k, use, cpu_free)

    @staticmethod
    def node_states(devices: Sequence[Device], usage: Callable[[str], DeviceUsage]) -> tuple:
        """The node's card states, sorted: nodes with equal states have equal terms and the same
        `gpu_move`."""
        return tuple(sorted(_state(d, usage(d.uuid)) for d in devices))

    def gpu_move(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        shape: Shape,
        states: tuple | None = None,
    ) -> tuple[float, tuple[int, ...], tuple[float, ...]] | None:
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
            cands = [
                (i, shape.mem_on(d.devmem)) for i, d in enumerate(devices) if serves(d, usage(d.uuid), shape)
            ]
        deltas = self._deltas(devices, usage, cands, shape.cores, None, 0)
        best = sorted(range(len(cands)), key=lambda j: (deltas[j], j))[: shape.nums]
        for j in best:
            i, mem = cands[j]
            terms[i] = self._after(devices[i], usage(devices[i].uuid), mem, shape.cores)
        out = self._moves[mkey] = self._sum(terms)
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
        cands = [
            (i, shape.mem_on(d.devmem)) for i, d in enumerate(devices) if serves(d, usage(d.uuid), shape)
        ]
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
            terms[i] = self._after(devices[i], usage(devices[i].uuid), mem, shape.cores)
        after = self._value(*self._sum(terms), None if cpu_free is None else cpu_free - shape.cpu)
        return after - before
