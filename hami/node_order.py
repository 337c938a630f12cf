"""The node record `ClusterState` keeps per node, and the order in which `filter` tries candidate nodes.

Pure: no I/O. Split from `hami.cluster` (which re-exports these names) so that module stays about the
state's bookkeeping; the filter's hot path uses these classes directly, with no extra indirection.
"""

from __future__ import annotations

import contextlib
import gc
import heapq
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hami.fit import NodeView
from hami.model import Device, DeviceUsage
from hami.prefilter import CardSummary, VerdictIndex
from hami.scoring import node_score


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Automatic garbage collection off for a short section that allocates per node.

    Why: a rebuild allocates millions of objects and a filter some per candidate node, and every
    allocation counts towards CPython's next collection, whose older generations walk every object
    the process holds (at 10,000 nodes a full collection took 1-4 s on the dev machine, see
    docs/benchmarks.md). Work per call that grows with the node count thus also set off collections
    whose cost grows with it. Paused, the section's garbage (freed by reference counting anyway) is
    seen by one young collection afterwards. The switch is process-wide, so it is only restored when
    this section turned it off; the extender's GcFreezer keeps the older generations small besides.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


@dataclass(slots=True)
class _Node:
    name: str
    devices: dict[str, list[Device]] = field(default_factory=dict)
    by_uuid: dict[str, Device] = field(default_factory=dict)
    usage: dict[str, DeviceUsage] = field(default_factory=dict)
    cordoned: frozenset[str] = frozenset()
    pair_scores: dict[str, dict[str, int]] = field(default_factory=dict)
    unusable: str | None = None
    pods: set[str] = field(default_factory=set)
    score: float | None = None  # cached node_score, None = stale
    summaries: dict[str, CardSummary] = field(default_factory=dict)  # per vendor, cleared on any change
    # The fragmentation policy's memo: keys of multi-container pods and the mark of hami.fragmentation_table
    # that the node's columns are fresh. Cleared on every change of usage (here) and of CPU (hami.cluster).
    frag: dict[Any, Any] = field(default_factory=dict)
    cpu_alloc: int | None = None  # allocatable CPU, millicores (None: the Node does not say)
    cpu_used: int = 0  # CPU requested by the pods counted on this node, millicores
    source: tuple[str | None, ...] | None = None  # the annotations the devices were parsed from
    problem: str | None = None  # what the registration itself says is wrong (None = fine)
    index: VerdictIndex | None = None  # told of every change, so the filter re-judges only changed nodes

    def touch(self) -> None:
        if self.index is not None:
            self.index.changed(self.name)
        self.score = None
        self.summaries.clear()
        self.frag.clear()

    def cpu_free(self) -> int | None:
        """Allocatable CPU minus the CPU of the pods counted here, millicores; None when unknown."""
        return None if self.cpu_alloc is None else self.cpu_alloc - self.cpu_used

    def summary(self, vendor: str) -> CardSummary:
        s = self.summaries.get(vendor)
        if s is None:
            s = self.summaries[vendor] = CardSummary.of(
                self.devices.get(vendor, ()), self.usage, self.cordoned
            )
        return s

    def view(self) -> NodeView:
        return NodeView(self.name, self.devices, self.usage, self.cordoned, self.pair_scores)

    def current_score(self) -> float:
        if self.score is None:
            sums = [0, 0, 0, 0, 0, 0]
            for d in self.by_uuid.values():
                u = self.usage.get(d.uuid)
                sums[0] += d.count
                sums[2] += d.devcore
                sums[4] += d.devmem
                if u is not None:
                    sums[1] += u.used
                    sums[3] += u.usedcores
                    sums[5] += u.usedmem
            self.score = node_score(*sums)
        return self.score


