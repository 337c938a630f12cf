"""The resources the fake API server serves: names, scope, kinds, field labels, status subresource.

One table (`RESOURCES`) drives routing, discovery, field selectors and the status/main split.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """One served resource: its group/version, names, scope and the field labels it can select on."""

    group: str  # "" for core
    version: str
    plural: str
    kind: str
    namespaced: bool
    status_subresource: bool
    field_labels: frozenset[str]

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """``pods`` or ``leases.coordination.k8s.io`` (the form used in NotFound/Conflict messages)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``Pod`` or ``Lease.coordination.k8s.io`` (the form used in Invalid messages)."""
        return f"{self.kind}.{self.group}" if self.group else self.kind


_META = frozenset({"metadata.name", "metadata.namespace"})
RESOURCES: dict[str, ResourceInfo] = {
    r.plural: r
    for r in (
        ResourceInfo(
            "",
            "v1",
            "pods",
            "Pod",
            True,
            True,
            _META
            | {
                "spec.nodeName",
                "spec.schedulerName",
                "spec.restartPolicy",
                "spec.serviceAccountName",
                "spec.hostNetwork",
                "status.phase",
                "status.podIP",
                "status.nominatedNodeName",
            },
        ),
        ResourceInfo("", "v1", "nodes", "Node", False, True, _META | {"spec.unschedulable"}),
        ResourceInfo(
            "",
            "v1",
            "events",
            "Event",
            True,
            False,
            _META
            | {
                "involvedObject.kind",
                "involvedObject.namespace",
                "involvedObject.name",
                "involvedObject.uid",
                "involvedObject.apiVersion",
                "involvedObject.resourceVersion",
                "involvedObject.fieldPath",
                "reason",
                "reportingComponent",
                "source",
                "type",
            },
        ),
        ResourceInfo("", "v1", "resourcequotas", "ResourceQuota", True, True, _META),
        ResourceInfo("", "v1", "namespaces", "Namespace", False, True, _META | {"status.phase"}),
        ResourceInfo("coordination.k8s.io", "v1", "leases", "Lease", True, False, _META),
        ResourceInfo("", "v1", "configmaps", "ConfigMap", True, False, _META),
        ResourceInfo("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, True, _META),
        ResourceInfo(
            "admissionregistration.k8s.io",
            "v1",
            "mutatingwebhookconfigurations",
            "MutatingWebhookConfiguration",
            False,
            False,
            _META,
        ),
        ResourceInfo(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicies",
            "ValidatingAdmissionPolicy",
            False,
            True,
            _META,
        ),
        ResourceInfo(
            "admissionregistration.k8s.io",
            "v1",
            "validatingadmissionpolicybindings",
            "ValidatingAdmissionPolicyBinding",
            False,
            False,
            _META,
        ),
    )
}
BY_GROUP: dict[tuple[str, str], dict[str, ResourceInfo]] = {}
for _r in RESOURCES.values():
    BY_GROUP.setdefault((_r.group, _r.version), {})[_r.plural] = _r


def with_type(info: ResourceInfo, obj: dict[str, Any]) -> dict[str, Any]:
    """Objects are stored without kind/apiVersion (list items have none); single answers get them."""
    return {"kind": info.kind, "apiVersion": info.api_version, **obj}


def object_meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}
