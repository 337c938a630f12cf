"""Allocate and GetPreferredAllocation from the scheduler's pod annotations (hami-legacy-spec §2.7, §2.8, §3.4).

kubelet's Allocate names only virtual device ids, never the pod. The scheduler extender therefore holds
the node lock (``hami.io/mutex.lock`` = ``<time>,<ns>,<name>``) from Bind until the plugin has served the
pod's last container, and the plugin serves exactly the pod that lock names. HAMi falls back to "a
pending pod on this node" and accepts forged annotations from pods of other schedulers (user bug log
D01, W05); here every doubt is a refusal with a message naming pod, container and mismatch:

- the lock must exist, name a pod, and that pod must exist (a vanished owner's lock is released);
- the pod must be bound to this node (``spec.nodeName`` and ``hami.io/vgpu-node``), scheduled by our
  scheduler name, in bind-phase ``allocating`` with a ``hami.io/bind-time``;
- ``hami.io/vgpu-devices-to-allocate`` must have one entry per container (init first), every container
  that limits the resource must have cards recorded (open, or already served as shown by
  ``hami.io/vgpu-devices-allocated``) and no other container may have any; then the next non-empty
  entry is this container's; kubelet's device count must equal its recorded cards, the
  container's limit must agree, every card must be one of ours, and kubelet's virtual ids must sit on
  the recorded cards (GetPreferredAllocation steers kubelet there). When kubelet picked ids on other
  cards anyway, say because its Topology Manager insisted, the container still gets the recorded cards:
  the annotation is what the scheduler accounted, and serving kubelet's card instead would put the
  container on a card the scheduler believes has room for someone else (in HAMi the container ran on
  another card than recorded). kubelet's per-id bookkeeping then differs from the card in use, so the
  plugin says so with a Warning event on the pod and a metric. A recorded card that turned unhealthy
  is still refused.

After a container is served its entry is emptied in to-allocate; after the last one the pod gets
bind-phase ``success`` and the lock is released. Any refusal sets bind-phase ``failed`` (when the pod
exists) and releases the lock (owner-checked), so the node is free for the next pod at once.

After a node reboot kubelet may call Allocate again for containers it had admitted before (it found no
assignment in its checkpoint). No lock is held then; the containers belong to pods that are Running,
in bind-phase ``success``, with every entry of to-allocate served. Such a request is answered from the
pod's ``hami.io/vgpu-devices-allocated`` (which the plugin never changes), without writing anything:
the container whose recorded cards are the cards of kubelet's ids, else the only candidate of that
device count. Candidates that differ in cards or limits are refused rather than guessed between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid as uuidlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from device_plugin import vgpu_config
from device_plugin.api import api_pb2 as pb
from device_plugin.devices import DeviceState
from device_plugin.errors import AllocationRefused, ApiUnavailable
from hami import annotations as ann
from hami import pods
from hami.errors import AnnotationError, HamiError, InvalidRequest
from hami.model import ContainerDevice
from hami.quantity import to_count
from hami.vendors.nvidia import control_disabled

log = logging.getLogger(__name__)

VENDOR = "NVIDIA"  # CommonWord of the entries we consume in hami.io/vgpu-devices-to-allocate

EVENT_COMPONENT = "hami-device-plugin"  # source.component of the plugin's events
CARD_MISMATCH_REASON = "CardMismatch"  # Warning event: kubelet's ids on other cards than recorded

# Env names HAMi-core reads (hami-legacy-spec §3.4).
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT_{i}"  # "<MiB>m" per device position in the container
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"  # percent of SMs; 0 = no core limit
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"  # the usage file libvgpu writes, read by the monitor
ENV_OVERSUBSCRIBE = "CUDA_OVERSUBSCRIBE"  # "true" when deviceMemoryScaling > 1
ENV_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"  # "disable" when disableCoreLimit
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"  # container opt-out, read from the pod spec by value

# Container-side paths (HAMi-core's expectations).
CTR_PRELOAD = "/etc/ld.so.preload"
CTR_LOCK_DIR = "/tmp/vgpulock"


class Kube(Protocol):
    """The part of `hami.kube.KubeClient` the allocator uses (sync; called through asyncio.to_thread)."""

    def get_node(self, name: str) -> dict | None: ...
    def get_pod(self, namespace: str, name: str) -> dict | None: ...
    def list_pods(self, *, field_selector: str | None = None) -> list[dict]: ...
    def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str,
        component: str,
        host: str | None,
    ) -> dict | None: ...
    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: dict[str, str | None] | None = None,
        uid: str | None = None,
    ) -> dict: ...


@dataclass(frozen=True)
class AllocatorSettings:
    """What Allocate needs besides the pod.

    `hook_path` is HAMi's HOOK_PATH (``/usr/local``): libvgpu lives in ``<hook_path>/vgpu`` on the host and
    in the container; `lock_dir` the host directory mounted at /tmp/vgpulock.
    """

    node_name: str
    scheduler_name: str = "hami-scheduler"
    resource_name: str = "nvidia.com/gpu"
    hook_path: str = "/usr/local"
    lock_dir: str = "/tmp/vgpulock"
    memory_scaling: float = 1.0
    lib_cuda_log_level: str = "1"
    disable_core_limit: bool = False

    @property
    def vgpu_dir(self) -> Path:
        return Path(self.hook_path) / "vgpu"


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


class Allocator:
    """The production `AllocationPolicy`: serves the pod holding this node's lock. Calls are serialised."""

    def __init__(
        self,
        kube: Kube,
        state: DeviceState,
        settings: AllocatorSettings,
        *,
        release_lock: Callable[..., bool] | None = None,
        on_allocated: Callable[[], None] | None = None,
        on_preferred_fallback: Callable[[str], None] | None = None,
        on_card_mismatch: Callable[[], None] | None = None,
        on_readmitted: Callable[[], None] | None = None,
    ) -> None:
        self.kube = kube
        self.state = state
        self.settings = settings
        if release_lock is None:
            from hami.nodelock import release_node_lock as release_lock
        self._release_lock = release_lock
        self.on_allocated = on_allocated or (lambda: None)
        self.on_preferred_fallback = on_preferred_fallback or (lambda reason: None)
        self.on_card_mismatch = on_card_mismatch or (lambda: None)
        self.on_readmitted = on_readmitted or (lambda: None)
        self._lock = asyncio.Lock()
        # pod uid -> device ids served to its init containers (kubelet may reuse them for later containers);
        # dropped when the pod's last container is served.
        self._init_ids: dict[str, set[str]] = {}
        # (pod uid, container position) served again after a restart by this process: kubelet asks once
        # per container, so a served one is no candidate for the next request.
        self._readmitted: set[tuple[str, int]] = set()

    # ----- finding the pod

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

    # ----- GetPreferredAllocation

    async def preferred(self, requests: Sequence[pb.ContainerPreferredAllocationRequest]) -> list[list[str]]:
        """For request k, replicas of the cards recorded for the pod's k-th unserved container.

        Read-only; any problem gives that request no preference (kubelet then picks alone, and Allocate
        reports the problem with its full reason).
        """
        async with self._lock:
            try:
                pending = await self._pending_pod(mutate=False)
            except AllocationRefused as e:
                if e.reason == "no_lock":
                    with contextlib.suppress(AllocationRefused):
                        return await self._readmission_preference(requests)
                self.on_preferred_fallback(e.reason)
                log.info("no preferred allocation: %s", e.message)
                return [[] for _ in requests]
        open_entries = [e for e in pending.entries if e]
        out = []
        for k, req in enumerate(requests):
            if k >= len(open_entries):
                self.on_preferred_fallback("no_entry")
                out.append([])
                continue
            out.append(self._prefer(req, open_entries[k]))
        return out

    def _prefer(self, req: pb.ContainerPreferredAllocationRequest, entry: list[ContainerDevice]) -> list[str]:
        available = set(req.available_deviceIDs)
        chosen: list[str] = [d for d in req.must_include_deviceIDs]
        covered = Counter(self.state.card_of(d) for d in chosen)
        for dev in entry:
            if covered[dev.uuid] > 0:
                covered[dev.uuid] -= 1
                continue
            for rid in self.state.replicas(dev.uuid):
                if rid in available and rid not in chosen:
                    chosen.append(rid)
                    break
            else:
                self.on_preferred_fallback("card_unavailable")
                log.info("no free replica of card %s among kubelet's candidates", dev.uuid)
        return chosen[: max(req.allocation_size, len(req.must_include_deviceIDs))]

    # ----- Allocate

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[pb.ContainerAllocateResponse]:
        """Serve kubelet's container requests (each a list of virtual device ids) for the lock holder.

        Returns one response per request, in order: env (limits in MiB ``<n>m``, SM percent) and mounts
        (hami-legacy-spec §3.4). Consumed entries are emptied in ``hami.io/vgpu-devices-to-allocate``;
        after the pod's last one, bind-phase ``success`` and the lock is released. Raises
        AllocationRefused (reason + message naming pod, container and mismatch) after setting
        bind-phase ``failed`` and releasing the lock; ApiUnavailable when the API server failed.
        """
        async with self._lock:
            try:
                pending = await self._pending_pod()
            except AllocationRefused as e:
                if e.reason != "no_lock":
                    raise
                return await self._readmit(requests, e)
            entries = [list(e) for e in pending.entries]
            responses = []
            for ids in requests:
                idx = next((i for i, e in enumerate(entries) if e), None)
                if idx is None:
                    raise await self._fail(
                        pending.pod,
                        "no_entry",
                        f"pod {pending.ref()}: kubelet asked for {len(ids)} device(s) {list(ids)} but every entry "
                        f"of {ann.NVIDIA_TO_ALLOCATE} is already served",
                    )
                responses.append(await self._serve_container(pending, idx, entries[idx], list(ids)))
                entries[idx] = []
            done = not any(entries)
            patch: dict[str, str | None] = {ann.NVIDIA_TO_ALLOCATE: ann.encode_pod_devices(entries)}
            if done:
                patch[ann.BIND_PHASE] = ann.BindPhase.SUCCESS.value
            try:
                # uid: the patch must not land on a re-created pod of the same name.
                await self._call(
                    self.kube.patch_pod_metadata,
                    pending.namespace,
                    pending.name,
                    annotations=patch,
                    uid=pending.uid,
                )
            except AllocationRefused as e:
                raise await self._fail(pending.pod, e.reason, e.message) from None
            if done:
                self._init_ids.pop(pending.uid, None)
                await self._release(pending.namespace, pending.name)
            for _ in responses:
                self.on_allocated()
            log.info(
                "allocated pod %s containers %s%s",
                pending.ref(),
                [dict(r.envs).get(ENV_VISIBLE) for r in responses],
                "; all containers served, lock released" if done else "",
            )
            return responses

    # ----- Allocate again after a node reboot

    async def _running_pods(self) -> list[PendingPod]:
        """Pods on this node whose allocation is complete: ours, bound here, bind-phase ``success``,
        Running, every entry of to-allocate served; `entries` are their recorded (allocated) cards."""
        s = self.settings
        listed = await self._call(self.kube.list_pods, field_selector=f"spec.nodeName={s.node_name}")
        out = []
        for pod in listed:
            spec, annos = pod.get("spec") or {}, ann.pod_annotations(pod)
            if not (
                spec.get("schedulerName") == s.scheduler_name
                and spec.get("nodeName") == s.node_name
                and annos.get(ann.ASSIGNED_NODE) == s.node_name
                and annos.get(ann.BIND_PHASE) == ann.BindPhase.SUCCESS.value
                and (pod.get("status") or {}).get("phase") == "Running"
                and ann.NVIDIA_TO_ALLOCATE in annos
                and ann.NVIDIA_ALLOCATED in annos
            ):
                continue
            try:
                left = ann.decode_pod_devices(annos[ann.NVIDIA_TO_ALLOCATE])
                recorded = ann.decode_pod_devices(annos[ann.NVIDIA_ALLOCATED])
            except AnnotationError:
                continue
            containers = pods.containers(pod)
            ref = f"{pod['metadata'].get('namespace')}/{pod['metadata'].get('name')}"
            if any(left) or len(recorded) != len(containers):
                continue
            if self._record_problem(ref, annos, [[] for _ in containers], containers) is not None:
                continue
            out.append(
                PendingPod(pod=pod, entries=recorded, containers=containers, n_init=pods.init_count(pod))
            )
        out.sort(key=lambda p: (p.namespace, p.name))
        return out

    def _readmission_choice(
        self, running: list[PendingPod], ids: Sequence[str] | None, size: int
    ) -> tuple[PendingPod, int] | str:
        """The container a request of `size` devices (kubelet's `ids`, None for a preference) is for, or
        why none can be chosen. Prefers the containers whose recorded cards are the cards of `ids`."""
        options = [
            (p, i)
            for p in running
            for i, e in enumerate(p.entries)
            if e and len(e) == size and (p.uid, i) not in self._readmitted
        ]
        if not options:
            return f"no Running pod on node {self.settings.node_name} has a container of {size} card(s) to serve again"
        pool = options
        if ids is not None:
            cards = Counter(self.state.card_of(i) for i in ids)
            pool = [(p, i) for p, i in options if Counter(d.uuid for d in p.entries[i]) == cards] or options

        def key(o: tuple[PendingPod, int]) -> tuple:
            p, i = o
            return (
                *((d.uuid, d.usedmem, d.usedcores) for d in p.entries[i]),
                control_disabled(p.containers[i]),
            )

        if len({key(o) for o in pool}) > 1:
            names = "; ".join(
                f"{p.ref()} container {p.containers[i].get('name', i)} ("
                + ", ".join(f"{d.uuid} {d.usedmem} MiB {d.usedcores} %" for d in p.entries[i])
                + ")"
                for p, i in pool
            )
            return f"containers of Running pods that differ in cards or limits could each be the one: {names}"
        # Equal candidates get equal cards and limits, so taking the first is as good as knowing.
        return pool[0]

    async def _readmission_preference(
        self, requests: Sequence[pb.ContainerPreferredAllocationRequest]
    ) -> list[list[str]]:
        """Preferences for a request with no lock held: the cards of the container it is unambiguously
        for (see `_readmit`). Raises AllocationRefused when a request has no such container."""
        running = await self._running_pods()
        out = []
        for req in requests:
            choice = self._readmission_choice(running, None, req.allocation_size)
            if isinstance(choice, str):
                raise AllocationRefused("no_entry", choice)
            p, i = choice
            out.append(self._prefer(req, p.entries[i]))
        return out

    async def _readmit(
        self, requests: Sequence[Sequence[str]], no_lock: AllocationRefused
    ) -> list[pb.ContainerAllocateResponse]:
        """kubelet asks again for containers admitted before a node reboot: answer from their records.

        Nothing is written (the pods run; their annotations stay as they are). Raises `no_lock`'s
        refusal, completed by why no running container matches, without marking any pod failed.
        """
        running = await self._running_pods()
        responses = []
        chosen: list[tuple[str, int]] = []
        for ids in requests:
            ids = list(ids)
            physical = [self.state.card_of(i) for i in ids]
            if None in physical:
                bad = [i for i, c in zip(ids, physical, strict=True) if c is None]
                raise AllocationRefused(
                    "unknown_device", f"kubelet's device id(s) {bad} are not advertised by this plugin"
                )
            choice = self._readmission_choice(running, ids, len(ids))
            if isinstance(choice, str):
                raise AllocationRefused(no_lock.reason, f"{no_lock.message}; {choice}")
            pending, idx = choice
            entry = pending.entries[idx]
            ctr = pending.containers[idx]
            recorded = [d.uuid for d in entry]

            where = f"pod {pending.ref()} container {ctr.get('name', '?')}"

            async def refuse(reason: str, message: str, where: str = where) -> AllocationRefused:
                return AllocationRefused(
                    reason, f"{where}: {message}"
                )  # a running pod is never marked failed

            sick = [
                u
                for u in dict.fromkeys(recorded)
                if self.state.card(u) is None or not self.state.card(u).healthy
            ]
            if sick:
                raise await refuse(
                    "unhealthy_card", f"recorded card(s) {sick} are missing or unhealthy on this node"
                )
            if Counter(physical) != Counter(recorded):
                await self._card_mismatch(pending.pod, ctr.get("name", "?"), ids, physical, recorded)
            responses.append(await self._respond(pending, ctr, entry, refuse))
            self._readmitted.add((pending.uid, idx))
            chosen.append((pending.ref(), ctr.get("name", "?")))
        for ref, name in chosen:
            self.on_allocated()
            self.on_readmitted()
            log.info(
                "pod %s container %s served again from its recorded cards (no lock held: node restart)",
                ref,
                name,
            )
        return responses

    async def _serve_container(
        self, pending: PendingPod, idx: int, entry: list[ContainerDevice], ids: list[str]
    ) -> pb.ContainerAllocateResponse:
        s = self.settings
        ctr = pending.containers[idx]
        name = ctr.get("name", f"#{idx}")
        where = f"pod {pending.ref()} container {name}"
        recorded = [d.uuid for d in entry]

        async def refuse(reason: str, message: str) -> AllocationRefused:
            return await self._fail(pending.pod, reason, f"{where}: {message}")

        if any(d.type != VENDOR for d in entry):
            raise await refuse(
                "bad_annotation", f"entry {idx} has device types {[d.type for d in entry]}, want {VENDOR}"
            )
        if len(ids) != len(entry):
            raise await refuse(
                "count_mismatch",
                f"kubelet asked for {len(ids)} device(s) {ids} but the scheduler recorded {len(entry)} card(s) "
                f"{recorded}",
            )
        limit = ((ctr.get("resources") or {}).get("limits") or {}).get(s.resource_name)
        if limit is None or str(limit) != str(len(entry)):
            raise await refuse(
                "count_mismatch",
                f"the container limits {s.resource_name}={limit!r} but the scheduler recorded {len(entry)} card(s) "
                f"{recorded}",
            )
        unknown = [u for u in recorded if self.state.card(u) is None]
        if unknown:
            raise await refuse(
                "unknown_card", f"recorded card(s) {unknown} are not cards of node {s.node_name}"
            )
        physical = [self.state.card_of(i) for i in ids]
        if None in physical:
            bad = [i for i, p in zip(ids, physical, strict=True) if p is None]
            raise await refuse(
                "unknown_device", f"kubelet's device id(s) {bad} are not advertised by this plugin"
            )
        # kubelet hands devices freed by earlier init containers of the same pod to the next containers
        # without asking for a preference; those may sit on other cards than this container's record.
        # That is kubelet's bookkeeping only (the container gets the recorded cards through
        # NVIDIA_VISIBLE_DEVICES), so only ids that are neither on a recorded card nor such reuse count.
        left = Counter(recorded)
        stray = []
        for dev_id, card in zip(ids, physical, strict=True):
            if left[card] > 0:
                left[card] -= 1
            else:
                stray.append(dev_id)
        reused = self._init_ids.get(pending.uid, set())
        if stray and not set(stray) <= reused:
            sick = [u for u in dict.fromkeys(recorded) if not self.state.card(u).healthy]
            if sick:
                # kubelet only offers healthy devices, so it had to pick elsewhere: say why.
                raise await refuse(
                    "unhealthy_card",
                    f"the scheduler recorded card(s) {recorded} but {sick} became unhealthy on node "
                    f"{s.node_name} after scheduling, so kubelet gave devices {ids} on other cards",
                )
            await self._card_mismatch(pending.pod, name, ids, physical, recorded)
        if idx < pending.n_init:
            self._init_ids.setdefault(pending.uid, set()).update(ids)
        return await self._respond(pending, ctr, entry, refuse)

    async def _card_mismatch(
        self,
        pod: dict,
        container: str,
        ids: Sequence[str],
        physical: Sequence[str | None],
        recorded: list[str],
    ) -> None:
        """kubelet's ids sit on other cards than recorded: count it, log it and tell the pod's owner."""
        self.on_card_mismatch()
        message = (
            f"container {container}: kubelet's devices {list(ids)} are on card(s) {sorted(set(physical))} but the "
            f"scheduler recorded {recorded}; the container gets the recorded card(s), which the scheduler "
            "accounted. kubelet did not follow the preferred allocation (its Topology Manager, for example), "
            "so what kubelet reports for this container differs from the card(s) it uses"
        )
        log.warning("pod %s/%s %s", pod["metadata"].get("namespace"), pod["metadata"].get("name"), message)
        try:
            await asyncio.to_thread(
                self.kube.create_event,
                pod,
                reason=CARD_MISMATCH_REASON,
                message=message,
                type="Warning",
                component=EVENT_COMPONENT,
                host=self.settings.node_name,
            )
        except Exception as e:  # noqa: BLE001 - an event is best effort; the allocation stands
            log.warning("could not record the %s event: %s", CARD_MISMATCH_REASON, e)

    async def _respond(
        self,
        pending: PendingPod,
        ctr: dict,
        entry: list[ContainerDevice],
        refuse: Callable[[str, str], Any],
    ) -> pb.ContainerAllocateResponse:
        """The response for `entry`'s cards: env (limits, shared cache) and mounts (libvgpu, dirs).

        `refuse(reason, message)` is awaited to build the error raised when the host is not ready.
        """
        s = self.settings
        name = ctr.get("name", "?")
        recorded = [d.uuid for d in entry]
        lib = s.vgpu_dir / "libvgpu.so"
        preload = s.vgpu_dir / "ld.so.preload"
        control = not control_disabled(ctr)
        missing = [str(p) for p in ((lib, preload) if control else (lib,)) if not p.is_file()]
        if missing:
            raise await refuse(
                "libvgpu_missing",
                f"{', '.join(missing)} missing on node {s.node_name}; the device plugin DaemonSet installs them",
            )
        try:
            cache_dir = await asyncio.to_thread(self._prepare_dirs, pending.uid, name)
        except OSError as e:
            raise await refuse("host_dir", f"cannot prepare host directories: {e}") from None

        envs = {ENV_VISIBLE: ",".join(recorded)}
        for i, dev in enumerate(entry):
            envs[ENV_MEMORY_LIMIT.format(i=i)] = f"{dev.usedmem}m"
        envs[ENV_SM_LIMIT] = str(entry[0].usedcores)
        envs[ENV_SHARED_CACHE] = f"{s.vgpu_dir}/{uuidlib.uuid4()}.cache"
        if s.memory_scaling > 1:
            envs[ENV_OVERSUBSCRIBE] = "true"
        if s.lib_cuda_log_level:
            envs[ENV_LOG_LEVEL] = s.lib_cuda_log_level
        if s.disable_core_limit:
            envs[ENV_CORE_POLICY] = "disable"
        # libvgpu's read-only config file (limits for processes with a scrubbed environment) and the
        # node-wide per-card regions (fair sharing between the card's containers): vgpu_config.py
        envs[vgpu_config.ENV_CARD_DIR] = str(vgpu_config.card_dir(s.vgpu_dir))
        try:
            extra = await asyncio.to_thread(vgpu_config.prepare, s.vgpu_dir, cache_dir, envs, recorded, ctr)
        except (OSError, vgpu_config.ConfigFileError) as e:
            raise await refuse(
                "host_dir", f"cannot write the libvgpu config file or card regions: {e}"
            ) from None
        mounts = [
            pb.Mount(container_path=str(lib), host_path=str(lib), read_only=True),
            pb.Mount(container_path=str(s.vgpu_dir), host_path=str(cache_dir), read_only=False),
            pb.Mount(container_path=CTR_LOCK_DIR, host_path=s.lock_dir, read_only=False),
        ]
        if control:
            mounts.append(pb.Mount(container_path=CTR_PRELOAD, host_path=str(preload), read_only=True))
        mounts += [pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                   for m in extra]  # fmt: skip
        return pb.ContainerAllocateResponse(envs=envs, mounts=mounts)

    def _prepare_dirs(self, pod_uid: str, container: str) -> Path:
        """Fresh ``<hook>/vgpu/containers/<podUID>_<ctr>`` (0777) and the lock dir (0777) on the host."""
        s = self.settings
        cache_dir = s.vgpu_dir / "containers" / f"{pod_uid}_{container}"
        shutil.rmtree(cache_dir, ignore_errors=True)  # a stale cache file would carry another run's usage
        cache_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(cache_dir, 0o777)  # noqa: S103 - any container user must be able to write its cache
        Path(s.lock_dir).mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(PermissionError):
            os.chmod(s.lock_dir, 0o777)  # noqa: S103
        return cache_dir

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
