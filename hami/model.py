"""The device model shared by every component.

These are the nouns of HAMi's legacy protocol: a physical card as a node registers it (`Device`), the
running usage of a card (`DeviceUsage`), what one container asks of one vendor (`ContainerRequest`), and
what the scheduler gave it (`ContainerDevice`). Field names follow HAMi's Go structs (pkg/device) so that
the codecs in `hami.annotations` map one-to-one onto the wire formats.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: `ContainerRequest.mem_percentage` when the pod gave no percentage (HAMi's sentinel 101).
PERCENTAGE_UNSET = 101


@dataclass(frozen=True, slots=True)
class Device:
    """One physical card as registered on a node (hami-legacy-spec §1.6.1).

    `count` is the split count (how many containers may share the card), `devmem` MiB (already
    multiplied by deviceMemoryScaling), `devcore` percent of the card's SMs (100 x deviceCoreScaling).
    `type` is the model string, e.g. ``NVIDIA-Tesla V100-PCIE-32GB``; `vendor` the CommonWord.
    """

    uuid: str
    index: int
    count: int
    devmem: int
    devcore: int
    type: str
    numa: int = 0
    mode: str = "hami-core"
    health: bool = True
    vendor: str = "NVIDIA"


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One card given to one container: `usedmem` MiB and `usedcores` percent on card `uuid`.

    `type` is the request CommonWord (``NVIDIA``), as written in the pod device list (§1.6.4).
    """

    uuid: str
    type: str
    usedmem: int
    usedcores: int


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What one container asks of one vendor (HAMi's ContainerDeviceRequest).

    `nums` cards; per card either `memreq` MiB (> 0) or `mem_percentage` percent of the card's memory
    (`PERCENTAGE_UNSET` when not given); `coresreq` percent of SMs per card.
    """

    vendor: str
    nums: int
    memreq: int = 0
    mem_percentage: int = PERCENTAGE_UNSET
    coresreq: int = 0

    def memory_on(self, device: Device) -> int:
        """MiB this request takes on `device`: `memreq`, else `devmem x percentage / 100` (integer)."""
        if self.memreq > 0:
            return self.memreq
        if self.mem_percentage != PERCENTAGE_UNSET:
            return device.devmem * self.mem_percentage // 100
        return device.devmem


@dataclass(frozen=True, slots=True)
class Selection:
    """A container's device selection rules for one vendor, from pod annotations (§1.3).

    Type rules are case-insensitive substrings of the device type; UUID rules exact. Empty = no rule.
    """

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    numa_bind: bool = False
    mode: str = ""


@dataclass(slots=True)
class DeviceUsage:
    """Running usage of one card: `used` slots, `usedmem` MiB, `usedcores` percent."""

    used: int = 0
    usedmem: int = 0
    usedcores: int = 0

    def add(self, mem: int, cores: int, slots: int = 1) -> None:
        self.used += slots
        self.usedmem += mem
        self.usedcores += cores

    def sub(self, mem: int, cores: int, slots: int = 1) -> None:
        # Never underflow: a double delete must not create phantom free capacity.
        self.used = max(0, self.used - slots)
        self.usedmem = max(0, self.usedmem - mem)
        self.usedcores = max(0, self.usedcores - cores)

    def copy(self) -> DeviceUsage:
        return DeviceUsage(self.used, self.usedmem, self.usedcores)


@dataclass(frozen=True, slots=True)
class CardGrant:
    """Usage one pod holds on one card after collapsing init and app containers (§2.2.2)."""

    uuid: str
    vendor: str
    usedmem: int
    usedcores: int
    slots: int


#: Per vendor CommonWord, one list entry per container (init containers first, then app containers).
PodDevices = dict[str, list[list[ContainerDevice]]]


@dataclass(slots=True)
class PodAllocation:
    """Everything the scheduler decided for one pod: node and per-vendor device lists."""

    node: str
    devices: PodDevices = field(default_factory=dict)
