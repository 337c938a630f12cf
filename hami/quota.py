"""Namespace quotas on device memory and cores (`limits.nvidia.com/gpumem`, `limits.nvidia.com/gpucores`).

Kubernetes' own ResourceQuota admission cannot count these: a 2-card pod asking `gpumem: 8000` uses
16000 MiB, and `gpumem-percentage` only becomes MiB once a card is chosen. So, like HAMi
(hami-legacy-spec §2.2.4), the scheduler keeps its own per-namespace counters from the pods it placed,
counted per card (collapsed, so init containers are not double-counted), and checks them in the fit.
Only `spec.hard` keys `limits.<memory resource>` and `limits.<cores resource>` of a registered vendor are
tracked; an explicit 0 blocks everything; several quotas in one namespace: the smallest limit wins.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hami import objects
from hami import pods as podrules
from hami.model import CardGrant, ContainerRequest
from hami.pods import ContainerKind, ContainerSpec
from hami.quantity import to_count, to_mib
from hami.vendors.base import Vendor

log = logging.getLogger(__name__)


class QuotaState:
    """Per-namespace limits (from ResourceQuota objects) and usage (from placed pods). Thread-safe."""

    def __init__(self, vendors: Mapping[str, Vendor]) -> None:
        self._lock = threading.Lock()
        self._vendors = vendors
        # resource name -> (vendor, "memory" | "cores")
        self._tracked: dict[str, tuple[str, str]] = {}
        for v in vendors.values():
            n = v.resource_names()
            if n.memory:
                self._tracked[n.memory] = (v.common_word, "memory")
            if n.cores:
                self._tracked[n.cores] = (v.common_word, "cores")
        self._quotas: dict[tuple[str, str], dict[str, int]] = {}  # (ns, quota name) -> resource -> limit
        self._limits: dict[str, dict[str, int]] = {}  # ns -> resource -> smallest limit
        self._used: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))

    # -- limits ---------------------------------------------------------------------------------

    def upsert_quota(self, quota: Mapping[str, Any]) -> None:
        """Add or replace a ResourceQuota object (API JSON form). Unparseable values are ignored."""
        ns, name = objects.namespace(quota), objects.name(quota)
        hard = objects.quota_hard(quota)
        limits: dict[str, int] = {}
        for key, value in hard.items():
            if not key.startswith("limits."):
                continue
            res = key[len("limits.") :]
            if res not in self._tracked:
                continue
            try:
                kind = self._tracked[res][1]
                limits[res] = (
                    to_mib(value, resource=key) if kind == "memory" else to_count(value, resource=key)
                )
            except ValueError as e:
                # Kubernetes validated the quantity, so this is a value no card can use; say so once.
                log.warning("ResourceQuota %s/%s: %s not enforced: %s", ns, name, key, e)
                continue
        with self._lock:
            self._quotas[(ns, name)] = limits
            self._recompute(ns)

    def remove_quota(self, namespace: str, name: str) -> None:
        with self._lock:
            self._quotas.pop((namespace, name), None)
            self._recompute(namespace)

    def _recompute(self, ns: str) -> None:
        merged: dict[str, int] = {}
        for (qns, _), limits in self._quotas.items():
            if qns != ns:
                continue
            for res, lim in limits.items():
                merged[res] = min(lim, merged.get(res, lim))
        if merged:
            self._limits[ns] = merged
        else:
            self._limits.pop(ns, None)

    # -- usage ----------------------------------------------------------------------------------

    def _delta(self, ns: str, grants: Iterable[CardGrant], sign: int) -> None:
        used = self._used[ns]
        for g in grants:
            n = self._vendors[g.vendor].resource_names() if g.vendor in self._vendors else None
            if n is None:
                continue
            if n.memory:
                used[n.memory] = max(0, used[n.memory] + sign * g.usedmem)
            if n.cores:
                used[n.cores] = max(0, used[n.cores] + sign * g.usedcores)

    def add_usage(self, namespace: str, grants: Sequence[CardGrant]) -> None:
        with self._lock:
            self._delta(namespace, grants, +1)

    def remove_usage(self, namespace: str, grants: Sequence[CardGrant]) -> None:
        with self._lock:
            self._delta(namespace, grants, -1)

    def used(self, namespace: str, resource: str) -> int:
        with self._lock:
            return self._used.get(namespace, {}).get(resource, 0)

    def limit(self, namespace: str, resource: str) -> int | None:
        """The smallest explicit limit, or None when no quota sets it."""
        with self._lock:
            return self._limits.get(namespace, {}).get(resource)

    # -- checks ---------------------------------------------------------------------------------

    def fits(self, namespace: str, vendor: str, mem: int, cores: int) -> bool:
        """Whether `mem` MiB and `cores` percent more fit under the namespace's limits (§2.2.4)."""
        limits = self._limits.get(namespace)
        if not limits:
            return True
        n = self._vendors[vendor].resource_names()
        used = self._used.get(namespace, {})
        if n.memory in limits and used.get(n.memory, 0) + mem > limits[n.memory] * n.memory_factor:
            return False
        return not (n.cores in limits and used.get(n.cores, 0) + cores > limits[n.cores])

    def snapshot(self) -> list[tuple[str, str, int, int]]:
        """(namespace, resource, used, limit) for every limited resource, sorted (for metrics)."""
        with self._lock:
            return [
                (ns, res, self._used.get(ns, {}).get(res, 0), limit)
                for ns in sorted(self._limits)
                for res, limit in sorted(self._limits[ns].items())
            ]

    def has_limits(self, namespace: str) -> bool:
        return namespace in self._limits

    def exceeds_alone(self, namespace: str, demand: Mapping[str, tuple[int, int]]) -> str | None:
        """Webhook pre-check: does the pod alone (`demand`: vendor -> (MiB, percent)) exceed a limit?

        Returns a message naming the quota resource, the demand and the limit, or None.
        """
        limits = self._limits.get(namespace, {})
        for vendor, (mem, cores) in demand.items():
            n = self._vendors[vendor].resource_names()
            if n.memory in limits and mem > limits[n.memory] * n.memory_factor:
                return (
                    f"namespace {namespace}: the pod needs {mem} MiB of {n.memory} but the ResourceQuota "
                    f"limit limits.{n.memory} is {limits[n.memory]}"
                )
            if n.cores in limits and cores > limits[n.cores]:
                return (
                    f"namespace {namespace}: the pod needs {cores} % of {n.cores} but the ResourceQuota "
                    f"limit limits.{n.cores} is {limits[n.cores]}"
                )
        return None


