"""The filter's prefilter: per-node card summaries that reject full nodes without running the fit.

Why: a filter call names every candidate node (a thousand and more), and most are refused for the same
few reasons (memory, cores, slots). A node's summary (per card: free MiB, free cores, slots) is cached
until its usage changes, and a pod's demand per vendor is reduced to a few `Need`s, so the common
verdict is one memo lookup per node. The summary checks the per-card rules the fit checks, with the
fit's own functions where the rule is arithmetic (`hami.card_checks.core_reason` for cores), and gives the
fit's reason text; UUID, mode, mutex and quota rules need the card list or the namespace and are left to
the fit. Passing here is therefore a necessary condition only: the prefilter never refuses a node the
fit would accept (a property test holds that).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import filterfalse, repeat
from typing import NamedTuple, Protocol, TypeVar

from hami.card_checks import core_reason
from hami.fit import NodeFit
from hami.model import MIG_MODE, Device, DeviceUsage, Selection
from hami.pods import ContainerSpec
from hami.reason_words import Reason

_ZERO = DeviceUsage()
_UNKNOWN = object()  # memo miss marker (None is a verdict: fits)


@dataclass(frozen=True, slots=True)
class CardSummary:
    """Per-card free capacity of one vendor's cards on a node, cached until the node's usage changes.

    `per_card` rows: (reason or None, free MiB, card MiB, card cores %, used cores %, used slots). Health,
    cordon and slot exhaustion are decided when the summary is built (they do not depend on the demand).
    `types` are the cards' model strings in lower case, for the type rules. `mig` counts the cards in
    MIG mode, which one container may take several times: a node with any leaves the card count to
    the fit.
    """

    cards: int
    types: tuple[str, ...]
    per_card: tuple[tuple[Reason | None, int, int, int, int, int], ...]
    mig: int = 0
    # Verdicts by demand: most pods ask alike, and a node's summary lives until its usage changes.
    memo: dict[Need, str | None] = field(default_factory=dict)

    @staticmethod
    def of(
        devices: Sequence[Device], usage: Mapping[str, DeviceUsage], cordoned: frozenset[str]
    ) -> CardSummary:
        rows = []
        mig = 0
        for d in devices:
            u = usage.get(d.uuid) or _ZERO
            code = None
            mig += d.mode == MIG_MODE
            if not d.health or u.mig_unknown:
                code = Reason.CARD_NOT_HEALTH
            elif d.uuid in cordoned:
                code = Reason.CARD_CORDONED
            elif u.used >= d.count:
                code = Reason.CARD_TIME_SLICING_EXHAUSTED
            rows.append((code, d.devmem - u.usedmem, d.devmem, d.devcore, u.usedcores, u.used))
        return CardSummary(len(devices), tuple({d.type.lower() for d in devices}), tuple(rows), mig=mig)


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
                        if ok >= self.nums or s.mig:
                            return None  # enough cards: the other cards' reasons are never read
                        continue
            codes.append(code)
        if ok >= self.nums or (ok and s.mig):
            return None  # a card in MIG mode may give one container several instances: the fit decides
        if self.nums > s.cards and not s.mig:
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


def node_verdict(n: SummarizedNode | None, needs: Mapping[str, tuple[Need, ...]]) -> str | None:
    """One node's prefilter verdict: None when its summaries can take every demand, else the reason
    `prefilter` gives (the same texts, in the same order of checks)."""
    if n is None:
        return "node unregistered"
    if n.unusable:
        return n.unusable
    for v, vneeds in needs.items():
        if v not in n.devices:
            return f"NodeInsufficientDevice: no {v} device"
        summary = n.summaries.get(v) or n.summary(v)
        for need in vneeds:
            why = need.misfit(summary)
            if why is not None:
                return why
    return None


@dataclass(slots=True)
class _Verdicts:
    """Every node's verdict for one demand, current up to change-log position `seen`."""

    fits: set[str]
    fails: dict[str, str]
    seen: int