class _PolicyOrder:
    """Candidate nodes in node-policy order: ascending (key, name), where key is -score (binpack) or
    score (spread), or the given keys of other policies.

    Only the best fitting node is needed, and the first candidate nearly always fits (the prefilter
    already refused the rest). So the first node comes from one scan over the cached scores, which
    allocates no object per node (floats are not tracked by the garbage collector, tuples are); only
    when it does not fit do the others go into a heap, giving them in O(k log n) for the k tried.
    Building that heap of (key, name, node) tuples up front for 10,000 candidates cost more than the
    rest of a filter, and its tuples set off garbage collections.
    """

    __slots__ = ("_nodes", "_keys", "_sign", "_heap", "_taken")

    def __init__(self, nodes: list[_Node], keys: list[Any], sign: float = 1.0) -> None:
        # keys[i] is nodes[i]'s score when `sign` is +-1 (order by sign * score), else its own key
        self._nodes, self._keys, self._sign = nodes, keys, sign
        self._heap: list[tuple[Any, str, _Node]] | None = None
        self._taken = -1  # index of the node given by the scan

    @classmethod
    def by_score(cls, candidates: list[_Node], sign: float) -> _PolicyOrder:
        scores = list(map(_SCORE, candidates))  # C-level: cached scores, None where stale
        if None in scores:
            scores = [n.current_score() if x is None else x for n, x in zip(candidates, scores, strict=True)]
        return cls(candidates, scores, sign)

    @classmethod
    def from_entries(cls, entries: list[tuple[Any, str, _Node]]) -> _PolicyOrder:
        order = cls([], [])
        heapq.heapify(entries)
        order._heap = entries
        return order

    def __bool__(self) -> bool:
        if self._heap is not None:
            return bool(self._heap)
        return len(self._nodes) > (self._taken >= 0)

    def pop(self) -> _Node:
        if self._heap is None and self._taken < 0:
            keys, nodes = self._keys, self._nodes
            best = max(keys) if self._sign < 0 else min(keys)
            if keys.count(best) == 1:
                self._taken = keys.index(best)
            else:
                self._taken = min((i for i, k in enumerate(keys) if k == best), key=lambda i: nodes[i].name)
            return nodes[self._taken]
        return heapq.heappop(self._rest())[2]

    def _rest(self) -> list[tuple[Any, str, _Node]]:
        if self._heap is None:
            t, sign = self._taken, self._sign
            self._heap = [(sign * k, n.name, n) for i, (k, n) in enumerate(zip(self._keys, self._nodes, strict=True))
                          if i != t]  # fmt: skip
            heapq.heapify(self._heap)
        return self._heap

    def names(self) -> list[str]:
        """Names of the nodes not given yet."""
        if self._heap is not None:
            return [name for _, name, _ in self._heap]
        names = list(map(_NAME, self._nodes))
        if self._taken >= 0:
            del names[self._taken]
        return names

    def entries(self) -> list[tuple[Any, str, _Node]]:
        """The nodes not given yet as (key, name, node)."""
        return list(self._rest())


class _KeyOrder:
    """Candidate nodes in the `fragmentation` node policy's order: ascending (key, -score, name), with
    the keys in a numpy array (`hami.fragmentation_table`).

    As in `_PolicyOrder`, the first node comes from one scan (a numpy minimum, then the few nodes at
    that key by score and name) and the others go into a heap only when it does not fit: 10,000
    heap entries built up front cost more than the rest of a decision at that size.
    """

    __slots__ = ("_nodes", "_keys", "_scores", "_heap", "_taken")

    def __init__(self, nodes: list[_Node], keys: Any, scores: list[float]) -> None:
        # keys: float array, one per node; scores: each node's score (the fuller node first)
        self._nodes, self._keys, self._scores = nodes, keys, scores
        self._heap: list[tuple[Any, str, _Node]] | None = None
        self._taken = -1

    def __bool__(self) -> bool:
        if self._heap is not None:
            return bool(self._heap)
        return len(self._nodes) > (self._taken >= 0)

    def pop(self) -> _Node:
        if self._heap is None and self._taken < 0:
            keys, nodes, scores = self._keys, self._nodes, self._scores
            at = (keys == keys.min()).nonzero()[0].tolist()
            t = at[0] if len(at) == 1 else min(at, key=lambda i: (-scores[i], nodes[i].name))
            self._taken = t
            return nodes[t]
        return heapq.heappop(self._rest())[2]

    def _rest(self) -> list[tuple[Any, str, _Node]]:
        if self._heap is None:
            t = self._taken
            xs = self._keys.tolist()
            self._heap = [((x, -s), n.name, n) for i, (x, s, n) in enumerate(zip(xs, self._scores, self._nodes, strict=True))
                          if i != t]  # fmt: skip
            heapq.heapify(self._heap)
        return self._heap

    def names(self) -> list[str]:
        """Names of the nodes not given yet."""
        if self._heap is not None:
            return [name for _, name, _ in self._heap]
        names = list(map(_NAME, self._nodes))
        if self._taken >= 0:
            del names[self._taken]
        return names

    def entries(self) -> list[tuple[Any, str, _Node]]:
        """The nodes not given yet as ((key, -score), name, node)."""
        return list(self._rest())


_SCORE = operator.attrgetter("score")
_NAME = operator.attrgetter("name")
