"""Matching kubelet's device ids to the cards the scheduler recorded, and serving containers again
after a node reboot (hami-legacy-spec §2.7, §2.8).

A container gets the recorded cards (``hami.io/vgpu-devices-to-allocate``); kubelet's device count and
the container's limit must agree with them, and every card must be ours. When kubelet's ids sit on other
cards (its Topology Manager, say) the container still gets the recorded cards, and the mismatch is a
Warning event (`CARD_MISMATCH_REASON`) and a metric. After a proven reboot (the node's boot ID changed),
with no lock held, a request is answered from the plugin's own record of what it served
(`device_plugin.served`), never from pod annotations, when exactly one kind of container fits it.

`RecordedCards` is a mixin of `device_plugin.allocator.Allocator`, which holds the state; it builds on
the lock holder's refusal path (`device_plugin.lock_holder`) and the responses
(`device_plugin.allocate_response`).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Sequence

from device_plugin.allocate_response import ResponseBuilder
from device_plugin.allocation_types import PendingPod
from device_plugin.api import api_pb2 as pb
from device_plugin.errors import AllocationRefused
from device_plugin.lock_holder import LockHolder
from device_plugin.served import SERVED_DIR, ServedRecords
from hami import pods
from hami.errors import InvalidRequest
from hami.model import ContainerDevice
from hami.spec_limits import asked_on
from hami.vendors.nvidia import NvidiaVendor, control_disabled

# The logger keeps the name it had before Allocate was split into parts: documented transcripts name it.
log = logging.getLogger("device_plugin.allocator")

VENDOR = "NVIDIA"  # CommonWord of the entries we consume in hami.io/vgpu-devices-to-allocate

EVENT_COMPONENT = "hami-device-plugin"  # source.component of the plugin's events
CARD_MISMATCH_REASON = "CardMismatch"  # Warning event: kubelet's ids on other cards than recorded


class RecordedCards(LockHolder, ResponseBuilder):
    """Per-container card checks, the preferred ids on the recorded cards and reboot re-admission of
    `device_plugin.allocator.Allocator` (a mixin over the lock holder's refusal path and the responses)."""

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
        beyond = self._beyond_the_spec(ctr, entry)
        if beyond:
            raise await refuse("beyond_spec", beyond)
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

    def _beyond_the_spec(self, ctr: dict, entry: list[ContainerDevice]) -> str | None:
        """Why `entry` serves more than the container's spec asks or than a card has, or None.

        The spec's device requests are written by the pod's owner, but they cannot change after
        creation and are what the scheduler fitted; the annotations could have been rewritten since.
        So no card is served more memory than the spec asks on it (MiB, percent of the card, or the
        whole card; `hami.spec_limits.asked_on`) nor than its registered memory, and no more SM
        percent than the spec asks (at most 100).
        """
        s = self.settings
        if _isolated_by_instance(getattr(self, "mode_responder", None)):
            return None  # mig mode: a whole MIG instance of the reserved profile is the isolation
        try:
            req = NvidiaVendor(s.nvidia).container_request(ctr)
        except InvalidRequest as e:
            return f"its request cannot be read: {e}"
        if req is None:
            return f"it does not limit {s.resource_name}"
        registered = self.state.registration(memory_scaling=s.memory_scaling, core_scaling=s.core_scaling)
        cards = {d.uuid: d for d in registered}
        for d in entry:
            card = cards.get(d.uuid)
            if card is None:
                continue  # refused as an unknown card
            mem, cores = asked_on(req, card)
            if d.usedmem > min(mem, card.devmem):
                return (
                    f"recorded {d.usedmem} MiB on card {d.uuid}, but the container asks {mem} MiB there and the "
                    f"card has {card.devmem} MiB"
                )
            if d.usedcores > min(cores, 100):
                return f"recorded {d.usedcores} % of card {d.uuid}'s SMs, but the container asks {cores} %"
        return None

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

    # ----- Allocate again after a node reboot

    def _served(self) -> ServedRecords:
        return ServedRecords(self.settings.vgpu_dir / SERVED_DIR)

    async def _remember_served(
        self, pending: PendingPod, served: Sequence[tuple[int, str, list[ContainerDevice]]]
    ) -> None:
        """Record the containers just served through the lock (and forget pods no longer on the node)."""
        if not served or not pending.uid:
            return
        records = self._served()
        try:
            await asyncio.to_thread(
                records.record, pending.uid, pending.namespace, pending.name, served, pending.boot_id
            )
            if pending.node_pods:
                await asyncio.to_thread(records.prune, set(pending.node_pods))
        except (OSError, ValueError) as e:  # the allocation stands; only a later re-admission is off
            log.warning("could not record what pod %s was served: %s", pending.ref(), e)

    async def _reboot_candidates(self) -> tuple[list[PendingPod], str] | str:
        """The pods whose containers may be served again now, and the node's boot ID; or why none may.

        A candidate container was served by this plugin (its record) in another boot than the node's
        current one (`status.nodeInfo.bootID`) and not again since; its pod still exists on this node,
        scheduled by us, not finished. Any other pod on the node that limits the resource and has no
        record of its own makes every request ambiguous (it could be the one kubelet asks for).
        """
        s = self.settings
        node = await self._call(self.kube.get_node, s.node_name)
        boot = str((((node or {}).get("status") or {}).get("nodeInfo") or {}).get("bootID") or "")
        if not boot:
            return f"node {s.node_name} reports no status.nodeInfo.bootID, so a reboot cannot be proven"
        listed = await self._call(self.kube.list_pods, field_selector=f"spec.nodeName={s.node_name}")
        records = {r.uid: r for r in await asyncio.to_thread(self._served().all)}
        out, unexplained = [], []
        for pod in listed:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") or pods.is_terminal(pod):
                continue
            containers = pods.containers(pod)
            wants = [i for i, c in enumerate(containers) if _limits(c, s.resource_name)]
            if not wants:
                continue
            ref = f"{meta.get('namespace')}/{meta.get('name')}"
            rec = records.get(meta.get("uid", ""))
            spec = pod.get("spec") or {}
            if (
                rec is None
                or spec.get("schedulerName") != s.scheduler_name
                or any(i not in rec.containers for i in wants)
            ):
                unexplained.append(ref)
                continue
            # Served in an earlier boot the node reported (a record without a boot ID proves nothing).
            entries = [
                list(rec.containers[i].devices)
                if i in rec.containers and rec.containers[i].boot_id not in ("", boot)
                else []
                for i in range(len(containers))
            ]
            out.append(PendingPod(pod=pod, entries=entries, containers=containers, n_init=pods.init_count(pod),
                                  boot_id=boot))  # fmt: skip
        if unexplained:
            return (
                f"pod(s) {', '.join(sorted(unexplained))} on node {s.node_name} limit {s.resource_name} but were "
                "never served by this plugin; a request could be theirs, so none is served again"
            )
        out.sort(key=lambda p: (p.namespace, p.name))
        return out, boot

    def _readmission_choice(
        self, running: list[PendingPod], ids: Sequence[str] | None, size: int
    ) -> tuple[PendingPod, int] | str:
        """The container a request of `size` devices (kubelet's `ids`, None for a preference) is for, or
        why none can be chosen. Prefers the containers whose recorded cards are the cards of `ids`."""
        options = [(p, i) for p in running for i, e in enumerate(p.entries) if e and len(e) == size]
        if not options:
            return (
                f"no pod on node {self.settings.node_name} has a container of {size} card(s) served before the "
                "node's last boot and not again since"
            )
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
            return f"containers that differ in cards or limits could each be the one: {names}"
        # Equal candidates get equal cards and limits, so taking the first is as good as knowing.
        return pool[0]

    async def _readmission_preference(
        self, requests: Sequence[pb.ContainerPreferredAllocationRequest]
    ) -> list[list[str]]:
        """Preferences for a request with no lock held: the cards of the container it is unambiguously
        for (see `_readmit`). Raises AllocationRefused when a request has no such container."""
        found = await self._reboot_candidates()
        if isinstance(found, str):
            raise AllocationRefused("no_entry", found)
        running, _boot = found
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
        """kubelet asks again for containers admitted before a node reboot: answer from this plugin's
        records of what it served them (`device_plugin.served`), once per container and boot.

        Nothing is written to the pods (they run; their annotations stay as they are). Raises
        `no_lock`'s refusal, completed by why no container can be served again, without marking any
        pod failed.
        """
        found = await self._reboot_candidates()
        if isinstance(found, str):
            raise AllocationRefused(no_lock.reason, f"{no_lock.message}; {found}")
        running, boot = found
        responses = []
        chosen: list[tuple[str, str]] = []
        records = self._served()
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
            responses.append(await self._respond(pending, ctr, entry, refuse, fresh=False))
            try:
                await asyncio.to_thread(
                    records.record, pending.uid, pending.namespace, pending.name,
                    [(idx, ctr.get("name", ""), entry)], boot,
                )  # fmt: skip
            except (OSError, ValueError) as e:
                raise await refuse("host_dir", f"cannot record the re-admission: {e}") from None
            pending.entries[idx] = []  # served again: no candidate for the next request of this call
            chosen.append((pending.ref(), ctr.get("name", "?")))
        for ref, name in chosen:
            self.on_allocated()
            self.on_readmitted()
            log.info(
                "pod %s container %s served again from this plugin's record (no lock held: boot %s)",
                ref,
                name,
                boot,
            )
        return responses


def _isolated_by_instance(responder: object) -> bool:
    """Whether the node serves MIG instances (their profile's memory, not a share of the card)."""
    if responder is None:
        return False
    from device_plugin.mig.allocate import MigResponder  # noqa: PLC0415 - only nodes in mig mode

    return isinstance(responder, MigResponder)


def _limits(container: dict, resource: str) -> bool:
    return resource in ((container.get("resources") or {}).get("limits") or {})
