"""The candidate nodes the replay hands the filter: kube-scheduler's fitting nodes, best first by the
filter's own node-policy order, a few at a time, without the nodes the filter already refused.

Why: `ClusterState.filter` reads every name it is given (the prefilter's lookups, the order's scan
over cached scores), so handing it every fitting node costs O(nodes) per pod, and a fill run submits
pods in proportion to the nodes: O(nodes^2) in all (a 10,000-node fill ran for more than 400 s).

Why the decisions stay the same: the filter takes the first node in policy order that fits. A node
the filter refused for a kind of pod (`Refusals`: same device requests, annotations and namespace) is
refused again with the same reason while its cards are unchanged: the prefilter and the fit read only
the node's cards and usage, the pod and its policies (the fragmentation policies, which also read the
learned workload and the node's CPU, and namespaces with quotas are not narrowed). So the filter is
handed the first `FIRST_CALL` fitting nodes in its order that are not known refused; a later node is
never better, so when one of them fits it is the node one call with every fitting node would choose;
when none fits, the next nodes in order follow (4x as many each call), and a pod that fits nowhere
gets, per node, the reason the filter gave (now or while the node was as it is), as one call would. Tests compare the
placements with those of one call per pod.

The order is binpack's (fullest first) or spread's (emptiest first), ties by node name
(`hami.node_order._PolicyOrder`), over the core's own node scores (`ClusterState.node_scores`); the
replay calls `forget`/`refresh` for every node whose cards it changes (a reservation, a deletion), the
only events that change a score or a verdict. Other node policies, per-pod node policies other than
binpack/spread, and vendors with their own fit or node scores (`Vendor.custom_fit`, `scores_nodes`)
get every fitting node in one call, as before.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from hami.cluster import ClusterState
from hami.scoring import NodePolicy

#: Nodes in the first call: with the known refusals left out, the first of them nearly always fits;
#: when none does, the next call gets the next 4x as many.
FIRST_CALL = 16


class PolicyOrder:
    """Node indices (of `names`) sorted by (sign x score, name) as the filter orders its candidates.

    `sign` is -1.0 for binpack (highest score first), +1.0 for spread. Nodes the core does not know get
    +inf (last; the filter refuses them anyway). Keys are kept sorted in numpy arrays, so a score change
    costs a few O(nodes) memory moves, not a sort.
    """

    def __init__(self, names: Sequence[str], state: ClusterState, policy: NodePolicy) -> None:
        self.policy = policy
        self.sign = -1.0 if policy is NodePolicy.BINPACK else 1.0
        self.names = list(names)
        self.state = state
        n = len(self.names)
        rank = np.empty(n, dtype=np.int64)
        rank[np.array(sorted(range(n), key=self.names.__getitem__), dtype=np.int64)] = np.arange(n)
        self.rank = rank
        scores = state.node_scores(self.names)
        self.key = np.array([self.sign * scores[x] if x in scores else np.inf for x in self.names])
        self.perm = np.lexsort((rank, self.key))  # node indices, best first
        self.sorted_key = self.key[self.perm]
        self.sorted_rank = rank[self.perm]

    def refresh(self, i: int) -> None:
        """Node `i`'s cards changed: read its score again and move it to its place."""
        name = self.names[i]
        score = self.state.node_scores([name]).get(name)
        new = np.inf if score is None else self.sign * score
        old = self.key[i]
        if new == old:
            return
        perm, sk, sr, rank = self.perm, self.sorted_key, self.sorted_rank, int(self.rank[i])
        # where it is: among the keys equal to its old one, at its name's rank
        lo = int(np.searchsorted(sk, old, side="left"))
        hi = int(np.searchsorted(sk, old, side="right"))
        p = lo + int(np.searchsorted(sr[lo:hi], rank))
        # where it goes, counted in the arrays without it
        lo = int(np.searchsorted(sk, new, side="left"))
        hi = int(np.searchsorted(sk, new, side="right"))
        q = lo + int(np.searchsorted(sr[lo:hi], rank))
        if q > p:
            q -= 1
            perm[p:q] = perm[p + 1 : q + 1]
            sk[p:q] = sk[p + 1 : q + 1]
            sr[p:q] = sr[p + 1 : q + 1]
        elif q < p:
            perm[q + 1 : p + 1] = perm[q:p].copy()
            sk[q + 1 : p + 1] = sk[q:p].copy()
            sr[q + 1 : p + 1] = sr[q:p].copy()
        perm[q], sk[q], sr[q] = i, new, rank
        self.key[i] = new

    def split(self, mask: np.ndarray, first: int = FIRST_CALL) -> tuple[list[str], np.ndarray]:
        """(names of the `first` best nodes of `mask`, indices of the other nodes of `mask` in order)."""
        ordered = self.perm[mask[self.perm]]
        names = self.names
        return [names[i] for i in ordered[:first].tolist()], ordered[first:]

    def names_of(self, indices: np.ndarray) -> list[str]:
        names = self.names
        return [names[i] for i in indices.tolist()]


class Refusals:
    """Per kind of pod (a row) and node: the filter's reason for refusing the node, until the node's
    cards change (`forget`). Codes index `texts`; -1 is unknown."""

    def __init__(self, nodes: int) -> None:
        self.nodes = nodes
        self.code = np.full((4, nodes), -1, dtype=np.int32)
        self.rows: dict[object, int] = {}
        self.texts: list[str] = []
        self._ids: dict[str, int] = {}

    def row(self, kind: object) -> int:
        r = self.rows.get(kind)
        if r is None:
            r = self.rows[kind] = len(self.rows)
            if r == len(self.code):
                grown = np.full((2 * r, self.nodes), -1, dtype=np.int32)
                grown[:r] = self.code
                self.code = grown
        return r

    def unknown(self, r: int) -> np.ndarray:
        return self.code[r] < 0

    def learn(self, r: int, failed: Mapping[str, str], index: Mapping[str, int]) -> None:
        """Remember the reasons of `failed` (node name -> reason) for kind `r`."""
        if not failed:
            return
        ids = self._ids
        codes = []
        for text in failed.values():
            c = ids.get(text)
            if c is None:
                c = ids[text] = len(self.texts)
                self.texts.append(text)
            codes.append(c)
        self.code[r, np.fromiter(map(index.__getitem__, failed), dtype=np.int64, count=len(codes))] = codes

    def forget(self, i: int) -> None:
        """Node `i`'s cards changed: no reason of it holds any more."""
        self.code[:, i] = -1

    def counts(self, r: int, mask: np.ndarray) -> Counter[str]:
        """Reason text -> nodes, over the nodes of `mask` (all of them known refused for kind `r`)."""
        codes = self.code[r][mask]
        if (codes < 0).any():
            raise AssertionError("a node of the mask has no known reason")  # a bug, not bad input
        found = np.bincount(codes, minlength=len(self.texts))
        return Counter({self.texts[c]: int(k) for c, k in enumerate(found.tolist()) if k})
