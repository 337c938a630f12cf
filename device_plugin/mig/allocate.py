"""Allocate in `mig` mode: the container's reserved MIG instances made (or found) at exactly their
placements, their runtime identity recorded on the pod, and the MIG devices handed to the container.

For container k of the pod (device-list order, init containers first) the reservations are the
entries of ``hami.io/vgpu-mig-allocations`` with ``containerIndex`` k, by ``deviceIndex``; there must be
one per device the scheduler recorded for it, on the same cards. Before creating anything, one
reconciliation round frees the instances of pods that are gone (HAMi does the same), under the same
lock as the rounds. Each reservation is realised by `MigManager.ensure`: an instance this plugin
already made for it is reused (a retried or repeated Allocate gets the same device), otherwise it is
created at its placement and nowhere else. Then ``migUUID``, ``gpuInstanceID`` and
``computeInstanceID`` are added to the container's entries (HAMi's format) in one pod patch; when any
step fails, the instances this call made are destroyed again and the container is refused.

The container gets ``NVIDIA_VISIBLE_DEVICES=MIG-<uuid>[,...]``, as HAMi and the NVIDIA device plugin give
it: the MIG instance is the isolation, so libvgpu is not mounted (HAMi does not either).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from device_plugin.api import api_pb2 as pb
from device_plugin.errors import AllocationRefused
from device_plugin.mig.controller import MigController
from device_plugin.mig.manager import MigError, MigManager
from device_plugin.mig.nvml import Instance
from hami import annotations as A
from hami.annotations import MigAllocation
from hami.errors import AnnotationError
from hami.model import ContainerDevice

if TYPE_CHECKING:
    from device_plugin.allocation_types import PendingPod

log = logging.getLogger(__name__)

ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"

Refuse = Callable[[str, str], Awaitable[AllocationRefused]]


class MigResponder:
    """The `mig` mode's container responses (plugged into `device_plugin.allocator.Allocator`)."""

    def __init__(self, kube: Any, manager: MigManager, controller: MigController) -> None:
        self.kube = kube
        self.manager = manager
        self.controller = controller

    async def respond(
        self, pending: PendingPod, ctr: dict, entry: list[ContainerDevice], refuse: Refuse, base: Any = None
    ) -> pb.ContainerAllocateResponse:
        """The response for the container `ctr` of `pending` whose recorded devices are `entry`.

        `refuse(reason, message)` builds the error raised (it marks the pod failed, as every refusal
        of Allocate does); `base` (the hami-core response) is not used in this mode.
        """
        index = next(i for i, c in enumerate(pending.containers) if c is ctr)
        annos = A.pod_annotations(pending.pod)
        try:
            allocations = A.decode_mig_allocations(annos.get(A.MIG_ALLOCATIONS, ""))
        except AnnotationError as e:
            raise await refuse("bad_annotation", f"{A.MIG_ALLOCATIONS}: {e}") from None
        mine = sorted((a for a in allocations if a.container_index == index), key=lambda a: a.device_index)
        if len(mine) != len(entry):
            raise await refuse(
                "mig_reservation",
                f"{A.MIG_ALLOCATIONS} holds {len(mine)} MIG reservation(s) for container index {index} but the "
                f"scheduler recorded {len(entry)} device(s) {[d.uuid for d in entry]} for it",
            )
        for a, d in zip(mine, entry, strict=True):
            if a.gpu_uuid != d.uuid:
                raise await refuse(
                    "mig_reservation",
                    f"MIG reservation {a.device_index} is on card {a.gpu_uuid} but the scheduler recorded card {d.uuid}",
                )
        made: list[Instance] = []
        async with self.controller.lock:
            await self.controller.reconcile_locked()
            try:
                got = []
                for a in mine:
                    inst, created = await asyncio.to_thread(
                        self.manager.ensure, a.gpu_uuid, a.profile, a.placement
                    )
                    if created:
                        made.append(inst)
                    got.append(inst)
                await self._record(
                    pending,
                    allocations,
                    {(a.container_index, a.device_index): i for a, i in zip(mine, got, strict=True)},
                )
            except MigError as e:
                await self._undo(made)
                raise await refuse(f"mig_{e.reason}", e.message) from None
            except AllocationRefused as e:
                await self._undo(made)
                raise await refuse(e.reason, e.message) from None
        log.info(
            "pod %s container %s: MIG devices %s", pending.ref(), ctr.get("name", index),
            ", ".join(f"{i.mig_uuid} ({i.profile} on {i.gpu_uuid})" for i in got),
        )  # fmt: skip
        return pb.ContainerAllocateResponse(envs={ENV_VISIBLE: ",".join(i.mig_uuid for i in got)})

    async def _record(
        self, pending: PendingPod, allocations: list[MigAllocation], realized: dict[tuple[int, int], Instance]
    ) -> None:
        """Add the runtime identity to the realised entries and patch the pod (kept in `pending.pod` so
        the next container of the same call sees it)."""
        out = []
        for a in allocations:
            inst = realized.get((a.container_index, a.device_index))
            if inst is not None:
                a = MigAllocation(
                    a.container_index, a.device_index, a.gpu_uuid, a.profile, a.placement,
                    inst.mig_uuid, inst.gi_id, inst.ci_id,
                )  # fmt: skip
            out.append(a)
        value = A.encode_mig_allocations(out)
        try:
            await asyncio.to_thread(
                self.kube.patch_pod_metadata, pending.namespace, pending.name,
                annotations={A.MIG_ALLOCATIONS: value}, uid=pending.uid or None,
            )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - any API failure: the caller rolls back
            raise AllocationRefused(
                "api_error", f"cannot record the MIG runtime identity on the pod: {e}"
            ) from None
        pending.pod.setdefault("metadata", {}).setdefault("annotations", {})[A.MIG_ALLOCATIONS] = value

    async def _undo(self, made: list[Instance]) -> None:
        for inst in reversed(made):
            try:
                await asyncio.to_thread(self.manager.release, inst)
            except Exception as e:  # noqa: BLE001 - the next reconciliation removes it (no pod reserves it)
                log.warning("could not roll back MIG instance %s: %s", inst.mig_uuid, e)
