"""What one replay of `hami.simulate.engine` produces and how it is named: the mode, the policy, the
placements, the checkpoints, the per-model usage, the run's figures (`RunResult`), and the one-line
summaries of failed pods' per-node reasons. Pure data and text; no replay logic.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from hami.cluster import ClusterState
from hami.config import CARD_POLICIES, NODE_POLICIES
from hami.errors import InvalidRequest
from hami.scoring import parse_card_policy, parse_node_policy
from hami.simulate.fragmeter import ClusterFragmentation, NodeFragmentation


class Mode(StrEnum):
    TRACE = "trace"
    FILL = "fill"


@dataclass(frozen=True, slots=True)
class Policy:
    """A node policy and a card policy chain (comma-separated, as in `gpuSchedulerPolicy`)."""

    node: str
    card: str

    @property
    def label(self) -> str:
        """``binpack`` when both are the same single policy, else ``node/card`` (``binpack/spread``)."""
        return self.node if self.node == self.card else f"{self.node}/{self.card.replace(',', '+')}"


def parse_policy(
    spec: str, *, default_node: str = "binpack", default_card: str = "spread", flag: str = "--policy"
) -> Policy:
    """A policy as the CLI writes it.

    - ``binpack`` / ``spread``: that node policy and that card policy;
    - a card-only policy (``numa``, ``mutex``, ``topology-aware``): that card policy, `default_node`;
    - ``NODE/CARD``: both explicitly, the card part may be a chain joined by ``+`` (``binpack/numa+binpack``).
    Raises InvalidRequest naming `flag`, the value and the valid ones.
    """
    s = spec.strip().lower()
    valid = (
        f"valid: {', '.join(CARD_POLICIES)}, or NODE/CARD with NODE one of {', '.join(NODE_POLICIES)} "
        "and CARD a card policy or a '+' chain of them (e.g. binpack/numa+binpack)"
    )
    if "/" in s:
        node, _, card = s.partition("/")
    elif s in NODE_POLICIES:
        node, card = s, s
    else:
        node, card = default_node, s
    try:
        node = parse_node_policy(node.strip()).value
        chain = parse_card_policy(card.replace("+", ","))
    except InvalidRequest:
        raise InvalidRequest(f"{flag}: {spec!r} is not a policy; {valid}") from None
    return Policy(node=node, card=",".join(p.value for p in chain))


@dataclass(frozen=True, slots=True)
class Placement:
    """One row of the placements file: one card of one container, or one pod without cards."""

    pod: str
    container: str
    node: str
    card_uuid: str
    card_model: str
    mem_mib: int | None
    cores: int | None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """Allocation (ratios 0..1: cores, memory, slots and the capacity taken, `hami.simulate.allocation`)
    when the arrived GPU demand reached `arrival` percent of capacity, at trace time `time` (seconds;
    None in fill mode), and the cluster's expected fragmentation then (`hami.simulate.fragmeter`; None
    on curve points, which are not measured)."""

    arrival: float
    gpu_allocation_ratio: float
    memory_allocation_ratio: float
    time: float | None = None
    fragmentation: ClusterFragmentation | None = None
    slot_allocation_ratio: float = 0.0
    capacity_allocation_ratio: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelUsage:
    """Per card model (or vendor family): cards, cores (percent), memory (MiB) and sharer slots, total
    and used, and `taken`: the cards' capacity taken, in cards (per card the largest of its used
    shares of cores, memory and slots, summed)."""

    cards: int
    devcore: int
    usedcores: int
    devmem: int
    usedmem: int
    slots: int = 0
    usedslots: int = 0
    taken: float = 0.0


@dataclass(frozen=True, slots=True)
class Figures:
    """Allocation of a set of cards, ratios 0..1: `cores` (used / registered cores), `memory` (MiB),
    `slots` (sharers) and `capacity` (the mean over the cards of the largest of the three)."""

    cores: float = 0.0
    memory: float = 0.0
    slots: float = 0.0
    capacity: float = 0.0


@dataclass(slots=True)
class RunResult:
    """Everything one policy's run produced. Ratios are 0..1, arrivals percent of GPU capacity."""

    policy: Policy
    mode: Mode
    arrival_target: float | None
    seed: int
    nodes: int
    gpus: int
    pods: int = 0
    gpu_pods: int = 0
    scheduled: int = 0
    failed: int = 0
    failed_gpu_pods: int = 0
    #: GPU demand of the failed pods, in cards (num_gpu x share for openb pods).
    failed_gpu_demand: float = 0.0
    deleted: int = 0
    #: At the end: used cores / registered cores, MiB, slots, and the cards' capacity taken (the
    #: headline: per card the largest of the three, `hami.simulate.allocation`).
    gpu_allocation_ratio: float = 0.0
    memory_allocation_ratio: float = 0.0
    slot_allocation_ratio: float = 0.0
    capacity_allocation_ratio: float = 0.0
    #: The highest of each during the run; `peak_time` is when the capacity taken was highest.
    peak_gpu_allocation_ratio: float = 0.0
    peak_memory_allocation_ratio: float = 0.0
    peak_slot_allocation_ratio: float = 0.0
    peak_capacity_allocation_ratio: float = 0.0
    peak_time: float | None = None
    #: The cluster's GPU capacity in cards (registered cores / 100), the unit of arrivals.
    gpu_capacity: float = 0.0
    arrived_gpu_demand: float = 0.0
    first_failure_arrival: float | None = None
    elapsed_s: float = 0.0
    checkpoints: list[Checkpoint] = field(default_factory=list)
    curve: list[Checkpoint] = field(default_factory=list)
    failure_reasons: Counter[str] = field(default_factory=Counter)
    #: The core's warnings (e.g. an unknown policy in a pod annotation) and how many pods got each.
    warnings: Counter[str] = field(default_factory=Counter)
    per_model: dict[str, ModelUsage] = field(default_factory=dict)
    peak_per_model: dict[str, ModelUsage] = field(default_factory=dict)
    #: Per vendor family (`hami.simulate.allocation.families`), at the end and at the peak.
    per_family: dict[str, ModelUsage] = field(default_factory=dict)
    peak_per_family: dict[str, ModelUsage] = field(default_factory=dict)
    #: The allocation before the first arrival (the pods already placed; zeros from empty cards).
    start_allocation: Figures | None = None
    decision_s: list[float] = field(default_factory=list)
    placements: list[Placement] | None = None
    #: (pod name, annotations the extender would patch onto it) per scheduled GPU pod, when asked.
    annotations: list[tuple[str, dict[str, str]]] | None = None
    #: Every GPU node's expected fragmentation at the end of a fill run, at the checkpoint of highest
    #: GPU allocation of a trace run (`node_fragmentation_at`; None: at the end).
    node_fragmentation: list[NodeFragmentation] = field(default_factory=list)
    node_fragmentation_at: Checkpoint | None = None
    #: With pods placed at the start (`placed`): the cluster's and every GPU node's fragmentation then.
    start_fragmentation: ClusterFragmentation | None = None
    start_node_fragmentation: list[NodeFragmentation] = field(default_factory=list)
    #: The core's state at the end of the run (for checks against `card_allocation`); not serialised.
    state: ClusterState | None = field(default=None, repr=False)

    def decision_percentile_ms(self, q: float) -> float | None:
        """The q-th percentile (0..100, nearest rank) of `ClusterState.filter` time per GPU pod, in ms."""
        if not self.decision_s:
            return None
        xs = sorted(self.decision_s)
        k = min(len(xs) - 1, max(0, math.ceil(q / 100 * len(xs)) - 1))
        return xs[k] * 1000


