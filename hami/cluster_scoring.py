"""The node-policy score helpers of `ClusterState.filter`: the `fragmentation` policy's keys, the vendor
topology terms (MetaX, Ascend, Vastai) and the debug log's score terms.

Pure: no I/O. A mixin that `hami.cluster.ClusterState` inherits, split from it so that module stays about
the state's bookkeeping; methods on a base class cost the filter nothing beyond attribute lookup.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from hami import fragmentation
from hami.fit import fit_pod
from hami.fragmentation_table import NodeTermTable
from hami.model import Selection
from hami.node_order import _KeyOrder
from hami.pods import ContainerSpec
from hami.scoring import PolicyChoice
from hami.vendors.base import Vendor

if TYPE_CHECKING:
    from hami.node_order import _Node


_NAME = operator.attrgetter("name")
_SCORE = operator.attrgetter("score")


class PolicyScoring:
    """Score helpers for `ClusterState.filter`. Expects the state's `vendors` (name -> Vendor) and
    `fragmentation` (the learned workload); called under the state's lock."""

    vendors: dict[str, Vendor]
    fragmentation: fragmentation.FragmentationModel

    def _best_by_vendor_scores(
        self,
        first: _Node,
        first_fit: Any,
        rest: Sequence[tuple[Any, str, _Node]],
        containers: Sequence[ContainerSpec],
        selections: Mapping[str, Selection],
        policy: Any,
        quota: Any,
        scorers: Sequence[Vendor],
        failed: dict[str, str] | None,
    ) -> tuple[_Node, Any]:
        """For pods of vendors with a topology term (`Vendor.node_score`: MetaX GPU topology tables,
        Ascend NetworkIDs, Vastai dies): fit the other candidates too and keep the node with the highest
        vendor term, ties going to the node policy's order (`first` is the policy's best fitting node)."""

        def term(n: _Node, f: Any) -> float:
            return sum(
                v.node_score(
                    f.devices.get(v.common_word, []),
                    cards={d.uuid: d for d in n.devices.get(v.common_word, ())},
                    node_policy=policy.node.value,
                )
                for v in scorers
            )

        best = ((-term(first, first_fit), -1), first, first_fit)
        for i, (_, _, n) in enumerate(sorted(rest, key=lambda item: (item[0], item[1]))):
            f = fit_pod(
                containers, n.view(), vendors=self.vendors, selections=selections, policy=policy, quota=quota
            )
            if f.ok:
                cand = ((-term(n, f), i), n, f)
                if cand[0] < best[0]:
                    best = cand
            elif failed is not None:
                failed[n.name] = f.reason_text()
        chosen = best[1]
        if failed is not None and chosen is not first:
            failed.pop(chosen.name, None)
            why = f"node {chosen.name} preferred by the {'/'.join(v.common_word for v in scorers)} topology score"
            failed[first.name] = why
            for name, text in list(failed.items()):
                if text.startswith(f"node {first.name} preferred by node policy"):
                    failed[name] = why
        return chosen, best[2]

    def _fragmentation_keys(
        self, candidates: Sequence[_Node], shapes: Mapping[str, tuple[fragmentation.Shape, ...]]
    ) -> list[tuple[Any, str, _Node]] | _KeyOrder:
        """The candidates under the `fragmentation` node policy: the smallest increase of the node's
        expected fragmentation for the pod first, ties to the fuller node (binpack), then by name.
        One-container pods: an order over the per-node columns of `hami.fragmentation_table`; others:
        heap entries ((key, -score), name, node), keys cached per node until its usage or the learned
        workload changes."""
        model = self.fragmentation
        version = model.version
        out = []
        single = None
        if len(shapes) == 1:
            ((vendor, ss),) = shapes.items()
            if len(ss) == 1:
                single = ss[0]
        if single is None:  # several containers or vendors: each judged alone, summed (rare, slower)
            key = tuple(shapes.items())
            for n in candidates:
                memo = n.frag
                if memo.get(None) != version:
                    memo.clear()
                    memo[None] = version
                x = memo.get(key)
                if x is None:
                    x = memo[key] = fragmentation.pod_delta(model, n.devices, n.usage, shapes, n.cpu_free())
                out.append(((x, -n.current_score()), n.name, n))
            return out
        # One container: every candidate at once from the per-node columns (hami.fragmentation_table),
        # refreshed only where a node changed since the previous filter.
        table = model.tables.get(vendor)
        if table is None:
            table = model.tables[vendor] = NodeTermTable(model, vendor)
        keys = table.keys(candidates, single)
        scores = list(map(_SCORE, candidates))  # C-level: the cached scores, None where stale
        if None in scores:
            scores = [n.current_score() if x is None else x for n, x in zip(candidates, scores, strict=True)]
        return _KeyOrder(list(candidates), keys, scores)

    def _score_terms(
        self, n: _Node, shapes: Mapping[str, tuple[fragmentation.Shape, ...]], policy: PolicyChoice
    ) -> str:
        """The chosen node's score terms for the debug log (before the pod's reservation)."""
        terms = f"node score {n.current_score():.3f} (0..30, utilisation before the pod)"
        if policy.uses_fragmentation:
            model = self.fragmentation
            look = fragmentation.usage_of(n.usage)
            value = sum(model.node_value(n.devices.get(v, ()), look, n.cpu_free()) for v in shapes)
            delta = fragmentation.pod_delta(model, n.devices, n.usage, shapes, n.cpu_free())
            terms += (
                f", expected fragmentation {value:.4f} cards, increase {delta:+.4f} cards "
                f"(workload v{model.version}: {len(model.active)} shapes, {model.histogram.observed} seen)"
            )
        return terms
