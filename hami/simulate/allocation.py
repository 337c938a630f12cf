"""What the cards of a replay hold: cores, memory and sharer slots per card, and the share of each
card's capacity taken (the largest of the three), summed per card model, per vendor family and over
the cluster (pure; no I/O).

Why the largest of the three: HAMi's fit binds a card by whichever of its cores, memory and slots
runs out first. A card whose memory is all taken by pods that state no cores takes no further pod,
however idle its compute; counted by cores alone it would read as empty. The headline allocation of
a run is therefore the cards' capacity taken (per card the largest of its used shares, averaged over
the cards), with the cores, memory and slot shares beside it. The per-card figure is
`hami.fragmentation.taken_share`, the one the fragmentation measure counts free capacity with.

Kept incrementally from each pod's card grants (the core's own collapse rule), so the figures can be
sampled after every pod without walking every card; `card_figures` computes them from
`ClusterState.card_stats()` (the core's view; tests hold the two equal).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from hami.cluster import ClusterState
from hami.fragmentation import free_capacity
from hami.model import CardGrant, Device, DeviceUsage
from hami.simulate.results import Figures, ModelUsage
from hami.simulate.workload import SimNode, model_of
from hami.vendors.base import Vendor


def families(vendors: Mapping[str, Vendor]) -> dict[str, str]:
    """Vendor CommonWord -> vendor family: the vendor module's name (``nvidia``, ``ascend`` for every
    Ascend chip, ``enflame`` for whole GCUs and DRS, ...), the names of `hami simulate --vendors`."""
    return {word: type(v).__module__.rsplit(".", 1)[-1] for word, v in vendors.items()}


def _taken(devcore: int, devmem: int, count: int, cores: int, mem: int, slots: int) -> float:
    # 1 minus the measure's free capacity: a multiple of 2**-30, so sums of it are exact in any order
    d = Device("", 0, count, devmem, devcore, "")
    return 1.0 - free_capacity(d, DeviceUsage(slots, mem, cores))


def figures_of(u: ModelUsage) -> Figures:
    """The ratios of one group's totals."""
    return Figures(
        u.usedcores / u.devcore if u.devcore else 0.0,
        u.usedmem / u.devmem if u.devmem else 0.0,
        u.usedslots / u.slots if u.slots else 0.0,
        u.taken / u.cards if u.cards else 0.0,
    )


class _Group:
    __slots__ = ("cards", "devcore", "devmem", "slots", "cores", "mem", "used", "taken")

    def __init__(self) -> None:
        self.cards = self.devcore = self.devmem = self.slots = 0
        self.cores = self.mem = self.used = 0
        self.taken = 0.0

    def usage(self) -> ModelUsage:
        return ModelUsage(
            self.cards, self.devcore, self.cores, self.devmem, self.mem, self.slots, self.used, self.taken
        )


class CardUsage:
    """Per card its cores (percent), memory (MiB) and slots held, and per card model, vendor family and
    in all the sums; updated by `apply` with the grants of a pod placed (+1) or gone (-1)."""

    def __init__(self, nodes: Sequence[SimNode], family: Mapping[str, str]) -> None:
        self.index: dict[str, int] = {}
        self._cap: list[tuple[int, int, int]] = []  # devcore, devmem, count
        self._held: list[list[int]] = []  # cores, mem, slots
        self._taken: list[float] = []
        self._groups: list[tuple[_Group, _Group]] = []
        self.models: dict[str, _Group] = {}
        self.families: dict[str, _Group] = {}
        self.all = _Group()
        for n in nodes:
            for c in n.cards:
                self.index[c.uuid] = len(self._cap)
                self._cap.append((c.devcore, c.devmem, c.count))
                self._held.append([0, 0, 0])
                taken = _taken(c.devcore, c.devmem, c.count, 0, 0, 0)
                self._taken.append(taken)
                groups = (
                    self.models.setdefault(model_of(c.type), _Group()),
                    self.families.setdefault(family.get(c.vendor, c.vendor.lower()), _Group()),
                )
                self._groups.append(groups)
                for g in (*groups, self.all):
                    g.cards += 1
                    g.devcore += c.devcore
                    g.devmem += c.devmem
                    g.slots += c.count
                    g.taken += taken
        self.models = dict(sorted(self.models.items()))
        self.families = dict(sorted(self.families.items()))

    @property
    def devcore(self) -> int:
        return self.all.devcore

    def held(self, grants: Sequence[CardGrant]) -> list[tuple[int, int, int, int]]:
        """(card index, cores, MiB, slots) of the grants on cards of the input."""
        index = self.index
        return [(index[g.uuid], g.usedcores, g.usedmem, g.slots) for g in grants if g.uuid in index]

    def apply(self, held: Sequence[tuple[int, int, int, int]], sign: int) -> None:
        for i, cores, mem, slots in held:
            h = self._held[i]
            h[0] += sign * cores
            h[1] += sign * mem
            h[2] += sign * slots
            before = self._taken[i]
            after = self._taken[i] = _taken(*self._cap[i], *h)
            for g in (*self._groups[i], self.all):
                g.cores += sign * cores
                g.mem += sign * mem
                g.used += sign * slots
                g.taken += after - before

    def ratios(self) -> Figures:
        """The cluster's figures now."""
        return figures_of(self.all.usage())

    def per_model(self) -> dict[str, ModelUsage]:
        return {m: g.usage() for m, g in self.models.items()}

    def per_family(self) -> dict[str, ModelUsage]:
        return {f: g.usage() for f, g in self.families.items()}


def card_figures(
    state: ClusterState, family: Mapping[str, str]
) -> tuple[Figures, dict[str, ModelUsage], dict[str, ModelUsage]]:
    """(the cluster's figures, per model, per vendor family) from `ClusterState.card_stats()`: the
    core's own view, which `CardUsage` must equal (tests hold that)."""
    models: dict[str, _Group] = {}
    fams: dict[str, _Group] = {}
    everything = _Group()
    for s in state.card_stats():
        taken = _taken(s.devcore, s.devmem, s.count, s.usedcores, s.usedmem, s.used)
        for g in (
            models.setdefault(model_of(s.type), _Group()),
            fams.setdefault(family.get(s.vendor, s.vendor.lower()), _Group()),
            everything,
        ):
            g.cards += 1
            g.devcore += s.devcore
            g.devmem += s.devmem
            g.slots += s.count
            g.cores += s.usedcores
            g.mem += s.usedmem
            g.used += s.used
            g.taken += taken
    return (
        figures_of(everything.usage()),
        {m: g.usage() for m, g in sorted(models.items())},
        {f: g.usage() for f, g in sorted(fams.items())},
    )
