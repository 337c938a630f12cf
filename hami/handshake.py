"""Is a registered node alive? HAMi's handshake health check (`device.CheckHealth`, hami-legacy-spec §2.2.3),
without the failure modes users hit.

Why a handshake at all: the registration annotation (`hami.io/node-nvidia-register`) outlives the device
plugin that wrote it. A node whose plugin is gone (uninstalled, crash-looping, node rebooted without it)
still shows cards, and pods placed there fail at Allocate. HAMi's scheduler therefore writes
``Requesting_<time>`` into the vendor's handshake annotation, the plugin answers ``Reported_<time>``, and
a ``Requesting`` stamp that nobody answered within 60 s means "plugin gone" unless kubelet still
advertises the device count (node allocatable > 0).

What is deliberately different from HAMi (user bug log R01/R02):

* A value that is not ``Requesting`` (absent, ``Reported_…``, a stale ``Deleted_…`` left by an old plugin,
  garbage) never keeps a node out: the node is usable and gets a fresh stamp. HAMi versions that kept
  ``Deleted_`` nodes out left pods pending forever after a plugin restart.
* An unanswered stamp alone does not remove a node whose kubelet still advertises the cards
  (allocatable > 0); only "unanswered and nothing advertised", or "kubelet advertises exactly 0", does.
  A plugin that answers a little late (30-35 s refresh against 60 s, plus clock skew) costs nothing.
* The timeout is a parameter (`timeout_s`), HAMi hard-codes 60 s (its docs say 5 minutes).

Malformed *registration* values are not judged here: `hami.cluster.ClusterState.upsert_node` parses them
and marks the node unusable with the parse error; this module only adds the liveness verdict.
Pure functions: the caller supplies the clock and writes the stamps (only the active replica writes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from hami import annotations as A
from hami.errors import InvalidRequest
from hami.quantity import to_count
from hami.vendors.base import Vendor

#: HAMi's handshake expiry (pkg/device/devices.go CheckHealth), seconds.
HANDSHAKE_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class NodeHealth:
    """The liveness verdict for one node.

    `reason` is None when the node may take new pods, else a sentence naming the annotation, its value
    and what to check. `stamps`: handshake annotations the active scheduler should write
    (key -> ``Requesting_<now>``); empty when nothing needs writing.
    """

    reason: str | None = None
    stamps: dict[str, str] = field(default_factory=dict)

    @property
    def usable(self) -> bool:
        return self.reason is None


def allocatable_count(node: Mapping[str, Any], resource: str) -> int | None:
    """`status.allocatable[resource]` as an integer; None when absent or not a count."""
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if value is None:
        return None
    try:
        return to_count(value, resource=f"status.allocatable[{resource}]")
    except InvalidRequest:
        return None


def check_node(
    node: Mapping[str, Any],
    vendors: Iterable[Vendor],
    *,
    now: datetime,
    timeout_s: float = HANDSHAKE_TIMEOUT_S,
) -> NodeHealth:
    """Judge `node` for every vendor that registered cards on it (see the module docstring).

    `now` is the writer's local wall clock without zone, as HAMi writes handshakes (Go DateTime
    layout); stamps in the future count as fresh. Never raises: whatever the annotations hold, the
    answer is a verdict.
    """
    annos = A.pod_annotations(node)
    reasons: list[str] = []
    stamps: dict[str, str] = {}
    for vendor in vendors:
        if vendor.register_key not in annos:
            continue
        count_name = vendor.resource_names().count
        alloc = allocatable_count(node, count_name)
        if alloc == 0:
            reasons.append(
                f"kubelet advertises {count_name}: 0 (device plugin not running or every card unhealthy; "
                "check the device plugin pod on this node)"
            )
            continue
        key = vendor.handshake_key
        if key is None:
            continue
        value = annos.get(key)
        hs = A.decode_handshake(value) if value is not None else None
        if hs is None or A.HANDSHAKE_REQUESTING not in (value or "") or hs.time is None:
            # Absent, Reported_, a stale Deleted_ or unreadable: not a sign of death; ask again.
            stamps[key] = A.encode_handshake(A.HANDSHAKE_REQUESTING, now)
            continue
        age = (now - hs.time).total_seconds()
        if age > timeout_s and not alloc:
            reasons.append(
                f"device plugin did not answer {key}={value} for {int(age)} s and kubelet advertises no "
                f"{count_name} (check the device plugin pod on this node)"
            )
    return NodeHealth(reason="; ".join(reasons) if reasons else None, stamps=stamps)
