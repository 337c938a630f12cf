"""What the plugin knows about its cards, independent of how they were discovered or how kubelet is spoken to.

The narrow waist between backends (NVML, the fake YAML) and the gRPC server (the NVIDIA device plugin's
"resource manager" split): backends produce `Card`s and health reports; `DeviceState` turns them into the
virtual devices kubelet sees (`deviceSplitCount` replicas ``<card-uuid>-<i>`` per card, hami-legacy-spec
§3.2), maps kubelet's virtual IDs back to cards, and wakes ListAndWatch streams and the registration
writer when health changes. It lives on the event loop thread; backends report from other threads
through ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hami.model import Device, MigProfile

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Card:
    """One physical card as a backend discovered it.

    `memory_mib` is the card's total memory in MiB before deviceMemoryScaling; `model` is the registered
    type string (``NVIDIA-`` rule already applied, see `nvidia_type`); `numa` is the NUMA node id or None
    when unknown. A card in MIG mode carries the MIG profiles it offers (`mig_profiles`) and `slots`,
    the most instances it takes of one of them: its virtual devices and its registered count (None:
    the split count).
    """

    uuid: str
    index: int
    model: str
    memory_mib: int
    numa: int | None = None
    healthy: bool = True
    mig_profiles: tuple[MigProfile, ...] = ()
    slots: int | None = None


def nvidia_type(name: str) -> str:
    """HAMi's type rule (§1.6.1): prefix the NVML name with ``NVIDIA-`` unless it already starts with ``NVIDIA``.

    ``Tesla V100-PCIE-32GB`` -> ``NVIDIA-Tesla V100-PCIE-32GB``; ``NVIDIA H200`` stays as is.
    """
    name = name.strip()
    return name if name.startswith("NVIDIA") else f"NVIDIA-{name}"


def replica_id(uuid: str, i: int) -> str:
    """Virtual device id of replica `i` of card `uuid`: ``<uuid>-<i>`` (HAMi's form, §3.2)."""
    return f"{uuid}-{i}"


class DeviceState:
    """Cards, their health, and the virtual devices derived from them (`split_count` per card).

    `numa_topology` decides whether ListAndWatch carries NUMA TopologyInfo (device config
    ``enableNumaTopology``; off by default like HAMi, see docs/device-plugin.md for why).
    """

    def __init__(self, cards: Sequence[Card], *, split_count: int, numa_topology: bool = False) -> None:
        if split_count < 1:
            raise ValueError(f"split_count: {split_count} must be >= 1")
        uuids = [c.uuid for c in cards]
        if len(set(uuids)) != len(uuids):
            raise ValueError(f"cards: duplicate uuid in {uuids}")
        self.split_count = split_count
        self.numa_topology = numa_topology
        self._cards: dict[str, Card] = {c.uuid: c for c in sorted(cards, key=lambda c: c.index)}
        self._by_id: dict[str, str] = {
            replica_id(c.uuid, i): c.uuid for c in self._cards.values() for i in range(self._slots(c))
        }
        # Cards kept out of service by the plugin itself (MIG instances it does not own), with why.
        self._blocked: dict[str, str] = {}
        self._version = 0
        self._changed = asyncio.Event()

    def _slots(self, card: Card) -> int:
        return card.slots or self.split_count

    # ----- reading

    @property
    def version(self) -> int:
        """Bumped on every health change; ListAndWatch and the registration writer compare it."""
        return self._version

    def cards(self) -> list[Card]:
        """All cards in index order, with their current health."""
        return list(self._cards.values())

    def card(self, uuid: str) -> Card | None:
        """The card with physical UUID `uuid` (current health), None when it is not one of ours."""
        return self._cards.get(uuid)

    def card_of(self, device_id: str) -> str | None:
        """Physical card uuid of a virtual device id, None when the id is not one of ours."""
        return self._by_id.get(device_id)

    def replicas(self, uuid: str) -> list[str]:
        """The virtual ids of card `uuid`, replica 0 first ([] for an unknown card)."""
        card = self._cards.get(uuid)
        if card is None:
            return []
        return [replica_id(uuid, i) for i in range(self._slots(card))]

    def usable(self, card: Card) -> bool:
        """Healthy and not blocked by the plugin (`set_blocked`)."""
        return card.healthy and card.uuid not in self._blocked

    def blocked(self) -> dict[str, str]:
        """Cards the plugin keeps out of service, with the reason."""
        return dict(self._blocked)

    def virtual_devices(self) -> list[tuple[str, bool, int | None]]:
        """Every virtual device as (id, healthy, numa or None), cards in index order."""
        return [
            (replica_id(c.uuid, i), self.usable(c), c.numa if self.numa_topology else None)
            for c in self._cards.values()
            for i in range(self._slots(c))
        ]

    def registration(
        self, *, memory_scaling: float, core_scaling: float, mode: str = "hami-core"
    ) -> list[Device]:
        """The cards as `hami.model.Device`s for `hami.io/node-nvidia-register` (§1.6.1, §3.2).

        devmem = MiB x memory_scaling (truncated to an integer as Go's uint conversion does), devcore =
        100 x core_scaling, count = split count (a MIG card's own `slots`), numa 0 when unknown; a card
        the plugin blocks registers as unhealthy.
        """
        return [
            Device(
                uuid=c.uuid,
                index=c.index,
                count=self._slots(c),
                devmem=int(c.memory_mib * memory_scaling),
                devcore=int(100 * core_scaling),
                type=c.model,
                numa=c.numa or 0,
                mode=mode,
                health=self.usable(c),
                mig_profiles=c.mig_profiles,
            )
            for c in self._cards.values()
        ]

    # ----- changing

    def set_health(self, uuid: str | None, healthy: bool, reason: str = "") -> bool:
        """Mark card `uuid` (None = every card) healthy or not; True when anything changed.

        Unknown uuids are logged and ignored: a backend event for a card we filtered out is not an error.
        """
        targets: Iterable[str] = list(self._cards) if uuid is None else [uuid]
        changed = False
        for u in targets:
            card = self._cards.get(u)
            if card is None:
                log.warning("health report for unknown card %s ignored", u)
                continue
            if card.healthy != healthy:
                self._cards[u] = replace(card, healthy=healthy)
                changed = True
                log.warning(
                    "card %s (index %d) is now %s%s",
                    u,
                    card.index,
                    "healthy" if healthy else "unhealthy",
                    f": {reason}" if reason else "",
                )
        if changed:
            self._version += 1
            self._changed.set()
            self._changed = asyncio.Event()
        return changed

    def set_blocked(self, uuid: str, reason: str | None) -> bool:
        """Keep card `uuid` out of service for `reason` (None: back in service); True when it changed.

        Separate from health: a card the plugin blocks (foreign MIG instances on it) comes back when
        the cause is gone, while an XID failure stays until the card is reset.
        """
        if uuid not in self._cards or self._blocked.get(uuid) == reason:
            return False
        if reason is None:
            self._blocked.pop(uuid, None)
            log.warning("card %s is back in service", uuid)
        else:
            self._blocked[uuid] = reason
            log.warning("card %s is out of service: %s", uuid, reason)
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return True

    async def wait_change(self, version: int, timeout: float | None = None) -> int:
        """Wait until the version differs from `version` (or `timeout` seconds pass); return the version."""
        if self._version != version:
            return self._version
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass
        return self._version
