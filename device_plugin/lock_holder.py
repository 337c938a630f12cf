"""Finding the pod kubelet's Allocate is for: the holder of this node's lock, validated against its
annotations; and the failure path that marks it failed and releases the lock (hami-legacy-spec §2.7).

Every doubt is a refusal naming pod and mismatch (see `device_plugin.allocator` for the full rules):
the lock must name an existing pod (a vanished owner's lock is released), bound here by our scheduler,
in bind-phase ``allocating`` with a bind-time, whose ``hami.io/vgpu-devices-to-allocate`` and
``hami.io/vgpu-devices-allocated`` match its containers one to one.

`LockHolder` is a mixin of `device_plugin.allocator.Allocator`, which holds the state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from device_plugin.devices import DeviceState
from device_plugin.errors import AllocationRefused, ApiUnavailable
from hami import annotations as ann
from hami import pods
from hami.errors import AnnotationError, HamiError, InvalidRequest
from hami.model import ContainerDevice
from hami.quantity import to_count

if TYPE_CHECKING:
    from device_plugin.allocator import AllocatorSettings, Kube

# The logger keeps the name it had before Allocate was split into parts: documented transcripts name it.
log = logging.getLogger("device_plugin.allocator")


@dataclass(frozen=True)
class PendingPod:
    """The pod being admitted, its decoded to-allocate list and container names (init first)."""

    pod: dict
    entries: list[list[ContainerDevice]]
    containers: list[dict]
    n_init: int = 0

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def uid(self) -> str:
        return self.pod["metadata"].get("uid", "")

    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


class LockHolder:
    """The lock holder's lookup and the refusal path of `device_plugin.allocator.Allocator` (a mixin)."""

    # Set up by `device_plugin.allocator.Allocator.__init__` (shared by all its parts).
    kube: Kube
    state: DeviceState
    settings: AllocatorSettings
    on_allocated: Callable[[], None]
    on_preferred_fallback: Callable[[str], None]
    on_card_mismatch: Callable[[], None]
    on_readmitted: Callable[[], None]
    _release_lock: Callable[..., bool]
    _init_ids: dict[str, set[str]]
    _readmitted: set[tuple[str, int]]

    async def _pending_pod(self, *, mutate: bool = True) -> PendingPod:
        """The pod named by this node's lock, validated. Raises AllocationRefused.

        With `mutate` (Allocate) a refusal also marks the pod failed and releases the lock; without it
        (GetPreferredAllocation) nothing is written.
        """
        s = self.settings

        async def fail(pod: dict, reason: str, message: str) -> AllocationRefused:
            return await self._fail(pod, reason, message) if mutate else AllocationRefused(reason, message)

        node = await self._call(self.kube.get_node, s.node_name)
        if node is None:
            raise AllocationRefused("node_missing", f"node {s.node_name} does not exist in the API server")
        value = ann.pod_annotations(node).get(ann.NODE_LOCK)
        hint = "only pods bound by the HAMi scheduler extender can use " + s.resource_name
        if not value:
            raise AllocationRefused(
                "no_lock", f"no pod holds the node lock {ann.NODE_LOCK} on node {s.node_name}; {hint}"
            )
        try:
            lock = ann.decode_node_lock(value)
        except AnnotationError as e:
            raise AllocationRefused("bad_lock", f"node {s.node_name}: {ann.NODE_LOCK}: {e}") from None
        if lock.namespace is None or lock.name is None:
            raise AllocationRefused(
                "bad_lock",
                f"node {s.node_name}: {ann.NODE_LOCK}={value!r} names no pod (legacy form); {hint}",
            )
        pod = await self._call(self.kube.get_pod, lock.namespace, lock.name)
        if pod is None:
            if mutate:
                await self._release(lock.namespace, lock.name)
            raise AllocationRefused(
                "lock_owner_gone",
                f"pod {lock.namespace}/{lock.name} holding the node lock on {s.node_name} no longer exists; "
                "released its lock",
            )
        ref = f"{lock.namespace}/{lock.name}"
        spec = pod.get("spec") or {}
        annos = ann.pod_annotations(pod)
        checks = [
            (spec.get("schedulerName") == s.scheduler_name, "foreign_scheduler",
             f"pod {ref} was scheduled by {spec.get('schedulerName')!r}, not {s.scheduler_name!r}; "
             "its HAMi annotations are not ours"),
            (spec.get("nodeName") == s.node_name, "not_bound_here",
             f"pod {ref} is bound to {spec.get('nodeName')!r}, not to this node {s.node_name}"),
            (annos.get(ann.ASSIGNED_NODE) == s.node_name, "not_bound_here",
             f"pod {ref} has {ann.ASSIGNED_NODE}={annos.get(ann.ASSIGNED_NODE)!r}, not {s.node_name!r}"),
            (annos.get(ann.BIND_PHASE) == ann.BindPhase.ALLOCATING.value, "wrong_phase",
             f"pod {ref} has {ann.BIND_PHASE}={annos.get(ann.BIND_PHASE)!r}, want "
             f"{ann.BindPhase.ALLOCATING.value!r}"),
            (bool(annos.get(ann.BIND_TIME)), "wrong_phase", f"pod {ref} has no {ann.BIND_TIME} annotation"),
            (ann.NVIDIA_TO_ALLOCATE in annos, "bad_annotation",
             f"pod {ref} has no {ann.NVIDIA_TO_ALLOCATE} annotation"),
        ]  # fmt: skip
        for ok, reason, message in checks:
            if not ok:
                raise await fail(pod, reason, message)
        try:
            entries = ann.decode_pod_devices(annos[ann.NVIDIA_TO_ALLOCATE])
        except AnnotationError as e:
            raise await fail(pod, "bad_annotation", f"pod {ref}: {ann.NVIDIA_TO_ALLOCATE}: {e}") from None
        containers = pods.containers(pod)  # device-list order: init first
        if len(entries) != len(containers):
            raise await fail(
                pod,
                "bad_annotation",
                f"pod {ref}: {ann.NVIDIA_TO_ALLOCATE} has {len(entries)} container entries but the pod has "
                f"{len(containers)} containers (init + app); cannot tell which entry is whose",
            )
        problem = self._record_problem(ref, annos, entries, containers)
        if problem:
            raise await fail(pod, "bad_annotation", problem)
        n_init = pods.init_count(pod)
        return PendingPod(pod=pod, entries=entries, containers=containers, n_init=n_init)

    def _record_problem(
        self, ref: str, annos: Mapping[str, str], entries: list[list[ContainerDevice]], containers: list[dict]
    ) -> str | None:
        """Why the record cannot be matched to the containers kubelet will ask for, or None.

        kubelet calls Allocate for each container that limits the resource, in container order, and the
        plugin serves the first unserved entry; that is only the right container when every container
        that limits the resource has either an open entry of its own or one already served (empty in
        to-allocate, present in ``hami.io/vgpu-devices-allocated``, which the plugin never changes),
        and no container without the limit has cards recorded. Otherwise a device container without a
        record would be handed the next container's cards and limits (QA finding), or the lock would
        wait for an Allocate that never comes.
        """
        resource = self.settings.resource_name
        value = annos.get(ann.NVIDIA_ALLOCATED)
        if value is None:
            return f"pod {ref} has no {ann.NVIDIA_ALLOCATED} annotation"
        try:
            recorded = ann.decode_pod_devices(value)
        except AnnotationError as e:
            return f"pod {ref}: {ann.NVIDIA_ALLOCATED}: {e}"
        if len(recorded) != len(containers):
            return (
                f"pod {ref}: {ann.NVIDIA_ALLOCATED} has {len(recorded)} container entries but the pod has "
                f"{len(containers)} containers (init + app)"
            )
        for ctr, entry, kept in zip(containers, entries, recorded, strict=True):
            name = ctr.get("name", "?")
            limit = ((ctr.get("resources") or {}).get("limits") or {}).get(resource)
            try:
                wants = 0 if limit is None else to_count(limit, resource=f"{resource} limit")
            except InvalidRequest as e:
                return f"pod {ref} container {name}: {e}"
            if wants and not entry and not kept:
                return (
                    f"pod {ref} container {name}: limits {resource}={limit} but the scheduler recorded no "
                    f"card for it in {ann.NVIDIA_TO_ALLOCATE}; refusing to guess whose cards it gets"
                )
            if not wants and entry:
                return (
                    f"pod {ref} container {name}: the scheduler recorded card(s) {[d.uuid for d in entry]} "
                    f"but the container does not limit {resource}, so kubelet will never allocate them"
                )
        return None

    # ----- failure handling

    async def _fail(self, pod: dict, reason: str, message: str) -> AllocationRefused:
        """Set bind-phase failed on `pod`, release the lock it holds here, and return the error to raise.

        The bind-phase is left alone when the pod is bound to another node or already ``success``: the
        lock on this node is stale then, and that pod's real allocation must not be marked failed.
        """
        meta = pod.get("metadata") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        self._init_ids.pop(meta.get("uid", ""), None)
        bound = (pod.get("spec") or {}).get("nodeName")
        phase = ann.pod_annotations(pod).get(ann.BIND_PHASE)
        if (not bound or bound == self.settings.node_name) and phase != ann.BindPhase.SUCCESS.value:
            try:
                await asyncio.to_thread(
                    self.kube.patch_pod_metadata,
                    ns,
                    name,
                    annotations={ann.BIND_PHASE: ann.BindPhase.FAILED.value},
                    uid=meta.get("uid") or None,
                )
            except Exception as e:  # noqa: BLE001 - the refusal itself matters more than this bookkeeping
                log.warning("could not set %s=failed on pod %s/%s: %s", ann.BIND_PHASE, ns, name, e)
        await self._release(ns, name)
        return AllocationRefused(reason, message)

    async def _release(self, namespace: str, name: str) -> None:
        try:
            released = await asyncio.to_thread(
                self._release_lock, self.kube, self.settings.node_name, namespace=namespace, pod_name=name
            )
        except Exception as e:  # noqa: BLE001 - it expires after 5 minutes anyway
            log.warning(
                "could not release node lock of %s/%s on %s: %s", namespace, name, self.settings.node_name, e
            )
            return
        if released:
            log.info("released node lock of %s/%s on %s", namespace, name, self.settings.node_name)

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return await asyncio.to_thread(fn, *args, **kwargs)
        except HamiError as e:
            raise ApiUnavailable("api_error", f"API server: {e}") from None
        except Exception as e:  # noqa: BLE001 - connection errors of the kubernetes client
            raise ApiUnavailable("api_error", f"API server: {type(e).__name__}: {e}") from None
