"""Keeping this node's MIG instances equal to its pods' reservations: at start, every few seconds, and
right before an Allocate creates instances.

Each round lists the pods bound to this node (one complete list; a failed list changes nothing), takes
the ``hami.io/vgpu-mig-allocations`` of our scheduler's pods that have not ended, and hands them to
`MigManager.reconcile`: instances the ledger lost but a pod's runtime identity names are adopted,
owned instances nobody reserves are destroyed unless busy, and cards with foreign instances are taken
out of service (registered unhealthy, so the scheduler places nothing there) with a Warning event on
the Node, until the instances are gone. A pod of ours whose MIG record cannot be read stops the round
before anything is destroyed: its instances could be any of them.

The `lock` serialises rounds with Allocate's instance creation, so a round that listed the pods before
a pod was bound cannot destroy the instance that pod's Allocate is making.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from device_plugin.devices import DeviceState
from device_plugin.mig.manager import Key, MigManager, Reconciled, key_of
from hami import annotations as A
from hami import pods as P
from hami.annotations import MigAllocation
from hami.errors import AnnotationError

log = logging.getLogger(__name__)

INTERVAL_S = 5.0  # HAMi's reconcile period
FOREIGN_REASON = "MigForeignInstances"  # Warning event on the Node
EVENT_COMPONENT = "hami-device-plugin"


def active_allocations(
    pods: list[dict[str, Any]], *, node_name: str, scheduler_name: str
) -> dict[Key, MigAllocation]:
    """The MIG reservations of the pods that hold instances on this node: ours (scheduler name and
    ``hami.io/vgpu-node``), bound here, not ended (a pod being deleted still holds its instances).

    Raises AnnotationError naming the pod whose record cannot be read.
    """
    out: dict[Key, MigAllocation] = {}
    for pod in pods:
        spec, annos = pod.get("spec") or {}, A.pod_annotations(pod)
        if (
            spec.get("schedulerName") != scheduler_name
            or spec.get("nodeName") != node_name
            or annos.get(A.ASSIGNED_NODE) != node_name
            or P.is_terminal(pod)
            or not annos.get(A.MIG_ALLOCATIONS)
        ):
            continue
        meta = pod.get("metadata") or {}
        try:
            allocations = A.decode_mig_allocations(annos[A.MIG_ALLOCATIONS])
        except AnnotationError as e:
            raise AnnotationError(
                f"pod {meta.get('namespace')}/{meta.get('name')}: {A.MIG_ALLOCATIONS}: {e}"
            ) from None
        for a in allocations:
            out[key_of(a)] = a
    return out


class MigController:
    """Reconciles the node's MIG instances with its pods (`run`, `reconcile_once`) and blocks cards with
    foreign instances in `state`."""

    def __init__(
        self,
        kube: Any,
        state: DeviceState,
        manager: MigManager,
        *,
        node_name: str,
        scheduler_name: str,
        interval_s: float = INTERVAL_S,
        on_round: Callable[[Reconciled | None], None] | None = None,
    ) -> None:
        self.kube = kube
        self.state = state
        self.manager = manager
        self.node_name = node_name
        self.scheduler_name = scheduler_name
        self.interval_s = interval_s
        self.on_round = on_round or (lambda r: None)
        self.lock = asyncio.Lock()
        self._reported: dict[str, str] = {}

    async def run(self) -> None:
        """A round now, then every `interval_s`, until cancelled (never raises for one bad round)."""
        while True:
            try:
                async with self.lock:
                    await self.reconcile_locked()
            except Exception as e:  # noqa: BLE001 - a round that failed is tried again next time
                log.warning("MIG reconciliation failed: %s", e)
            await asyncio.sleep(self.interval_s)

    async def reconcile_once(self) -> Reconciled | None:
        async with self.lock:
            return await self.reconcile_locked()

    async def reconcile_locked(self) -> Reconciled | None:
        """One round (the caller holds `lock`). None when the pods could not be listed or read: then
        only the foreign-instance check ran (from the ledger) and nothing was destroyed."""
        try:
            pods = await asyncio.to_thread(
                self.kube.list_pods, field_selector=f"spec.nodeName={self.node_name}"
            )
            active = active_allocations(pods, node_name=self.node_name, scheduler_name=self.scheduler_name)
        except AnnotationError as e:
            log.warning("MIG reconciliation: nothing destroyed this round: %s", e)
            result = None
        except Exception as e:  # noqa: BLE001 - the API server is away: destroy nothing
            log.warning(
                "MIG reconciliation: cannot list this node's pods (%s); nothing destroyed this round", e
            )
            result = None
        else:
            result = await asyncio.to_thread(self.manager.reconcile, active)
        foreign = result.foreign if result is not None else await asyncio.to_thread(self._foreign)
        await self._report(foreign)
        self.on_round(result)
        return result

    def _foreign(self) -> dict[str, list[Any]]:
        out = {}
        for card in self.state.cards():
            try:
                found = self.manager.foreign(card.uuid)
            except Exception as e:  # noqa: BLE001 - NVML trouble on one card: report it as unknown
                log.warning("card %s: cannot list MIG instances: %s", card.uuid, e)
                continue
            if found:
                out[card.uuid] = found
        return out

    async def _report(self, foreign: Mapping[str, list[Any]]) -> None:
        for card in self.state.cards():
            found = foreign.get(card.uuid)
            if not found:
                self.state.set_blocked(card.uuid, None)
                self._reported.pop(card.uuid, None)
                continue
            what = ", ".join(
                f"{i.mig_uuid or 'GPU instance ' + str(i.gi_id)} ({i.profile} at slices "
                f"{i.placement.start}..{i.placement.start + i.placement.size - 1})"
                for i in found
            )
            reason = (
                f"MIG instances this device plugin did not make are on card {card.uuid}: {what}; the card is left as "
                "it is and takes no new pod until they are removed (nvidia-smi mig -dci / -dgi)"
            )
            self.state.set_blocked(card.uuid, reason)
            if self._reported.get(card.uuid) != reason:
                self._reported[card.uuid] = reason
                node = {"kind": "Node", "metadata": {"name": self.node_name, "uid": self.node_name}}
                try:
                    await asyncio.to_thread(
                        self.kube.create_event, node, reason=FOREIGN_REASON, message=reason, type="Warning",
                        component=EVENT_COMPONENT, host=self.node_name,
                    )  # fmt: skip
                except Exception as e:  # noqa: BLE001 - an event is best effort
                    log.warning("could not record the %s event: %s", FOREIGN_REASON, e)
