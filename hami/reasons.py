"""Fit failures in words a person understands, for the scheduler's events and for `hami explain` alike.

Why: the fit's reasons are HAMi's words (``"4/4 CardInsufficientMemory"``), exact and terse, and the
commonest user reports are people reading them wrong: a pod that asked ``nvidia.com/gpu: 1`` with no
memory is given a whole card, so every card that already has a sharer refuses it for "memory", although
most of its memory is free; a container asking ``nvidia.com/gpu: 2`` needs two distinct physical cards,
and "NodeInsufficientDevice" on a node that advertises ten vGPUs reads like a bug. The sentence is built
from the reason counts and the pod's own requests only (no node state), so the extender can add it to
every event without another look-up, and `hami explain` says exactly what the event says.

Pure functions; the reason words stay HAMi's (the sentence is added next to them, never instead).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence

from hami.model import PERCENTAGE_UNSET, ContainerRequest
from hami.pods import ContainerSpec
from hami.reason_words import Reason

#: One ``n/total Word`` term of a node's failure text.
_TERM = re.compile(r"^\s*([0-9]+)/([0-9]+) ([A-Za-z]+)\s*$")
_BY_VALUE = {r.value: r for r in Reason}


def parse_reason_text(text: str) -> tuple[Counter[Reason], int] | None:
    """``"1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted"`` -> (Counter, 4).

    None when `text` is not a fit's per-card text (e.g. ``node unregistered`` or a handshake verdict).
    """
    counts: Counter[Reason] = Counter()
    total = 0
    for part in text.split(","):
        m = _TERM.match(part)
        if m is None or m.group(3) not in _BY_VALUE:
            return None
        counts[_BY_VALUE[m.group(3)]] += int(m.group(1))
        total = max(total, int(m.group(2)))
    return (counts, total) if counts else None


def whole_card(req: ContainerRequest) -> bool:
    """Whether a request takes a card's whole memory: no MiB and no percentage given (HAMi's default)."""
    return req.memreq <= 0 and req.mem_percentage in (PERCENTAGE_UNSET, 100)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


#: Sentences for the reasons whose meaning does not depend on the request.
_PLAIN = {
    Reason.CARD_NOT_HEALTH: "{n} unhealthy",
    Reason.CARD_UNHEALTHY: "{n} unhealthy",
    Reason.CARD_CORDONED: "{n} cordoned (hami.io/device-cordon)",
    Reason.CARD_TYPE_MISMATCH: "{n} of an excluded type (nvidia.com/use-gputype / nouse-gputype)",
    Reason.CARD_UUID_MISMATCH: "{n} excluded by UUID (nvidia.com/use-gpuuuid / nouse-gpuuuid)",
    Reason.NUMA_NOT_FIT: "{n} on a NUMA node without enough cards for numa-bind",
    Reason.CARD_TIME_SLICING_EXHAUSTED: "{n} with every share taken (deviceSplitCount reached)",
    Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: "{n} in use while the pod needs an idle card",
    Reason.RESOURCE_QUOTA_NOT_FIT: "{n} over the namespace quota",
    Reason.CARD_INSUFFICIENT_CORE: "{n} without enough free cores",
    Reason.CARD_COMPUTE_UNITS_EXHAUSTED: "{n} with every core booked",
    Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: "{n} fitting, fewer than the cards asked",
    Reason.CARD_MIG_TOPOLOGY_INFEASIBLE: (
        "{n} in MIG mode without a free placement for an allowed profile that big (the instances "
        "already there, or those this pod takes, overlap every placement)"
    ),
}


def _device_requests(containers: Sequence[ContainerSpec], vendor: str | None) -> list[ContainerRequest]:
    return [r for c in containers for r in c.requests if vendor is None or r.vendor == vendor]


def sentence(
    reasons: Mapping[Reason, int],
    total: int,
    containers: Sequence[ContainerSpec],
    *,
    vendor: str | None = None,
) -> str:
    """One sentence for a node's failure (`reasons` per-card counts of `total` cards) given the pod's
    requests (`containers`, optionally only those of `vendor`).

    ``"needs 2 distinct cards, node has 1"``; ``"asks a whole card (no gpumem given); every card has
    sharers"``; ``"no card has 8000 MiB free (3 of 4 cards)"``; otherwise the reasons in plain words.
    """
    reqs = _device_requests(containers, vendor)
    if Reason.NODE_INSUFFICIENT_DEVICE in reasons:
        have = total if reasons[Reason.NODE_INSUFFICIENT_DEVICE] else 0
        want = max((r.nums for r in reqs if r.nums > have), default=0)
        if want:
            return f"needs {want} distinct cards, node has {have}"
        return f"node has {_plural(have, 'card')}, fewer than the pod asks"
    parts: list[str] = []
    mem = reasons.get(Reason.CARD_INSUFFICIENT_MEMORY, 0)
    if mem:
        if reqs and all(whole_card(r) for r in reqs):
            # A whole-card request fails on memory only where some other pod holds memory: a sharer.
            if mem == total:
                parts.append("asks a whole card (no gpumem given); every card has sharers")
            else:
                parts.append(f"asks a whole card (no gpumem given); {mem} of {total} cards have sharers")
        else:
            asked = sorted({r.memreq for r in reqs if r.memreq > 0})
            pct = sorted(
                {r.mem_percentage for r in reqs if r.memreq <= 0 and r.mem_percentage != PERCENTAGE_UNSET}
            )
            what = " / ".join([*(f"{m} MiB" for m in asked), *(f"{p} % of a card's memory" for p in pct)])
            if mem == total:
                parts.append(f"no card has {what or 'the asked memory'} free")
            else:
                parts.append(f"{mem} of {total} cards without {what or 'the asked memory'} free")
    for r, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0].value)):
        if r is Reason.CARD_INSUFFICIENT_MEMORY or not n:
            continue
        template = _PLAIN.get(r)
        count = (
            "every card"
            if n == total and r is not Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST
            else _plural(n, "card")
        )
        parts.append(template.format(n=count) if template else f"{_plural(n, 'card')}: {r.value}")
    return "; ".join(parts)


def humanize(text: str, containers: Sequence[ContainerSpec], *, vendor: str | None = None) -> str:
    """A node's failure text with its sentence: ``"1/1 NodeInsufficientDevice (needs 2 distinct cards,
    node has 1)"``. Texts that are not per-card reasons (unregistered, handshake) come back unchanged."""
    parsed = parse_reason_text(text)
    if parsed is None:
        return text
    words = sentence(parsed[0], parsed[1], containers, vendor=vendor)
    return f"{text} ({words})" if words else text


__all__ = ["humanize", "parse_reason_text", "sentence", "whole_card"]
