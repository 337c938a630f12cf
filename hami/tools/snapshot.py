"""One read-only view of the cluster, built into the same `ClusterState` the scheduler extender keeps.

Why a snapshot and not the extender's cache: the tools run on an operator's machine with the operator's
kubeconfig, once, so they list nodes, pods and quotas one time (no watch) and rebuild the state exactly
as the extender does after a relist (`ClusterState.rebuild`), with the same node liveness verdicts
(`hami.handshake.check_node`). The state is the tool's own copy: `hami explain` may run the real filter
on it (which reserves) and undo that, and nothing is ever written to the API server.

`read_objects` is the only function here that does I/O (three LISTs through `hami.kube`); `Snapshot.build`
is pure over the listed objects and a clock, which is what the tests and the docs' examples feed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hami import objects
from hami.config import DeviceConfig
from hami.handshake import HANDSHAKE_TIMEOUT_S, check_node
from hami.model import Device
from hami.nodelock import NODE_LOCK_EXPIRY_S

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Listed:
    """What one read of the API server gave: nodes, pods (all namespaces) and ResourceQuotas."""

    nodes: list[Obj]
    pods: list[Obj]
    quotas: list[Obj] = field(default_factory=list)


def read_objects(client: Any) -> Listed:
    """LIST nodes, pods of every namespace and ResourceQuotas through `client` (a `hami.kube.KubeClient`).

    Raises `hami.errors.ApiError` (status 401/403 for RBAC, None with reason ``Transport`` when the API
    server cannot be reached) as the client maps it.
    """
    return Listed(client.list_nodes(), client.list_pods(), client.list_resource_quotas())


@dataclass(slots=True)
class Snapshot:
    """The listed objects, the `ClusterState` built from them, and the clock the report is made at.

    `now` is timezone-aware (UTC); `health` holds each node's liveness verdict (None = usable);
    `devices` each node's registered cards per vendor CommonWord (as the state parsed them).
    """

    listed: Listed
    state: Any  # hami.cluster.ClusterState (imported lazily: the command's start-up stays light)
    now: datetime
    health: dict[str, str | None]
    devices: dict[str, dict[str, list[Device]]]
    #: Seconds after which the extender takes a node lock over (its --node-lock-timeout).
    lock_timeout_s: float = NODE_LOCK_EXPIRY_S

    @classmethod
    def build(
        cls,
        listed: Listed,
        *,
        config: DeviceConfig | None = None,
        now: datetime | None = None,
        scheduler_name: str | None = None,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        lock_timeout_s: float = NODE_LOCK_EXPIRY_S,
    ) -> Snapshot:
        """Rebuild the extender's state from `listed` at time `now` (default: the current time).

        Node liveness is judged as the extender does: a node whose handshake went unanswered, or whose
        kubelet advertises 0 devices, is marked unusable with the verdict as its reason.
        """
        from hami.cluster import ClusterState

        now = now or datetime.now(UTC)
        state = ClusterState(config, scheduler_name=scheduler_name)
        state.rebuild(listed.nodes, listed.pods, listed.quotas)
        # The handshake layout is the writer's wall clock without zone (HAMi): judge in local time.
        local = now.astimezone().replace(tzinfo=None)
        health: dict[str, str | None] = {}
        devices: dict[str, dict[str, list[Device]]] = {}
        for node in listed.nodes:
            name = objects.name(node)
            verdict = check_node(
                node, state.vendors.values(), now=local, timeout_s=handshake_timeout_s
            ).reason
            health[name] = verdict
            if verdict is not None and state.node_unusable_reason(name) is None:
                state.mark_node_unusable(name, verdict)
            devices[name] = _devices(state, node)
        return cls(listed, state, now, health, devices, lock_timeout_s)

    def node(self, name: str) -> Obj | None:
        return next((n for n in self.listed.nodes if objects.name(n) == name), None)

    def node_names(self) -> list[str]:
        return sorted(objects.name(n) for n in self.listed.nodes)

    def pod(self, namespace: str, name: str) -> Obj | None:
        return next(
            (p for p in self.listed.pods if objects.name(p) == name and objects.namespace(p) == namespace),
            None,
        )

    def pods_on(self, node: str) -> list[Obj]:
        """Pods the state counts on `node` (placed by our scheduler, not terminal), by namespace/name."""
        counted = {(ns, n) for ns, n, nd, _ in self.state.pod_grants() if nd == node}
        return sorted(
            (p for p in self.listed.pods if (objects.namespace(p), objects.name(p)) in counted),
            key=objects.ref,
        )


def _devices(state: Any, node: Mapping[str, Any]) -> dict[str, list[Device]]:
    out: dict[str, list[Device]] = {}
    for vendor in state.vendors.values():
        try:
            found = vendor.node_devices(node)
        except Exception:  # noqa: BLE001 - a malformed registration: the state already marked the node
            continue
        if found:
            out[vendor.common_word] = sorted(found, key=lambda d: d.index)
    return out


def unschedulable(node: Mapping[str, Any]) -> bool:
    """`spec.unschedulable` (``kubectl cordon``): kube-scheduler sends such a node to no extender."""
    spec = node.get("spec")
    return bool(isinstance(spec, dict) and spec.get("unschedulable"))


def pending_device_pods(snapshot: Snapshot) -> Iterable[Obj]:
    """Pods of our scheduler that are Pending, not yet placed, and ask for a managed device."""
    from hami import annotations as A

    want = snapshot.state.scheduler_name
    for p in snapshot.listed.pods:
        if objects.phase(p) not in (None, "Pending") or objects.node_name(p):
            continue
        if want and objects.scheduler_name(p) != want:
            continue
        if A.ASSIGNED_NODE in objects.annotations(p):
            continue
        try:
            if any(c.requests for c in snapshot.state.pod_requests(p)):
                yield p
        except ValueError:
            continue


def split_ref(ref: str, default_namespace: str) -> tuple[str, str]:
    """``ns/name`` or ``name`` (in `default_namespace`) -> (namespace, name)."""
    ns, sep, name = ref.partition("/")
    return (ns, name) if sep else (default_namespace, ref)


__all__: Sequence[str] = (
    "Listed",
    "Snapshot",
    "pending_device_pods",
    "read_objects",
    "split_ref",
    "unschedulable",
)
