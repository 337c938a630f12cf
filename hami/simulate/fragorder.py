"""The `fragmentation` node policy's order mirrored for the replay, so that the filter is handed the
best few fitting nodes instead of every node (`hami.simulate.candidates` does the same for binpack and
spread).

Why: under `fragmentation` the filter's key of a node is the increase of its expected fragmentation
for the pod (`hami.fragmentation_table`), and one call with every fitting node reads every node in
Python (its slot, its key, a heap entry): O(nodes) per pod, O(nodes^2) for a fill run (5,000 nodes
took 250 s). Here every node's key is read from the core's own table at once, by slot, in numpy:

- the pod is counted into the learned workload first, as the filter counts it (`FragmentationModel.
  observe` with the pod's UID, so the filter's own count is a no-op): the keys are those of the
  workload the filter will score with, including a refresh that this pod sets off;
- the table is the one the filter uses (`FragmentationModel.tables`), so the keys are the filter's,
  bit for bit; a node is refreshed in it when the replay changed it (`refresh`: a reservation, a
  deletion, the CPU of a pod that kube-scheduler placed alone), as the filter would refresh it;
- the order is the filter's: key, then the fuller node (`-node score`), then the name
  (`hami.cluster_scoring.PolicyScoring._fragmentation_keys`).

So the first fitting node of the mirrored order is the node one call with every fitting node would
choose, and the replay's decisions stay the same (tests compare them with one call per pod). Pods of
several containers or vendors are scored by another path of the filter and get every node at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hami import fragmentation, objects
from hami.cluster import ClusterState
from hami.errors import InvalidRequest
from hami.fragmentation_table import NodeTermTable
from hami.scoring import NodePolicy
from hami.simulate.candidates import FIRST_CALL


def single_shape(state: ClusterState, obj: dict) -> tuple[str, fragmentation.Shape] | None:
    """(vendor, shape) of a pod with one container request of one vendor, as the filter computes it;
    None for other pods (and for a request the filter refuses)."""
    try:
        containers = state.pod_requests(obj)
        annos = objects.annotations(obj)
        wanted = {r.vendor for c in containers for r in c.requests}
        selections = {v: state.vendors[v].selection(annos) for v in wanted}
    except InvalidRequest:
        return None
    shapes = fragmentation.pod_shapes(containers, selections, fragmentation.pod_cpu_milli(obj))
    if len(shapes) != 1:
        return None
    ((vendor, ss),) = shapes.items()
    return (vendor, ss[0]) if len(ss) == 1 else None


class _Rest:
    """The nodes after the first call, in order: found and sorted only when a first call found no node."""

    def __init__(self, order: FragmentationOrder, pool: np.ndarray, head: np.ndarray) -> None:
        self._order, self._pool, self._head, self._sorted = order, pool, head, None

    def _all(self) -> np.ndarray:
        if self._sorted is None:
            chosen = np.zeros(len(self._order.names), dtype=bool)
            chosen[self._head] = True
            pool = self._pool
            self._sorted = self._order.sort(pool[~chosen[pool]])
        return self._sorted

    def __len__(self) -> int:
        return len(self._pool) - len(self._head) if self._sorted is None else len(self._sorted)

    def __getitem__(self, key: slice) -> np.ndarray:
        return self._all()[key]


class FragmentationOrder:
    """Node indices (of `names`) in the filter's `fragmentation` order for the pod `prepare`d last."""

    policy = NodePolicy.FRAGMENTATION

    def __init__(self, names: Sequence[str], state: ClusterState) -> None:
        self.names = list(names)
        self.state = state
        n = len(self.names)
        rank = np.empty(n, dtype=np.int64)
        rank[np.array(sorted(range(n), key=self.names.__getitem__), dtype=np.int64)] = np.arange(n)
        self.rank = rank
        with state._lock:
            self.nodes = [state._nodes.get(x) for x in self.names]
        self._known = np.flatnonzero([x is not None for x in self.nodes])
        self._all_known = len(self._known) == n  # then slots are indexed by node index
        self._table: NodeTermTable | None = None
        self._slots = np.zeros(0, dtype=np.intp)
        self._score = np.zeros(n)
        self._dirty: set[int] = set()
        self._allowed_memo: dict[tuple, np.ndarray] = {}
        self.key = np.full(n, np.inf)

    def refresh(self, i: int) -> None:
        """Node `i` changed (its cards or its CPU): read it again before the next pod."""
        self._dirty.add(i)

    def prepare(self, obj: dict, vendor: str, shape: fragmentation.Shape, mask: np.ndarray) -> None:
        """Count pod `obj` (with its `uid`) into the learned workload as the filter will, and key the
        nodes of `mask` (those kube-scheduler's fit keeps) for its `shape` of `vendor`'s cards; the
        others are not read (`split` takes only nodes of the mask)."""
        state = self.state
        with state._lock:
            model = state.fragmentation
            model.observe([shape], objects.uid(obj))
            table = model.tables.get(vendor)
            if table is None:
                table = model.tables[vendor] = NodeTermTable(model, vendor)
            nodes = self.nodes
            if table is not self._table:
                # a new learned workload: every node's columns are made again
                self._table = table
                self._slots = table.slots([nodes[i] for i in self._known.tolist()])
                self._score[self._known] = [nodes[i].current_score() for i in self._known.tolist()]
                self._dirty.clear()
            elif self._dirty:
                dirty = [i for i in self._dirty if nodes[i] is not None]
                table.slots([nodes[i] for i in dirty])  # refreshes the changed nodes' columns
                self._score[dirty] = [nodes[i].current_score() for i in dirty]
                self._dirty.clear()
            # Only the nodes the pod can reach are keyed: those kube-scheduler's fit keeps that have a
            # card of an allowed model (the others cannot serve it: their key is inf, as the filter's).
            allowed = self._allowed(vendor, shape)
            key = self.key
            key[mask & ~allowed] = np.inf
            if self._all_known:
                at = (mask & allowed).nonzero()[0]
                key[at] = table.keys_at(self._slots[at], shape)
            else:
                pick = mask[self._known] & allowed[self._known]
                key[self._known[pick]] = table.keys_at(self._slots[pick], shape)

    def _allowed(self, vendor: str, shape: fragmentation.Shape) -> np.ndarray:
        """Nodes with at least `nums` cards of `vendor` of the shape's allowed models (all of them
        for a shape without `nvidia.com/use-gputype`); the registrations do not change in a replay."""
        key = (vendor, shape.types, shape.nums)
        got = self._allowed_memo.get(key)
        if got is None:
            types = shape.types

            def ok(n) -> bool:
                cards = n.devices.get(vendor, ()) if n is not None else ()
                if types:
                    cards = [d for d in cards if any(x in d.type.lower() for x in types)]
                return len(cards) >= shape.nums

            got = self._allowed_memo[key] = np.array([ok(n) for n in self.nodes], dtype=bool)
        return got

    def sort(self, pool: np.ndarray) -> np.ndarray:
        """`pool` (node indices) in the order: key, then the fuller node, then the name."""
        return pool[np.lexsort((self.rank[pool], -self._score[pool], self.key[pool]))]

    def split(self, mask: np.ndarray, first: int = FIRST_CALL) -> tuple[list[str], _Rest]:
        """(names of the `first` nodes of `mask` in order, the other nodes of `mask` in order)."""
        pool = np.flatnonzero(mask)
        if len(pool) > first:
            # The first `first` in order without sorting every node: those below the `first`-th
            # smallest key and, among the nodes at that key, the best by score and name.
            keys = self.key[pool]
            cut = np.partition(keys, first - 1)[first - 1]
            below, at = pool[keys < cut], pool[keys == cut]
            need = first - len(below)
            if len(at) > need:
                score = -self._score[at]
                s_cut = np.partition(score, need - 1)[need - 1]
                better, tied = at[score < s_cut], at[score == s_cut]
                left = need - len(better)
                if len(tied) > left:
                    tied = tied[np.argpartition(self.rank[tied], left - 1)[:left]]
                at = np.concatenate([better, tied])
            head = self.sort(np.concatenate([below, at]))
        else:
            head = self.sort(pool)
        names = self.names
        return [names[i] for i in head.tolist()], _Rest(self, pool, head)

    def names_of(self, indices: np.ndarray) -> list[str]:
        names = self.names
        return [names[i] for i in indices.tolist()]