class VerdictIndex:
    """Per demand, the prefilter verdict of every node, kept current from the names of changed nodes.

    Why: at 10,000 nodes the per-node loop of `prefilter` alone costs ~20 ms per filter, although
    between two filters only the nodes a reservation or an event touched changed. The owner of the
    nodes calls `changed(name)` whenever anything `node_verdict` reads may have changed (usage,
    registration, unusable reason, removal) and `reset()` when it replaces them all; `candidates`
    then re-judges only the nodes changed since the demand was last asked for, and answers a filter
    with set lookups over the candidate names; a call naming fewer than half as many nodes as there
    are to re-judge judges just the named ones (`prefilter`) and leaves the demand's verdicts behind.
    A demand gets verdicts over every node on its second ask naming at least a quarter of the nodes.
    The verdicts are exactly `prefilter`'s (a property test holds that). At most `max_demands` demands are kept (least recently used first out): each holds a
    set and a dict over all nodes, about 1 MiB at 10,000 nodes.
    """

    def __init__(self, *, max_demands: int = 32, max_log: int = 100_000) -> None:
        self.max_demands = max_demands
        self.max_log = max_log
        self._log: list[str] = []
        self._base = 0  # absolute position of _log[0]
        self._by_key: dict[tuple, _Verdicts] = {}  # insertion order = least recently used first
        # Demands asked for once without verdicts kept (least recently asked first): asked again, they
        # get verdicts over every node, which later asks answer with set lookups.
        self._asked: dict[tuple, None] = {}

    def changed(self, name: str) -> None:
        """Node `name` changed (or appeared, or went)."""
        self._log.append(name)

    def reset(self) -> None:
        """Every node changed (a rebuild): forget all verdicts."""
        self._base += len(self._log)
        self._log.clear()
        self._by_key.clear()
        self._asked.clear()

    def candidates(
        self,
        nodes: Mapping[str, N],
        node_names: Sequence[str],
        needs: Mapping[str, tuple[Need, ...]],
        failed: dict[str, str],
    ) -> list[N]:
        """What `prefilter(nodes, node_names, needs, failed)` returns and writes into `failed` (the
        same entries; in `failed` they may come in another order)."""
        end = self._base + len(self._log)
        key = tuple(needs.items())
        v = self._by_key.get(key)
        if v is None and len(nodes) > 2 * len(node_names):
            # Fewer than half the nodes named: judging those costs less than judging every node. When a
            # quarter or more are named (kube-scheduler's share below ~3,000 nodes, rotating) and the
            # demand was asked for before (most pods ask alike), verdicts over every node are kept, so
            # later asks cost set lookups; fewer names (the simulator's best few) never build them.
            if key not in self._asked or 4 * len(node_names) < len(nodes):
                self._asked[key] = None
                while len(self._asked) > 4 * self.max_demands:
                    del self._asked[next(iter(self._asked))]
                return prefilter(nodes, node_names, needs, failed)
        if v is not None and end - v.seen > 2 * len(node_names):
            # A few names (the simulator hands over the best few fitting nodes): judging them costs
            # less than catching this demand's verdicts up with every node changed since it was last
            # asked for; the verdicts are the same, the kept ones catch up when many names come.
            return prefilter(nodes, node_names, needs, failed)
        self._asked.pop(key, None)
        v = self._by_key.pop(key, None)
        if v is None:
            fits: set[str] = set()
            fails: dict[str, str] = {}
            for name, n in nodes.items():
                why = node_verdict(n, needs)
                if why is None:
                    fits.add(name)
                else:
                    fails[name] = why
            v = _Verdicts(fits, fails, end)
        elif v.seen < end:
            fits, fails = v.fits, v.fails
            for name in set(self._log[v.seen - self._base :]):
                n = nodes.get(name)
                fits.discard(name)
                fails.pop(name, None)
                if n is None:
                    continue  # gone: "node unregistered" below, as for a name never seen
                why = node_verdict(n, needs)
                if why is None:
                    fits.add(name)
                else:
                    fails[name] = why
            v.seen = end
        self._by_key[key] = v  # most recently used last
        while len(self._by_key) > self.max_demands:
            del self._by_key[next(iter(self._by_key))]
        if len(self._log) > self.max_log:
            self._compact()
        # C-level iteration (filter/map over bound methods): this runs over every candidate name.
        out = list(filter(v.fits.__contains__, node_names))
        if len(out) < len(node_names):
            refused = list(filterfalse(v.fits.__contains__, node_names))
            if (
                len(refused) == len(v.fails)
                and all(map(v.fails.__contains__, refused))
                and (len(set(refused)) == len(refused))
            ):
                # Every refused node of the cluster is asked about (kube-scheduler passed all nodes):
                # a dict merge reuses the stored hashes, ~2x faster than a lookup per name.
                failed.update(v.fails)
            else:
                failed.update(
                    zip(refused, map(v.fails.get, refused, repeat("node unregistered")), strict=True)
                )
        return list(map(nodes.__getitem__, out))

    def _compact(self) -> None:
        """Drop the log entries every kept demand has seen, and the demands far behind (they rebuild)."""
        end = self._base + len(self._log)
        for key in [k for k, v in self._by_key.items() if end - v.seen > self.max_log // 2]:
            del self._by_key[key]
        start = min((v.seen for v in self._by_key.values()), default=end)
        del self._log[: start - self._base]
        self._base = start
