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
assignment in its checkpoint). No lock is held then. Such a request is answered only from the plugin's
own record of what it served (`device_plugin.served`, host files no container mounts), never from pod
annotations, and only when the reboot is proven: the node's boot ID differs from the one recorded
when the container was served. Each container is served again once per boot; every device pod on the
node must have a record (a pod the plugin never served could be the one kubelet asks for); the
container whose recorded cards are the cards of kubelet's ids is chosen, else the only candidate of
that device count, and candidates that differ in cards or limits are refused rather than guessed
between. Nothing is written to the pods.

`Allocator` is assembled from its parts: `device_plugin.lock_holder` (finding and validating the lock
holder, the refusal path), `device_plugin.recorded_cards` (kubelet's ids against the recorded cards,
the ids preferred on them, reboot re-admission) and `device_plugin.allocate_response` (env and
mounts), over the names they share in `device_plugin.allocation_types` (settings, the API calls, the
pending pod); this module keeps the GetPreferredAllocation and Allocate loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from device_plugin.allocate_response import (
    CTR_PRELOAD,
    ENV_CORE_POLICY,
    ENV_DISABLE_CONTROL,
    ENV_LOG_LEVEL,
    ENV_MEMORY_LIMIT,
    ENV_OVERSUBSCRIBE,
    ENV_SHARED_CACHE,
    ENV_SM_LIMIT,
    ENV_VISIBLE,
    ResponseBuilder,
)
from device_plugin.allocation_types import AllocatorSettings, Kube, PendingPod
from device_plugin.api import api_pb2 as pb
from device_plugin.devices import DeviceState
from device_plugin.errors import AllocationRefused
from device_plugin.lock_holder import LockHolder
from device_plugin.recorded_cards import CARD_MISMATCH_REASON, EVENT_COMPONENT, VENDOR, RecordedCards
from hami import annotations as ann
from hami.model import ContainerDevice

__all__ = [
    "CARD_MISMATCH_REASON",
    "CTR_PRELOAD",
    "ENV_CORE_POLICY",
    "ENV_DISABLE_CONTROL",
    "ENV_LOG_LEVEL",
    "ENV_MEMORY_LIMIT",
    "ENV_OVERSUBSCRIBE",
    "ENV_SHARED_CACHE",
    "ENV_SM_LIMIT",
    "ENV_VISIBLE",
    "EVENT_COMPONENT",
    "VENDOR",
    "Allocator",
    "AllocatorSettings",
    "Kube",
    "PendingPod",
]

log = logging.getLogger(__name__)


class Allocator(RecordedCards, LockHolder, ResponseBuilder):
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
        mode_responder: Any = None,
    ) -> None:
        self.mode_responder = mode_responder  # mig / mps mode (device_plugin.mig, device_plugin.mps)
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
            served: list[tuple[int, str, list[ContainerDevice]]] = []
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
                served.append((idx, pending.containers[idx].get("name", ""), entries[idx]))
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
            # What was served, for a repeated Allocate after a reboot (device_plugin.served).
            await self._remember_served(pending, served)
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
