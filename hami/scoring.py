"""Node and card policies: which node wins, and in which order a node's cards are tried.

Follows HAMi's policies (hami-legacy-spec §2.6) with two deliberate corrections:
- the per-card score includes the container's own request (HAMi compares the request type `NVIDIA` with
  the device type `NVIDIA-<model>`, so its request term is always 0 and the score is pure utilisation);
- with `nvidia.com/numa-bind`, NUMA is a grouping constraint handled by the fit, not a primary sort key,
  so under `spread` a busy NUMA node is not filled before an idle one.
Orders here are "preferred first" (HAMi sorts ascending and scans from the tail).
An unknown policy value from a pod annotation falls back to the configured default and is reported
(`PolicyChoice.warnings`), never silently changing behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol

from hami import annotations as A
from hami.errors import InvalidRequest
from hami.model import Device, DeviceUsage

#: Policy names as the device config and the pod annotations spell them (HAMi's). Defined here, not in
#: `hami.config`, because the config imports the vendors, whose fits import this module.
NODE_POLICIES = ("binpack", "spread", "fragmentation")
CARD_POLICIES = ("binpack", "spread", "numa", "mutex", "topology-aware", "fragmentation")


class NodePolicy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    FRAGMENTATION = "fragmentation"  # smallest increase of expected fragmentation (`hami.fragmentation`)


class CardPolicy(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"
    NUMA = "numa"
    MUTEX = "mutex"
    TOPOLOGY_AWARE = "topology-aware"
    FRAGMENTATION = "fragmentation"


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """Weights of the per-card score terms (`hami.io/device-scoring-weights: slot=1,core=1,memory=3`)."""

    slot: int = 1
    core: int = 1
    memory: int = 1


class CardDeltas(Protocol):
    """What the card policy `fragmentation` asks of the learned workload (`hami.fragmentation.FragmentationModel`).

    Named here as a protocol, not by the model's class: the model reads pods, the vendors' fits name
    `PolicyChoice`, and the pods name the vendors, so the policies sit below all three.
    """

    def card_deltas(
        self,
        devices: Sequence[Device],
        usage: Callable[[str], DeviceUsage],
        candidates: Sequence[tuple[Device, int]],
        cores: int,
    ) -> list[float]:
        """Per candidate (card of `devices`, MiB the container takes there), in `candidates` order, the
        increase of the node's expected fragmentation when one container of that MiB and `cores`
        percent goes on that card."""
        ...


@dataclass(frozen=True, slots=True)
class PolicyChoice:
    """The policies in force for one pod, and warnings about annotation values that were not used."""

    node: NodePolicy
    cards: tuple[CardPolicy, ...]
    weights: ScoringWeights = ScoringWeights()
    warnings: tuple[str, ...] = field(default=())
    #: The learned workload the `fragmentation` policies score with (set by the cluster state when a
    #: policy asks for it; None elsewhere, where `fragmentation` orders cards as binpack does).
    fragmentation: CardDeltas | None = field(default=None, compare=False, repr=False)

    @property
    def uses_fragmentation(self) -> bool:
        return self.node is NodePolicy.FRAGMENTATION or CardPolicy.FRAGMENTATION in self.cards

    @property
    def mutex(self) -> bool:
        return CardPolicy.MUTEX in self.cards

    @property
    def topology_aware(self) -> bool:
        return CardPolicy.TOPOLOGY_AWARE in self.cards


class PolicyProblem(StrEnum):
    """What is wrong with a policy annotation value (`PolicyError.problem`)."""

    UNKNOWN = "unknown"  # a name outside the valid set
    DUPLICATE = "duplicate"  # a card policy named twice in a chain
    EMPTY = "empty"  # only commas and blanks
    MALFORMED = "malformed"  # a weights entry that is not `key=N` with a known key, once
    INCOMPLETE = "incomplete"  # weights without all three keys, or all zero


class PolicyError(InvalidRequest):
    """A policy annotation value outside the grammar.

    `key` is the annotation, `value` the value as written, `problem` a `PolicyProblem`, `part` the
    offending piece as written (a chain link or a weights entry, stripped), ``""`` when the whole
    value is at fault. The message is the scheduler's; the webhook words its denial from the fields.
    """

    def __init__(self, message: str, *, key: str, value: str, problem: PolicyProblem, part: str = "") -> None:
        super().__init__(message)
        self.key, self.value, self.problem, self.part = key, value, problem, part


#: The pod annotations that override the configured policies (hami-legacy-spec §1.3).
POLICY_KEYS = (A.NODE_SCHEDULER_POLICY, A.GPU_SCHEDULER_POLICY, A.DEVICE_SCORING_WEIGHTS)


def is_set(value: str | None) -> bool:
    """Whether a policy annotation value overrides the default: empty or blank means "not set" (HAMi)."""
    return bool(value and value.strip())


def parse_card_policy(value: str) -> tuple[CardPolicy, ...]:
    """A card policy or an ordered comma chain (``"binpack,numa"``): the grammar the scheduler and the
    webhook share. Names are trimmed and case-insensitive, empty links (``"binpack,"``) are dropped,
    each name may appear once. Raises PolicyError (an InvalidRequest) naming the annotation.
    """
    raw = [p.strip() for p in value.split(",") if p.strip()]
    parts = [p.lower() for p in raw]
    key = A.GPU_SCHEDULER_POLICY
    if not parts:
        raise PolicyError(
            f"{key}: empty value; valid: {', '.join(CARD_POLICIES)} or a comma chain",
            key=key, value=value, problem=PolicyProblem.EMPTY,
        )  # fmt: skip
    for p, written in zip(parts, raw, strict=True):
        if p not in CARD_POLICIES:
            raise PolicyError(
                f"{key}: unknown policy {p!r}; valid: {', '.join(CARD_POLICIES)} "
                "or a comma chain of them such as 'binpack,numa'",
                key=key, value=value, problem=PolicyProblem.UNKNOWN, part=written,
            )  # fmt: skip
    if len(set(parts)) != len(parts):
        raise PolicyError(
            f"{key}: {value!r} names a policy twice; each may appear once",
            key=key, value=value, problem=PolicyProblem.DUPLICATE,
        )  # fmt: skip
    return tuple(CardPolicy(p) for p in parts)


def parse_node_policy(value: str) -> NodePolicy:
    """``binpack`` or ``spread`` (trimmed, case-insensitive). Raises PolicyError (an InvalidRequest)."""
    v = value.strip().lower()
    if v not in NODE_POLICIES:
        raise PolicyError(
            f"{A.NODE_SCHEDULER_POLICY}: unknown policy {value!r}; valid: {', '.join(NODE_POLICIES)}",
            key=A.NODE_SCHEDULER_POLICY, value=value, problem=PolicyProblem.UNKNOWN, part=value.strip(),
        )  # fmt: skip
    return NodePolicy(v)


def parse_weights(value: str) -> ScoringWeights:
    """``slot=1,core=1,memory=3``: exactly these three keys in any order, whole numbers >= 0, at least
    one > 0. Raises PolicyError (an InvalidRequest) naming the annotation and the valid form.
    """
    key = A.DEVICE_SCORING_WEIGHTS
    form = f"{key}: {value!r}; valid form 'slot=N,core=N,memory=N' with integers >= 0, one > 0"
    out: dict[str, int] = {}
    for part in value.split(","):
        k, sep, v = part.partition("=")
        k, v = k.strip(), v.strip()
        if not sep or k not in ("slot", "core", "memory") or k in out or not v.isdigit():
            raise PolicyError(form, key=key, value=value, problem=PolicyProblem.MALFORMED, part=part.strip())
        out[k] = int(v)
    if set(out) != {"slot", "core", "memory"} or not any(out.values()):
        raise PolicyError(form, key=key, value=value, problem=PolicyProblem.INCOMPLETE)
    return ScoringWeights(**out)


#: The parser of each policy annotation.
POLICY_PARSERS = {
    A.NODE_SCHEDULER_POLICY: parse_node_policy,
    A.GPU_SCHEDULER_POLICY: parse_card_policy,
    A.DEVICE_SCORING_WEIGHTS: parse_weights,
}


def policy_errors(annotations: Mapping[str, str]) -> list[PolicyError]:
    """The errors of a pod's set policy annotations (blank ones are not set), in `POLICY_KEYS` order:
    what the webhook denies and what the scheduler would replace by its defaults with a warning."""
    out = []
    for key in POLICY_KEYS:
        value = annotations.get(key)
        if is_set(value):
            try:
                POLICY_PARSERS[key](str(value))
            except PolicyError as e:
                out.append(e)
    return out


def choose_policies(annotations: Mapping[str, str], *, node_default: str, card_default: str) -> PolicyChoice:
    """Policies for a pod: its override annotations when valid, else the configured defaults (with a warning).

    An empty or blank annotation value means "not set" (HAMi: empty = the default), not a warning.
    """
    warnings: list[str] = []
    node = NodePolicy(node_default)
    cards = parse_card_policy(card_default)
    weights = ScoringWeights()
    if is_set(v := annotations.get(A.NODE_SCHEDULER_POLICY)):
        try:
            node = parse_node_policy(v)
        except InvalidRequest as e:
            warnings.append(f"{e}; using the default {node_default!r}")
    if is_set(v := annotations.get(A.GPU_SCHEDULER_POLICY)):
        try:
            cards = parse_card_policy(v)
        except InvalidRequest as e:
            warnings.append(f"{e}; using the default {card_default!r}")
    if is_set(v := annotations.get(A.DEVICE_SCORING_WEIGHTS)):
        try:
            weights = parse_weights(v)
        except InvalidRequest as e:
            warnings.append(f"{e}; using the default slot=1,core=1,memory=1")
    return PolicyChoice(node=node, cards=cards, weights=weights, warnings=tuple(warnings))


def card_score(device: Device, usage: DeviceUsage, *, mem: int, cores: int, weights: ScoringWeights) -> float:
    """Per-card score (0..~30) with this container's request included (`mem` MiB, `cores` percent).

    ``10 x (w_slot (1 + used)/count + w_core (cores + usedcores)/devcore + w_mem (mem + usedmem)/devmem)``;
    0 when a denominator is 0 (HAMi §2.6).
    """
    if device.count <= 0 or device.devcore <= 0 or device.devmem <= 0:
        return 0.0
    return 10.0 * (
        weights.slot * (1 + usage.used) / device.count
        + weights.core * (cores + usage.usedcores) / device.devcore
        + weights.memory * (mem + usage.usedmem) / device.devmem
    )


def order_cards(
    cards: Sequence[tuple[Device, DeviceUsage, float]], policies: Sequence[CardPolicy]
) -> list[tuple[Device, DeviceUsage, float]]:
    """Order (device, usage, score) preferred-first by the policy chain; ties by device index.

    binpack: higher score first; spread: lower score first; numa: lower NUMA node first;
    mutex: idle cards first; topology-aware acts in the fit, not here; fragmentation: higher score
    first, where the fit gives the negated increase of expected fragmentation as the score when a
    `FragmentationModel` is in the policy (without one it orders as binpack).
    """

    def key(item: tuple[Device, DeviceUsage, float]) -> tuple:
        d, u, s = item
        k: list[float] = []
        for p in policies:
            if p is CardPolicy.BINPACK or p is CardPolicy.FRAGMENTATION:
                k.append(-s)
            elif p is CardPolicy.SPREAD:
                k.append(s)
            elif p is CardPolicy.NUMA:
                k.append(d.numa)
            elif p is CardPolicy.MUTEX:
                k.append(u.used)
        if len(policies) == 1 and policies[0] in (CardPolicy.BINPACK, CardPolicy.SPREAD):
            k.append(d.numa)  # HAMi: ties by NUMA ascending
        k.append(d.index)
        return tuple(k)

    return sorted(cards, key=key)


def node_score(count: int, used: int, totalcore: int, usedcores: int, totalmem: int, usedmem: int) -> float:
    """Node utilisation score (0..30) before the pod: ``10 x (used/count + usedcores/totalcore + usedmem/totalmem)``."""
    s = 0.0
    if count:
        s += used / count
    if totalcore:
        s += usedcores / totalcore
    if totalmem:
        s += usedmem / totalmem
    return 10.0 * s


def best_combination(
    candidates: Sequence[str], n: int, pair_scores: Mapping[str, Mapping[str, int]]
) -> list[str]:
    """Topology-aware choice (§2.5): 1 card -> the one least connected to the other candidates (keeping
    well-connected cards free); n cards -> the n-combination with the highest total pair score.
    Ties keep the candidates' order (preferred first).
    """
    from itertools import combinations

    def pair(a: str, b: str) -> int:
        return pair_scores.get(a, {}).get(b, 0)

    if n == 1:
        return [min(candidates, key=lambda c: sum(pair(c, o) for o in candidates if o != c))]
    best, best_total = list(candidates[:n]), -1
    for combo in combinations(candidates, n):
        total = sum(pair(a, b) for a, b in combinations(combo, 2))
        if total > best_total:
            best, best_total = list(combo), total
    return best
