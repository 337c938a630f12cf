"""The filter's prefilter: per-node card summaries that reject full nodes without running the fit.

Why: a filter call names every candidate node (a thousand and more), and most are refused for the same
few reasons (memory, cores, slots). A node's summary (per card: free MiB, free cores, slots) is cached
until its usage changes, and a pod's demand per vendor is reduced to a few `Need`s, so the common
verdict is one memo lookup per node. The summary checks the per-card rules the fit checks, with the
fit's own functions where the rule is arithmetic (`hami.fit.core_reason` for cores), and gives the
fit's reason text; UUID, mode, mutex and quota rules need the card list or the namespace and are left to
the fit. Passing here is therefore a necessary condition only: the prefilter never refuses a node the
fit would accept (a property test holds that).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypeVar

from hami.fit import NodeFit, Reason, core_reason
from hami.model import Device, DeviceUsage, Selection
from hami.pods import ContainerSpec

_ZERO = DeviceUsage()
_UNKNOWN = object()  # memo miss marker (None is a verdict: fits)


@dataclass(frozen=True, slots=True)
class CardSummary:
    """Per-card free capacity of one vendor's cards on a node, cached until the node's usage changes.

    `per_card` rows: (reason or None, free MiB, card MiB, card cores %, used cores %, used slots). Health,
    cordon and slot exhaustion are decided when the summary is built (they do not depend on the demand).
    `types` are the cards' model strings in lower case, for the type rules.
    """

    cards: int
    types: tuple[str, ...]
    per_card: tuple[tuple[Reason | None, int, int, int, int, int], ...]
    # Verdicts by demand: most pods ask alike, and a node's summary lives until its usage changes.
    memo: dict[Need, str | None] = field(default_factory=dict)

    @staticmethod
    def of(
        devices: Sequence[Device], usage: Mapping[str, DeviceUsage], cordoned: frozenset[str]
    ) -> CardSummary:
        rows = []
        for d in devices:
            u = usage.get(d.uuid) or _ZERO
            code = None
            if not d.health:
                code = Reason.CARD_NOT_HEALTH
            elif d.uuid in cordoned:
                code = Reason.CARD_CORDONED
            elif u.used >= d.count:
                code = Reason.CARD_TIME_SLICING_EXHAUSTED
            rows.append((code, d.devmem - u.usedmem, d.devmem, d.devcore, u.usedcores, u.used))
        return CardSummary(len(devices), tuple({d.type.lower() for d in devices}), tuple(rows))


class Need(NamedTuple):
    """One container's single-card demand for one vendor (for `CardSummary` checks).

    A NamedTuple: it is the memo key of every node summary, hashed once per node per filter.
    """

    nums: int
    mem: int  # MiB, 0 when given as a percentage
    pct: int  # percent of a card's memory, 0 when given in MiB
    cores: int  # percent, clamped to 100 as the fit does
    use_types: tuple[str, ...]  # lower case

    def misfit(self, s: CardSummary) -> str | None:
        """The fit's reason text when too few cards of the node can take the demand, else None."""
        try:
            return s.memo[self]
        except KeyError:
            verdict = s.memo[self] = self._misfit(s)
            return verdict

    def _misfit(self, s: CardSummary) -> str | None:
        if self.use_types and not any(u in t for t in s.types for u in self.use_types):
            return f"{s.cards}/{s.cards} CardTypeMismatch"
        ok = 0
        codes: list[Reason] = []
        cores = self.cores
        for code, free_mem, devmem, devcore, usedcores, used in s.per_card:
            if code is None:
                if free_mem < (self.mem or devmem * self.pct // 100):
                    code = Reason.CARD_INSUFFICIENT_MEMORY
                else:
                    code = core_reason(devcore, usedcores, used, cores)
                    if code is None:
                        ok += 1
                        continue
            codes.append(code)
        if ok >= self.nums:
            return None
        if self.nums > s.cards:
            return NodeFit(
                ok=False,
                reasons=Counter({Reason.NODE_INSUFFICIENT_DEVICE: s.cards or 1}),
                total=max(s.cards, 1),
            ).reason_text()
        counts: Counter[Reason] = Counter(codes)
        if ok:
            counts[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += ok
        return NodeFit(ok=False, reasons=counts, total=s.cards).reason_text()


def pod_needs(
    containers: Sequence[ContainerSpec], selections: Mapping[str, Selection]
) -> dict[str, tuple[Need, ...]]:
    """Per vendor, the distinct single-container demands of a pod; each must fit on its own."""
    out: dict[str, dict[Need, None]] = {}
    for c in containers:
        for r in c.requests:
            pct = r.mem_percentage if r.memreq <= 0 and r.mem_percentage <= 100 else 0
            sel = selections.get(r.vendor)
            # UUID, mode and nouse rules are left to the fit; they are rare and need the card list.
            use = tuple(u.lower() for u in sel.use_types) if sel and not sel.mode else ()
            out.setdefault(r.vendor, {})[Need(r.nums, r.memreq, pct, min(r.coresreq, 100), use)] = None
    return {v: tuple(d) for v, d in out.items()}


class SummarizedNode(Protocol):
    """What the prefilter reads of a cached node (`hami.cluster`'s node record)."""

    unusable: str | None
    devices: Mapping[str, Sequence[Device]]
    summaries: dict[str, CardSummary]

    def summary(self, vendor: str) -> CardSummary: ...


N = TypeVar("N", bound=SummarizedNode)


def prefilter(
    nodes: Mapping[str, N],
    node_names: Sequence[str],
    needs: Mapping[str, tuple[Need, ...]],
    failed: dict[str, str],
) -> list[N]:
    """Candidate nodes (in `node_names` order) whose card summaries can take every demand in `needs`;
    the others get their reason in `failed` (``node unregistered``, the node's unusable reason,
    ``NodeInsufficientDevice: no <vendor> device``, or the fit's per-card reason text).

    This loop runs over every candidate node on every filter, so the common case (one vendor, one
    distinct demand) is spelled out with local names and inline memo lookups.
    """
    candidates: list[N] = []
    if len(needs) == 1:
        ((vendor, vneeds),) = needs.items()
        if len(vneeds) == 1:
            need = vneeds[0]
            no_device = f"NodeInsufficientDevice: no {vendor} device"
            for name in node_names:
                n = nodes.get(name)
                if n is None:
                    failed[name] = "node unregistered"
                elif n.unusable:
                    failed[name] = n.unusable
                elif vendor not in n.devices:
                    failed[name] = no_device
                else:
                    summary = n.summaries.get(vendor) or n.summary(vendor)
                    why = summary.memo.get(need, _UNKNOWN)
                    if why is _UNKNOWN:
                        why = need.misfit(summary)
                    if why is None:
                        candidates.append(n)
                    else:
                        failed[name] = why  # type: ignore[assignment]
            return candidates
    for name in node_names:
        n = nodes.get(name)
        if n is None:
            failed[name] = "node unregistered"
            continue
        if n.unusable:
            failed[name] = n.unusable
            continue
        why = None
        for v, vneeds in needs.items():
            if v not in n.devices:
                why = f"NodeInsufficientDevice: no {v} device"
                break
            summary = n.summary(v)
            why = next((w for need in vneeds if (w := need.misfit(summary)) is not None), None)
            if why is not None:
                break
        if why is None:
            candidates.append(n)
        else:
            failed[name] = why
    return candidates