def containers_demand(containers: Sequence[ContainerSpec]) -> dict[str, tuple[int, int]]:
    """The quota demand of a pod alone per vendor, before cards are chosen (§2.2.4), from its containers'
    requests in device-list order: memreq x nums MiB and coresreq x nums percent per container, combined by
    the pod rule (`hami.pods.peak`): app containers and native sidecars summed, each plain init container
    with the sidecars declared before it. Whatever cards the fit then chooses, the pod is charged at
    least this much (`hami.pods.collapse_grants`), so the webhook may deny a pod over it.
    Percentage-only memory counts 0 here (it becomes MiB per card in the fit, where quota is checked again).
    """
    out: dict[str, tuple[int, int]] = {}
    vendors = dict.fromkeys(r.vendor for c in containers for r in c.requests)
    for v in vendors:
        mem = [(c.kind, sum(r.memreq * r.nums for r in c.requests if r.vendor == v)) for c in containers]
        cores = [(c.kind, sum(r.coresreq * r.nums for r in c.requests if r.vendor == v)) for c in containers]
        out[v] = (int(podrules.peak(mem)), int(podrules.peak(cores)))
    return out


def pod_demand(
    init: Sequence[Sequence[ContainerRequest]], app: Sequence[Sequence[ContainerRequest]]
) -> dict[str, tuple[int, int]]:
    """`containers_demand` of plain init containers `init` and app containers (and sidecars) `app`:
    max(sum over app containers, largest init container) of memreq x nums and coresreq x nums.
    """
    return containers_demand(
        [
            *(ContainerSpec("", ContainerKind.INIT, tuple(c)) for c in init),
            *(ContainerSpec("", ContainerKind.APP, tuple(c)) for c in app),
        ]
    )
