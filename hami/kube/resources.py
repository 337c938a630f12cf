"""The resources the project reads and writes, their API paths, and the API's time formats.

One table (`RESOURCES`) maps a plural resource name to what the client needs to call it: the API
group, whether it is namespaced, its kind and apiVersion, and the snake-case singular the generated
client's method names use. Anything not in the table is refused with the valid names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hami.errors import InvalidRequest


@dataclass(frozen=True, slots=True)
class Res:
    """One resource: ``plural`` as in the URL, ``singular`` in snake case as in the client's methods,
    ``api`` "core", "coordination" or "policy"."""

    plural: str
    singular: str
    namespaced: bool
    api: str
    kind: str
    api_version: str


RESOURCES: dict[str, Res] = {
    r.plural: r
    for r in (
        Res("pods", "pod", True, "core", "Pod", "v1"),
        Res("nodes", "node", False, "core", "Node", "v1"),
        Res("events", "event", True, "core", "Event", "v1"),
        Res("resourcequotas", "resource_quota", True, "core", "ResourceQuota", "v1"),
        Res("namespaces", "namespace", False, "core", "Namespace", "v1"),
        Res("leases", "lease", True, "coordination", "Lease", "coordination.k8s.io/v1"),
        Res("configmaps", "config_map", True, "core", "ConfigMap", "v1"),
        Res(
            "poddisruptionbudgets",
            "pod_disruption_budget",
            True,
            "policy",
            "PodDisruptionBudget",
            "policy/v1",
        ),
    )
}


def resource(name: str) -> Res:
    """The table entry for plural `name`; raises InvalidRequest naming the valid resources."""
    try:
        return RESOURCES[name]
    except KeyError:
        raise InvalidRequest(f"resource {name!r}: want one of {sorted(RESOURCES)}") from None


def meta_of(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """The object's ``metadata`` ({} when absent)."""
    return obj.get("metadata") or {}


def ref(namespace: str | None, name: str, res: Res) -> str:
    """``namespace/name`` for namespaced resources, ``name`` otherwise (for messages)."""
    return f"{namespace or 'default'}/{name}" if res.namespaced else name


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)``; namespace is "" for cluster-scoped objects."""
    meta = meta_of(obj)
    return meta.get("namespace") or "", meta.get("name") or ""


def now_micro() -> str:
    """The current time as a Kubernetes ``MicroTime`` (``2026-11-29T12:00:00.123456Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    """The current time as a Kubernetes ``Time`` (``2026-11-29T12:00:00Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
