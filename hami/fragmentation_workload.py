"""The request shapes the fragmentation measure is taken over (a pod's containers as shapes, its CPU) and
the workload learned online from the pods the scheduler sees (pure; no I/O, no clock).

Split from `hami.fragmentation` (which re-exports these names) so that the measure's module holds the
measure and the model it scores with; the types here sit one floor below both.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from hami import objects, pods
from hami.errors import InvalidRequest
from hami.model import PERCENTAGE_UNSET, ContainerRequest, Selection
from hami.pods import ContainerKind, ContainerSpec
from hami.quantity import parse_quantity


class Shape(NamedTuple):
    """One container's per-card request for one vendor, as the fragmentation measure sees it.

    `nums` cards; per card `mem` MiB (> 0) or else `pct` percent of the card's memory (100 when the
    request gives neither: the whole card's memory, HAMi's default); `cores` percent (clamped to 100;
    0 when the request gives none, HAMi's default: the card's compute is not reserved);
    `types` lower-case substrings of allowed card types (``nvidia.com/use-gputype``), () for any;
    `cpu` the pod's CPU request in millicores (kube-scheduler's fit: a node without that much free CPU
    cannot run the shape, so all its free card capacity is a fragment for it), 0 when not known;
    `vendor` the CommonWord of the cards it asks for (a shape is measured on that vendor's cards only).
    """

    nums: int
    mem: int
    pct: int
    cores: int
    types: tuple[str, ...] = ()
    cpu: int = 0
    vendor: str = "NVIDIA"

    def mem_on(self, devmem: int) -> int:
        """MiB this shape takes on a card of `devmem` MiB (`ContainerRequest.memory_on`'s rule)."""
        return self.mem if self.mem > 0 else devmem * self.pct // 100

    def share_on(self, devmem: int, devcore: int, count: int) -> float:
        """The share of one card (0..1) one container takes: the largest of its share of the card's
        cores (`cores` / `devcore`), of its memory (MiB / `devmem`) and of its sharer slots
        (1 / `count`), the dimensions HAMi's fit binds a card by. A dimension the card does not
        register (0) is left out."""
        share = 1.0 / count if count > 0 else 1.0
        if devcore > 0:
            share = max(share, self.cores / devcore)
        if devmem > 0:
            share = max(share, self.mem_on(devmem) / devmem)
        return share


def shape_of(req: ContainerRequest, selection: Selection | None = None, cpu: int = 0) -> Shape:
    """The `Shape` of one container request, its vendor's selection (use-types only) and the pod's CPU
    request (millicores)."""
    pct = 0
    if req.memreq <= 0:
        pct = req.mem_percentage if req.mem_percentage != PERCENTAGE_UNSET else 100
    types = tuple(sorted(t.lower() for t in selection.use_types)) if selection is not None else ()
    cores = min(max(req.coresreq, 0), 100)
    return Shape(max(1, req.nums), max(0, req.memreq), pct, cores, types, max(0, cpu), req.vendor)


def _millicores(value: object) -> int:
    if isinstance(value, str):
        return _millicores_of_text(value)  # pods alike repeat their texts: parsed once each
    return _parse_millicores(value)


@functools.lru_cache(maxsize=4096)
def _millicores_of_text(value: str) -> int:
    return _parse_millicores(value)


def _parse_millicores(value: object) -> int:
    try:
        q, _ = parse_quantity(value, resource="cpu")
    except InvalidRequest:
        return 0
    return max(0, math.ceil(q * 1000))


def pod_cpu_milli(pod: Mapping[str, Any]) -> int:
    """The pod's CPU request in millicores as kube-scheduler counts it (requests, else limits, per
    container; app containers and sidecars summed, or the largest init container with the sidecars
    before it, `hami.pods.peak`); unparseable values count 0."""
    values = []
    for kind, c in pods.entries(pod):
        res = c.get("resources") if isinstance(c, Mapping) else None
        res = res if isinstance(res, Mapping) else {}
        req, lim = res.get("requests"), res.get("limits")
        v = (req or {}).get("cpu") if isinstance(req, Mapping) else None
        if v is None and isinstance(lim, Mapping):
            v = lim.get("cpu")
        values.append((kind, _millicores(v) if v is not None else 0))
    return int(pods.peak(values))


def node_cpu_milli(node: Mapping[str, Any]) -> int | None:
    """A Node's allocatable CPU in millicores, None when it does not say."""
    alloc = objects.status(node).get("allocatable")
    v = alloc.get("cpu") if isinstance(alloc, Mapping) else None
    return None if v is None else _millicores(v)


def pod_shapes(
    containers: Sequence[ContainerSpec], selections: Mapping[str, Selection], cpu: int = 0
) -> dict[str, tuple[Shape, ...]]:
    """Per vendor, the shapes of a pod's long-running containers (app containers and sidecars; the
    init containers only when the pod has nothing else), one per container request; `cpu` is the
    pod's CPU request (millicores), given to its first shape only (the pod takes it once)."""
    running = [c for c in containers if c.kind is not ContainerKind.INIT and c.requests]
    out: dict[str, list[Shape]] = {}
    for c in running or containers:
        for r in c.requests:
            out.setdefault(r.vendor, []).append(shape_of(r, selections.get(r.vendor), cpu))
            cpu = 0
    return {v: tuple(x) for v, x in out.items()}


#: The distribution before anything is observed: a mix of whole cards, common shares and multi-card
#: pods, in the proportions of the public Alibaba GPU trace (about half whole single cards, a third
#: shares, the rest 2-8 cards). It fades as real pods arrive.
DEFAULT_PRIOR: dict[Shape, float] = {
    Shape(1, 0, 100, 100): 0.40,
    Shape(1, 0, 50, 50): 0.15,
    Shape(1, 0, 25, 25): 0.12,
    Shape(1, 0, 10, 10): 0.08,
    Shape(1, 0, 75, 75): 0.05,
    Shape(2, 0, 100, 100): 0.08,
    Shape(4, 0, 100, 100): 0.05,
    Shape(8, 0, 100, 100): 0.07,
}


class WorkloadHistogram:
    """Exponentially decaying counts of request shapes, starting from a prior.

    Each `observe` multiplies every earlier weight by ``2 ** (-1 / half_life)`` (done lazily, by growing
    the increment), so a shape seen `half_life` observations ago counts half. The prior enters as
    `prior_weight` pseudo-observations that decay like the rest. Raises ValueError for a non-positive
    `half_life` or a negative `prior_weight`.
    """

    def __init__(
        self,
        prior: Mapping[Shape, float] | None = None,
        *,
        prior_weight: float = 8.0,
        half_life: float = 4000.0,
    ) -> None:
        if not half_life > 0:
            raise ValueError(f"half_life: {half_life!r} must be > 0 (observations)")
        if prior_weight < 0:
            raise ValueError(f"prior_weight: {prior_weight!r} must be >= 0")
        prior = DEFAULT_PRIOR if prior is None else prior
        z = sum(prior.values()) or 1.0
        self.weights: dict[Shape, float] = {s: prior_weight * p / z for s, p in prior.items() if p > 0}
        self._grow = 2.0 ** (1.0 / half_life)
        self._inc = 1.0
        self.observed = 0

    def observe(self, shape: Shape, weight: float = 1.0) -> None:
        """Count one arriving container request of `shape` (`weight` of one pod, e.g. 1/containers)."""
        self._inc *= self._grow
        self.weights[shape] = self.weights.get(shape, 0.0) + weight * self._inc
        self.observed += 1
        if self._inc > 1e100:  # renormalise before floats overflow; ratios are unchanged
            self.weights = {s: w / self._inc for s, w in self.weights.items() if w / self._inc > 1e-12}
            self._inc = 1.0

    def distribution(self, max_shapes: int | None = None) -> dict[Shape, float]:
        """Normalised popularity per shape (sums to 1), the `max_shapes` most popular when given."""
        items = sorted(self.weights.items(), key=lambda kv: (-kv[1], kv[0]))
        if max_shapes is not None:
            items = items[:max_shapes]
        z = sum(w for _, w in items)
        return {s: w / z for s, w in items} if z > 0 else {}


def total_variation(a: Mapping[Shape, float], b: Mapping[Shape, float]) -> float:
    """Total variation distance (0..1) of two distributions over shapes."""
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
