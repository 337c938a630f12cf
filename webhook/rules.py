"""Pod-level admission rules that do not depend on a vendor: policy annotations, typo warnings, stripping.

These are the rules about annotations (hami-legacy-spec §1.3, §1.4): the three scheduling-policy
annotations must hold values the scheduler understands (HAMi only discovers a bad value at filter time,
leaving the pod Pending with an obscure event; we refuse it at the door), user-written allocation
annotations are removed because they are HAMi's to write, and likely mistakes get an admission warning
instead of silently doing nothing.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from hami import annotations as keys
from hami import scoring
from hami.config import CARD_POLICIES, NODE_POLICIES
from hami.errors import InvalidRequest

#: Keys HAMi writes on pods besides the per-vendor allocation lists (never set by users).
HAMI_WRITTEN_KEYS = (
    keys.ASSIGNED_NODE,
    keys.ASSIGNED_TIME,
    keys.BIND_PHASE,
    keys.BIND_TIME,
    keys.MIG_ALLOCATIONS,
)
POLICY_KEYS = scoring.POLICY_KEYS
HAMI_PREFIX = "hami.io/"
#: Annotation warnings itemised per review; the rest are counted in one line.
MAX_ANNOTATION_WARNINGS = 10
IGNORE_VALUE = "ignore"


def check_node_policy(value: str) -> None:
    """`hami.io/node-scheduler-policy`: empty (use the default) or one of binpack, spread, by the
    scheduler's own grammar (`hami.scoring.parse_node_policy`: trimmed, case-insensitive).

    Raises InvalidRequest naming the annotation and the valid values.
    """
    if not scoring.is_set(value):
        return
    try:
        scoring.parse_node_policy(value)
    except scoring.PolicyError:
        raise InvalidRequest(
            f"annotation {keys.NODE_SCHEDULER_POLICY}: {value!r} is not a node policy; "
            f"valid: {', '.join(NODE_POLICIES)}"
        ) from None


def check_gpu_policy(value: str) -> None:
    """`hami.io/gpu-scheduler-policy`: empty, or a comma chain of binpack, spread, numa, mutex,
    topology-aware (e.g. ``binpack,numa``), each at most once, by the scheduler's own grammar
    (`hami.scoring.parse_card_policy`: case-insensitive, empty links dropped). Raises InvalidRequest."""
    if not scoring.is_set(value):
        return
    try:
        scoring.parse_card_policy(value)
    except scoring.PolicyError as e:
        if e.problem is scoring.PolicyProblem.DUPLICATE:
            raise InvalidRequest(
                f"annotation {keys.GPU_SCHEDULER_POLICY}: {value!r} names a policy twice; each may appear once"
            ) from None
        raise InvalidRequest(
            f"annotation {keys.GPU_SCHEDULER_POLICY}: {e.part!r} in {value!r} is not a card policy; "
            f"valid: {', '.join(CARD_POLICIES)} or a comma chain of them such as 'binpack,numa'"
        ) from None


def check_scoring_weights(value: str) -> None:
    """`hami.io/device-scoring-weights`: exactly ``slot=N,core=N,memory=N`` in any order, N whole >= 0,
    at least one positive (hami-legacy-spec §1.3), by the scheduler's own grammar
    (`hami.scoring.parse_weights`). Raises InvalidRequest."""
    valid = "exactly slot=N,core=N,memory=N with whole numbers N >= 0, at least one positive"
    try:
        scoring.parse_weights(value)
    except scoring.PolicyError as e:
        at = f" at {e.part!r}" if e.problem is scoring.PolicyProblem.MALFORMED else ""
        raise InvalidRequest(
            f"annotation {keys.DEVICE_SCORING_WEIGHTS}: {value!r} is invalid{at}; valid: {valid}"
        ) from None


POLICY_CHECKS = {
    keys.NODE_SCHEDULER_POLICY: check_node_policy,
    keys.GPU_SCHEDULER_POLICY: check_gpu_policy,
    keys.DEVICE_SCORING_WEIGHTS: check_scoring_weights,
}


def is_ignored(labels: Mapping[str, str] | None) -> bool:
    """True when `hami.io/webhook: ignore` is among `labels` (a pod's or a namespace's)."""
    return bool(labels) and labels.get(keys.WEBHOOK_IGNORE) == IGNORE_VALUE


def strip_allocation_annotations(annotations: dict[str, str], protected: Iterable[str]) -> list[str]:
    """Remove every key of `protected` from `annotations` in place; returns the removed keys, in order."""
    removed = [k for k in protected if k in annotations]
    for k in removed:
        del annotations[k]
    return removed


def annotation_warnings(
    annotations: Mapping[str, str],
    *,
    known: frozenset[str],
    resource_names: frozenset[str],
    selection_keys: frozenset[str],
    prefixes: tuple[str, ...],
    has_devices: bool,
) -> list[str]:
    """Warnings for likely mistakes in a pod's annotations (the pod is admitted anyway).

    - a key that is a device resource name (``nvidia.com/gpu: "1"``): a request written as an annotation;
    - an unknown key with a HAMi or vendor prefix: a likely typo, with the closest known key if any;
    - a selection or policy annotation on a pod that asks for no device: it has no effect.
    Each warning stays under 120 characters when the key does (the API server's Warning header limit).
    At most `MAX_ANNOTATION_WARNINGS` are itemised, then one line counts the rest: the API server keeps
    only a few KiB of warnings anyway, and a pod with thousands of odd keys must not cost seconds of
    fuzzy matching on the event loop that every other review waits for.
    """
    out: list[str] = []
    more = 0
    candidates: list[str] | None = None
    for key in annotations:
        if key in resource_names:
            text = f"annotation {key} is not a device request: put it in the container's resources.limits"
        elif key in selection_keys:
            if has_devices:
                continue
            text = f"annotation {key} has no effect: the pod asks for no device"
        elif key not in known and key.startswith(prefixes):
            if len(out) >= MAX_ANNOTATION_WARNINGS:
                more += 1
                continue
            if candidates is None:
                candidates = sorted(known | resource_names)
            close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            text = f"unknown annotation {key}{hint}"
        else:
            continue
        if len(out) >= MAX_ANNOTATION_WARNINGS:
            more += 1
        else:
            out.append(text)
    if more:
        out.append(f"{more} more annotation warning(s) not shown")
    return out
