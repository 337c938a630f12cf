"""Typed views of the raw Kubernetes API objects the core reads, and tolerant accessors for them.

Why: the core receives pods, nodes and quotas as the API server's JSON (dicts), from watches, from the
extender's wire, from YAML files. Spelled out as ``TypedDict``s, the fields the code relies on are
visible in one place and a typo such as ``"resourceVersoin"`` is a type error rather than a silent
``None``. The accessors read an object the way the API server's decoder would have filled it in: an
absent or null member is empty (``{}``, ``[]``, ``""``), never an exception, so every caller stops
writing ``(obj.get("metadata") or {}).get(...)`` chains. They return the object's own members (no
copies): callers must not mutate what they get.

Only the fields some module of this project reads are declared; Kubernetes objects have many more
(see https://kubernetes.io/docs/reference/kubernetes-api/). Every TypedDict is ``total=False``
because the API omits empty members.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict, cast


class OwnerReference(TypedDict, total=False):
    """`metadata.ownerReferences[i]`."""

    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool


class ObjectMeta(TypedDict, total=False):
    """`metadata` of every object."""

    name: str
    generateName: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    annotations: dict[str, str]
    labels: dict[str, str]
    ownerReferences: list[OwnerReference]


class ResourceRequirements(TypedDict, total=False):
    """`resources` of a container: resource name -> quantity (a string, or a number from YAML)."""

    limits: dict[str, str | int | float]
    requests: dict[str, str | int | float]


class Container(TypedDict, total=False):
    """One entry of `spec.containers` or `spec.initContainers`.

    `restartPolicy: Always` on an init container makes it a native sidecar (Kubernetes 1.28+).
    """

    name: str
    image: str
    resources: ResourceRequirements
    restartPolicy: str
    env: list[dict[str, Any]]
    securityContext: dict[str, Any]


class PodSpec(TypedDict, total=False):
    containers: list[Container]
    initContainers: list[Container]
    schedulerName: str
    nodeName: str
    runtimeClassName: str


class ContainerStatus(TypedDict, total=False):
    """`status.initContainerStatuses[i]` / `containerStatuses[i]`; `state` holds one of
    ``waiting``, ``running``, ``terminated`` (the last with an ``exitCode``)."""

    name: str
    state: dict[str, dict[str, Any]]


class PodStatus(TypedDict, total=False):
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    initContainerStatuses: list[ContainerStatus]
    containerStatuses: list[ContainerStatus]


class Pod(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: PodSpec
    status: PodStatus


class NodeStatus(TypedDict, total=False):
    allocatable: dict[str, str]
    capacity: dict[str, str]


class Node(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: ObjectMeta
    status: NodeStatus


class ResourceQuotaSpec(TypedDict, total=False):
    hard: dict[str, str | int | float]


class ResourceQuota(TypedDict, total=False):
    metadata: ObjectMeta
    spec: ResourceQuotaSpec


_EMPTY: dict[str, Any] = {}


def _member(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else _EMPTY


def _text(value: Any) -> str | None:
    # The API server only sends strings here; anything else (a hand-written body, a test fake) reads
    # as absent rather than reaching a dict key or a message as a list.
    return value if isinstance(value, str) else None


def meta(obj: Mapping[str, Any]) -> ObjectMeta:
    """`metadata`, or an empty mapping when absent, null or not a mapping."""
    return cast(ObjectMeta, _member(obj, "metadata"))


def spec(obj: Mapping[str, Any]) -> PodSpec:
    """`spec` of a pod, empty when absent."""
    return cast(PodSpec, _member(obj, "spec"))


def status(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`status`, empty when absent (a `PodStatus` or `NodeStatus` by the object's kind)."""
    return _member(obj, "status")


def quota_hard(quota: Mapping[str, Any]) -> Mapping[str, Any]:
    """`spec.hard` of a ResourceQuota (resource name -> quantity), empty when absent."""
    value = _member(quota, "spec").get("hard")
    return value if isinstance(value, dict) else _EMPTY


def name(obj: Mapping[str, Any]) -> str:
    """`metadata.name`, ``""`` when absent or not a string."""
    return _text(meta(obj).get("name")) or ""


def namespace(obj: Mapping[str, Any], default: str = "default") -> str:
    """`metadata.namespace`, `default` when absent or not a string (as the API server defaults it for
    namespaced kinds)."""
    return _text(meta(obj).get("namespace")) or default


def uid(obj: Mapping[str, Any]) -> str:
    """`metadata.uid`, ``""`` when absent or not a string."""
    return _text(meta(obj).get("uid")) or ""


def annotations(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """`metadata.annotations` (the object's own mapping, read-only), empty when absent."""
    value = meta(obj).get("annotations")
    return value if isinstance(value, dict) else _EMPTY


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """`metadata.labels` (the object's own mapping, read-only), empty when absent."""
    value = meta(obj).get("labels")
    return value if isinstance(value, dict) else _EMPTY


def owner_refs(obj: Mapping[str, Any]) -> list[OwnerReference]:
    """`metadata.ownerReferences`, ``[]`` when absent."""
    value = meta(obj).get("ownerReferences")
    return value if isinstance(value, list) else []


def ref(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` for messages and logs (``default`` namespace when absent)."""
    return f"{namespace(obj)}/{name(obj)}"


def phase(pod: Mapping[str, Any]) -> str | None:
    """`status.phase` of a pod, None when not reported yet (or not a string)."""
    return _text(status(pod).get("phase"))


def scheduler_name(pod: Mapping[str, Any]) -> str | None:
    """`spec.schedulerName` of a pod, None when absent (or not a string)."""
    return _text(spec(pod).get("schedulerName"))


def node_name(pod: Mapping[str, Any]) -> str | None:
    """`spec.nodeName` of a pod (set by the binding), None when not bound (or not a string)."""
    return _text(spec(pod).get("nodeName"))