#: progress(done fraction 0..1) — called now and then during a run.
Progress = Callable[[float], None]


_NODE_REASON = re.compile(r"\d+/\d+ ")


@functools.lru_cache(maxsize=4096)
def _reason_kind(text: str) -> str:
    # Texts repeat across nodes and pods (a handful of shapes), so the regex runs once per shape.
    # "1/8 A, 7/8 B" and "3/8 B, 5/8 A" are the same kind of misfit: names only, sorted.
    return ", ".join(sorted(_NODE_REASON.sub("", text).split(":")[0].split(", ")))


def summarise_failure(failed_nodes: Mapping[str, str], *, limit: int = 3) -> tuple[str, str]:
    """(pod reason text, category) from the extender's per-node reasons.

    Text: ``0/12 nodes fit: 9 CardInsufficientMemory; 3 NodeInsufficientDevice`` (nodes per reason, the
    per-card counts dropped, most common first; at equal counts card-level reasons before "this node has
    no such device at all", then by name, so the text does not depend on the order nodes were tried).
    Category (for tables): the most common reason of the nodes that have
    devices, else the most common reason.
    """
    return summarise_reasons(Counter(failed_nodes.values()), limit=limit)


def summarise_reasons(reasons: Mapping[str, int], *, limit: int = 3) -> tuple[str, str]:
    """`summarise_failure` from the number of nodes per reason text (what it counts first)."""
    kinds: Counter[str] = Counter()
    for t, k in reasons.items():
        kinds[_reason_kind(t)] += k
    if not kinds:
        return "no candidate node", "no candidate node"

    def deviceless(kind: str) -> bool:
        return kind.startswith(("node unregistered", "NodeInsufficientDevice"))

    common = sorted(kinds.items(), key=lambda kv: (-kv[1], deviceless(kv[0]), kv[0]))
    text = f"0/{sum(reasons.values())} nodes fit: " + "; ".join(f"{n} {k}" for k, n in common[:limit])
    if len(common) > limit:
        text += f"; {sum(n for _, n in common[limit:])} other"
    card_level = [k for k, _ in common if not deviceless(k)]
    return text, card_level[0] if card_level else common[0][0]
