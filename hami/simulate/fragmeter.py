"""The cluster's expected fragmentation during a replay, per node and in total, for the reports.

Every policy's run is measured the same way, so the figures compare: each node's `F_n(M)` (cards of
free capacity that the arriving workload could not use, `hami.fragmentation.FragmentationModel.node_value`)
under the workload the run's `ClusterState` has learned by then, summed over the nodes. The measure is
the one the `fragmentation` policy scores with; see docs/simulate.md.

Why a cache: at 10,000 nodes a full measurement walks 80,000 cards, and between two checkpoints most
nodes do not change. A node's figures are kept with the state they were computed from (the learned
workload's version, the node's free CPU and its cards' usage) and reused while it still holds.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from hami import fragmentation
from hami.simulate.workload import model_of

if TYPE_CHECKING:
    from hami.cluster import ClusterState


@dataclass(frozen=True, slots=True)
class NodeFragmentation:
    """One node's figures: `free` and `fragmented` in cards of capacity (1.0 = one whole card, free as
    `hami.fragmentation.free_capacity`), `models` its card models joined by ``+`` (``T4``), `cards` how
    many it registers."""

    node: str
    models: str
    cards: int
    free: float
    fragmented: float
    #: Cordoned (`spec.unschedulable`): takes no new pod, so all its free capacity is fragmented; the
    #: reports show such nodes apart from the most fragmented schedulable ones.
    cordoned: bool = False

    @property
    def ratio(self) -> float | None:
        """Fragmented share of the node's free capacity, 0..1; None when nothing is free."""
        return self.fragmented / self.free if self.free > 0 else None


@dataclass(frozen=True, slots=True)
class ClusterFragmentation:
    """The whole cluster at one moment: cards of free capacity and of fragmented capacity, summed over
    the nodes, and the learned workload it was measured with (`shapes` request shapes, `version`)."""

    free: float
    fragmented: float
    shapes: int
    version: int

    @property
    def ratio(self) -> float | None:
        """Fragmented share of the cluster's free capacity, 0..1; None when nothing is free."""
        return self.fragmented / self.free if self.free > 0 else None


def top_nodes(
    nodes: list[NodeFragmentation], n: int | None = None, *, cordoned: bool | None = None
) -> list[NodeFragmentation]:
    """The most fragmented nodes first (fragmented cards, then fragmented share, then name), at most `n`;
    with `cordoned` False (True) only the schedulable (cordoned) ones."""
    if cordoned is not None:
        nodes = [x for x in nodes if x.cordoned is cordoned]
    order = sorted(nodes, key=lambda x: (-x.fragmented, -(x.ratio or 0.0), x.node))
    return order if n is None else order[:n]


class FragmentationMeter:
    """Measures one `ClusterState` (a replay's; its nodes' registrations do not change during it).

    Reads the state's node records under its lock, as the state's own score log does
    (`hami.cluster_scoring`): per node and vendor, ``node_value(devices, usage_of(usage), cpu_free())``.
    """

    def __init__(self, state: ClusterState, closed: frozenset[str] = frozenset()) -> None:
        self.state = state
        #: Nodes that take no new pod (cordoned, `spec.unschedulable`): all their free capacity is a
        #: fragment, whatever shape arrives.
        self.closed = closed
        # node name -> (generation, node state key, free cards, fragmented cards)
        self._cache: dict[str, tuple[int, tuple, float, float]] = {}
        # The learned workload and version the cached figures hold for, and a counter of its changes.
        self._workload: tuple[fragmentation.FragmentationModel | None, int] = (None, -1)
        self._generation = 0
        self._shared: dict[tuple, float] = {}
        self._models: dict[str, tuple[str, int]] = {}
        self.last: dict[str, tuple[float, float]] = {}

    def measure(self) -> ClusterFragmentation:
        """Every node's figures now (kept in `last`: name -> (free, fragmented)) and their sums."""
        state = self.state
        model = state.fragmentation
        version = model.version
        if self._workload[0] is not model or self._workload[1] != version:
            # Figures under another workload do not hold; nodes in the same state (most idle nodes,
            # most full ones) share one computation per workload.
            self._workload = (model, version)
            self._generation += 1
            self._shared = {}
        cache, shared, generation = self._cache, self._shared, self._generation
        last: dict[str, tuple[float, float]] = {}
        free_total = frag_total = 0.0
        with state._lock:
            for name, n in state._nodes.items():
                cpu = n.cpu_free()
                key = (cpu, tuple([(k, u.used, u.usedmem, u.usedcores) for k, u in n.usage.items()]))
                hit = cache.get(name)
                if hit is not None and hit[0] == generation and hit[1] == key:
                    free, frag = hit[2], hit[3]
                else:
                    free, frag = self._node(n, cpu, model, shared)
                    if name in self.closed:
                        frag = free
                    cache[name] = (generation, key, free, frag)
                last[name] = (free, frag)
                free_total += free
                frag_total += frag
        self.last = last
        return ClusterFragmentation(free_total, frag_total, len(model.active), version)

    def _node(
        self, n, cpu: int | None, model: fragmentation.FragmentationModel, shared: dict
    ) -> tuple[float, float]:
        look = fragmentation.usage_of(n.usage)
        devices = n.devices
        if n.cordoned:
            # Cards cordoned through `hami.io/device-cordon` take no pod: measured as not serving any.
            devices = {v: [replace(d, health=False) if d.uuid in n.cordoned else d for d in ds]
                       for v, ds in devices.items()}  # fmt: skip
        if n.name not in self._models:
            cards = [d for ds in devices.values() for d in ds]
            self._models[n.name] = ("+".join(sorted({model_of(d.type) for d in cards})), len(cards))
        free = sum(fragmentation.free_capacity(d, look(d.uuid)) for ds in devices.values() for d in ds)
        if free <= 0:
            return free, 0.0  # nothing free, nothing fragmented
        states = (cpu, tuple(
            (v, tuple(sorted((d.type, d.devmem, d.devcore, d.count, d.health, u.used, u.usedmem, u.usedcores)
                             for d in ds for u in (look(d.uuid),))))
            for v, ds in devices.items()
        ))  # fmt: skip
        frag = shared.get(states)
        if frag is None:
            frag = shared[states] = sum(model.node_value(ds, look, cpu) for ds in devices.values() if ds)
        return free, frag

    def nodes(self, figures: dict[str, tuple[float, float]] | None = None) -> list[NodeFragmentation]:
        """The nodes of `figures` (default: the last measurement) as rows, in the state's node order."""
        figures = self.last if figures is None else figures
        out = []
        for name, (free, frag) in figures.items():
            models, cards = self._models.get(name, ("", 0))
            out.append(NodeFragmentation(name, models, cards, free, frag, name in self.closed))
        return out
