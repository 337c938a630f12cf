"""Finding the pod kubelet's Allocate is for: the holder of this node's lock, validated against its
annotations; and the failure path that marks it failed and releases the lock (hami-legacy-spec §2.7).

Every doubt is a refusal naming pod and mismatch (see `device_plugin.allocator` for the full rules):
the lock must name an existing pod (a vanished owner's lock is released), not finished, bound here by
our scheduler, in bind-phase ``allocating`` with a bind-time, whose ``hami.io/vgpu-devices-to-allocate``
and ``hami.io/vgpu-devices-allocated`` match its containers one to one and each other; where the
extender stamped the lock (``hami.io/mutex.lock-allocation``) the pod must be the UID it was taken for
and its allocation the one decided; and no other pod of ours may be between Bind and Allocate here.

`LockHolder` is a mixin of `device_plugin.allocator.Allocator`, which holds the state.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from device_plugin.allocation_types import AllocatorState, PendingPod
from device_plugin.errors import AllocationRefused, ApiUnavailable
from hami import annotations as ann
from hami import pods
from hami.errors import AnnotationError, HamiError, InvalidRequest
from hami.model import ContainerDevice
from hami.quantity import to_count

# The logger keeps the name it had before Allocate was split into parts: documented transcripts name it.
log = logging.getLogger("device_plugin.allocator")


class LockHolder(AllocatorState):
    """The lock holder's lookup and the refusal path of `device_plugin.allocator.Allocator` (a mixin)."""

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
        stamp_problem = self._stamp_problem(node, pod, ref, annos)
        if stamp_problem:
            raise await fail(pod, "not_decided", stamp_problem)
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or pods.is_terminal(pod):
            raise await fail(
                pod,
                "lock_owner_gone",
                f"pod {ref} holding the node lock on {s.node_name} is finished or being deleted",
            )
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
        other, node_pods = await self._other_pod_in_flight(pod)
        if other is not None:
            # Not `fail`: which of the two kubelet is admitting cannot be told, so neither is marked.
            raise AllocationRefused(
                "ambiguous",
                f"pods {ref} (holding the node lock) and {other} are both between Bind and Allocate on node "
                f"{s.node_name} (a lock taken over after its expiry); kubelet's request names no pod, so "
                "neither is served the other's cards or limits",
            )
        n_init = pods.init_count(pod)
        boot_id = str(((node.get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")
        return PendingPod(
            pod=pod,
            entries=entries,
            containers=containers,
            n_init=n_init,
            boot_id=boot_id,
            node_pods=node_pods,
        )

    def _stamp_problem(
        self, node: Mapping[str, Any], pod: dict, ref: str, annos: Mapping[str, str]
    ) -> str | None:
        """Why the lock holder is not the pod, or its allocation not the one, the lock was taken for.

        The extender writes ``hami.io/mutex.lock-allocation`` with the lock, on the Node (which pod
        owners cannot write): the pod's UID and the digest of the allocation it decided. A pod
        re-created under the holder's name, or an allocation its owner rewrote after Bind, differs.
        Without a stamp (HAMi's own scheduler writes none) the other checks and the spec's ceiling
        still apply.
        """
        value = ann.pod_annotations(node).get(ann.NODE_LOCK_ALLOCATION)
        if not value:
            return None
        try:
            stamp = ann.decode_allocation_stamp(value)
        except AnnotationError as e:
            return f"node {self.settings.node_name}: {ann.NODE_LOCK_ALLOCATION}: {e}"
        uid = (pod.get("metadata") or {}).get("uid", "")
        if stamp.uid != uid:
            return (
                f"the node lock on {self.settings.node_name} was taken for pod UID {stamp.uid}, but pod {ref} "
                f"is UID {uid} (deleted and created again under the same name?)"
            )
        if ann.NVIDIA_ALLOCATED in stamp.digests and not stamp.matches(
            ann.NVIDIA_ALLOCATED, annos.get(ann.NVIDIA_ALLOCATED)
        ):
            return (
                f"pod {ref}: {ann.NVIDIA_ALLOCATED}={annos.get(ann.NVIDIA_ALLOCATED)!r} is not what the scheduler "
                "decided for it (changed after Bind)"
            )
        if ann.MIG_ALLOCATIONS in stamp.digests:
            # The reservations name the MIG instance made (profile, placement); the runtime identity
            # this plugin adds to them is no change.
            value = annos.get(ann.MIG_ALLOCATIONS)
            try:
                decided = value is not None and stamp.matches(
                    ann.MIG_ALLOCATIONS, ann.mig_reservations(value)
                )
            except AnnotationError:
                decided = False
            if not decided:
                return (
                    f"pod {ref}: {ann.MIG_ALLOCATIONS}={value!r} is not what the scheduler decided for it "
                    "(changed after Bind)"
                )
        return None

    async def _other_pod_in_flight(self, holder: dict) -> tuple[str | None, frozenset[str]]:
        """Another pod of ours bound to this node with cards still to allocate (bind-phase allocating),
        or None, and the UIDs of the pods on this node. Only the lock serialises Allocate per node, and
        kubelet names no pod: with two such pods (the holder's lock taken over after its expiry,
        HAMi#3096) a request could be either's."""
        s = self.settings
        listed = await self._call(self.kube.list_pods, field_selector=f"spec.nodeName={s.node_name}")
        uid = (holder.get("metadata") or {}).get("uid")
        uids = frozenset(str((p.get("metadata") or {}).get("uid", "")) for p in listed) | {str(uid)}
        for p in listed:
            meta = p.get("metadata") or {}
            annos = ann.pod_annotations(p)
            if (
                meta.get("uid") == uid
                or meta.get("deletionTimestamp")
                or pods.is_terminal(p)
                or (p.get("spec") or {}).get("schedulerName") != s.scheduler_name
                or annos.get(ann.BIND_PHASE) != ann.BindPhase.ALLOCATING.value
            ):
                continue
            try:
                left = ann.decode_pod_devices(annos.get(ann.NVIDIA_TO_ALLOCATE, ""))
            except AnnotationError:
                continue
            if any(left):
                return f"{meta.get('namespace')}/{meta.get('name')}", uids
        return None, uids

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
            if entry and entry != kept:
                # The scheduler writes both lists alike; the plugin only empties served entries.
                return (
                    f"pod {ref} container {name}: its {ann.NVIDIA_TO_ALLOCATE} entry "
                    f"{ann.encode_container_devices(entry)!r} differs from {ann.NVIDIA_ALLOCATED} "
                    f"{ann.encode_container_devices(kept)!r}"
                )
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
