"""The read-only queries of `ClusterState` (metrics, reports, the extender's explanations and tests).

Pure: no I/O. A mixin that `hami.cluster.ClusterState` inherits, split from it so that module stays about
the state's bookkeeping and the filter; the queries take the state's lock and return copies.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from hami.model import MIG_MODE, CardGrant, Device, DeviceUsage, MigPlacement

if TYPE_CHECKING:
    from hami.node_order import _Node
    from hami.quota import QuotaState


@dataclass(frozen=True, slots=True)
class CardStat:
    """One card and its usage (for metrics, reports and tests). Memory MiB, cores percent."""

    node: str
    uuid: str
    index: int
    type: str
    vendor: str
    count: int
    used: int
    devmem: int
    usedmem: int
    devcore: int
    usedcores: int
    health: bool
    mode: str = "hami-core"
    mig: tuple[MigPlacement, ...] = ()  # the placements of the card's MIG instances (MIG mode)
    mig_unknown: int = 0  # pods holding the card in MIG mode without a placement on record


@dataclass(frozen=True, slots=True)
class MigInstanceStat:
    """One MIG instance the device plugin realized on a card in MIG mode (HAMi's MIG runtime identity)."""

    node: str
    uuid: str  # the parent card
    index: int
    mig_uuid: str
    profile: str
    gpu_instance_id: int
    compute_instance_id: int
    placement: MigPlacement


class ClusterQueries:
    """What `ClusterState` answers without changing anything. Expects the state's `_lock`, `_nodes`
    (name -> node record), `_pods` (uid -> pod record) and `quota`."""

    _lock: threading.RLock
    _nodes: dict[str, _Node]
    _pods: dict[str, Any]
    quota: QuotaState

    def card_stats(self) -> list[CardStat]:
        """Every registered card with its usage, ordered by node then card index."""
        with self._lock:
            out = []
            for name in sorted(self._nodes):
                n = self._nodes[name]
                for d in sorted(n.by_uuid.values(), key=lambda d: (d.vendor, d.index)):
                    u = n.usage.get(d.uuid) or DeviceUsage()
                    out.append(
                        CardStat(name, d.uuid, d.index, d.type, d.vendor, d.count, u.used, d.devmem, u.usedmem,
                                 d.devcore, u.usedcores, d.health, d.mode, u.mig, u.mig_unknown)
                    )  # fmt: skip
            return out

    def mig_instances(self) -> list[MigInstanceStat]:
        """Every realized MIG instance of a counted pod on a card of its node in MIG mode (HAMi exports
        these, `RuntimeReady` allocations only), ordered by node, card index and instance ids."""
        with self._lock:
            out = []
            for p in self._pods.values():
                n = self._nodes.get(p.node)
                for a in p.mig_realized if n is not None else ():
                    d = n.by_uuid.get(a.gpu_uuid)
                    if d is not None and d.mode == MIG_MODE:
                        out.append(
                            MigInstanceStat(p.node, d.uuid, d.index, a.mig_uuid, a.profile, a.gpu_instance_id or 0,
                                            a.compute_instance_id or 0, a.placement)
                        )  # fmt: skip
            return sorted(out, key=lambda m: (m.node, m.index, m.gpu_instance_id, m.compute_instance_id))

    def usage_snapshot(self) -> dict[str, dict[str, tuple[int, int, int]]]:
        """node -> card uuid -> (slots, MiB, percent) for cards with any usage (comparisons in tests)."""
        with self._lock:
            return {
                name: {
                    u: (x.used, x.usedmem, x.usedcores)
                    for u, x in n.usage.items()
                    if x.used or x.usedmem or x.usedcores
                }
                for name, n in self._nodes.items()
            }

    def pod_grants(self) -> list[tuple[str, str, str, tuple[CardGrant, ...]]]:
        """Every counted pod as (namespace, name, node, collapsed card grants), for per-pod metrics."""
        with self._lock:
            return [(p.namespace, p.name, p.node, p.grants) for p in self._pods.values()]

    def quota_stats(self) -> list[tuple[str, str, int, int]]:
        """(namespace, resource, used, limit) for every quota-limited resource (HAMi's quota metrics)."""
        return self.quota.snapshot()

    def pod_node(self, uid: str) -> str | None:
        """The node a pod is counted on (reserved or confirmed), or None."""
        with self._lock:
            p = self._pods.get(uid)
            return p.node if p else None

    def node_cards(self, name: str) -> list[Device]:
        """The cards node `name` registers, every vendor, by vendor then index ([] for an unknown node)."""
        with self._lock:
            n = self._nodes.get(name)
            return [] if n is None else sorted(n.by_uuid.values(), key=lambda d: (d.vendor, d.index))

    def node_names(self) -> list[str]:
        with self._lock:
            return sorted(self._nodes)

    def node_unusable_reason(self, name: str) -> str | None:
        with self._lock:
            n = self._nodes.get(name)
            return "node unregistered" if n is None else n.unusable

    def node_scores(self, names: Sequence[str]) -> dict[str, float]:
        """Each known node's utilisation score before the next pod (0..30, `hami.scoring.node_score`, the
        binpack/spread order of `filter`); names not registered are left out."""
        with self._lock:
            return {n: self._nodes[n].current_score() for n in names if n in self._nodes}
