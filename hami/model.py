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

#: `Device.mode` values (HAMi's operating modes; `nvidia.com/vgpu-mode` names them).
HAMI_CORE_MODE = "hami-core"
MIG_MODE = "mig"
MPS_MODE = "mps"


@dataclass(frozen=True, slots=True, order=True)
class MigPlacement:
    """Where a MIG GPU instance sits on its card: memory slices `start` .. `start + size - 1` (NVML's
    ``nvmlGpuInstancePlacement_t``; an A100/H100/H200 has 8 slices)."""

    start: int
    size: int

    def overlaps(self, other: MigPlacement) -> bool:
        """Whether two placements share a memory slice (two instances cannot)."""
        return self.start < other.start + other.size and other.start < self.start + self.size


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG GPU-instance profile a card offers, as its node registers it (HAMi's wire format
    ``{"name":"1g.5gb","memoryMB":4864,"core":15,"sliceCount":1,"placements":[{"start":6,"size":1}]}``).

    `memory_mb` MiB of the instance (NVML's memorySizeMB), `core` percent of the card's SMs (rounded
    up), `slice_count` compute slices, `placements` where NVML allows an instance of it.
    """

    name: str
    memory_mb: int
    core: int
    slice_count: int
    placements: tuple[MigPlacement, ...] = ()


@dataclass(frozen=True, slots=True)
class MigSlot:
    """One MIG instance the scheduler decided for one device of a container: profile and placement."""

    profile: str
    placement: MigPlacement


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
    #: MIG profiles the card offers (only on cards registered with mode ``mig``).
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True, slots=True)
class ContainerDevice:
    """One card given to one container: `usedmem` MiB and `usedcores` percent on card `uuid`.

    `type` is the request CommonWord (``NVIDIA``), as written in the pod device list (§1.6.4); `mig`
    the MIG instance decided for it on a card in MIG mode (from ``hami.io/vgpu-mig-allocations``).
    """

    uuid: str
    type: str
    usedmem: int
    usedcores: int
    mig: MigSlot | None = None


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
    `mode` is the pod's ``nvidia.com/vgpu-mode``; `mig_profile` an exact MIG profile for every MIG device.
    """

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    numa_bind: bool = False
    mode: str = ""
    mig_profile: str = ""


@dataclass(slots=True)
class DeviceUsage:
    """Running usage of one card: `used` slots, `usedmem` MiB, `usedcores` percent.

    On a card in MIG mode also the placements its instances occupy (`mig`), and how many pods hold it
    without a placement on record (`mig_unknown`: their instances could be anywhere, so the card takes
    no new instance, HAMi's fail-closed rule).
    """

    used: int = 0
    usedmem: int = 0
    usedcores: int = 0
    mig: tuple[MigPlacement, ...] = ()
    mig_unknown: int = 0

    def add(
        self, mem: int, cores: int, slots: int = 1, mig: tuple[MigPlacement, ...] = (), mig_unknown: int = 0
    ) -> None:
        self.used += slots
        self.usedmem += mem
        self.usedcores += cores
        if mig:
            self.mig += mig
        self.mig_unknown += mig_unknown

    def sub(
        self, mem: int, cores: int, slots: int = 1, mig: tuple[MigPlacement, ...] = (), mig_unknown: int = 0
    ) -> None:
        # Never underflow: a double delete must not create phantom free capacity.
        self.used = max(0, self.used - slots)
        self.usedmem = max(0, self.usedmem - mem)
        self.usedcores = max(0, self.usedcores - cores)
        if mig:
            left = list(self.mig)
            for p in mig:
                if p in left:
                    left.remove(p)
            self.mig = tuple(left)
        self.mig_unknown = max(0, self.mig_unknown - mig_unknown)

    def copy(self) -> DeviceUsage:
        return DeviceUsage(self.used, self.usedmem, self.usedcores, self.mig, self.mig_unknown)


@dataclass(frozen=True, slots=True)
class CardGrant:
    """Usage one pod holds on one card after collapsing init and app containers (§2.2.2).

    `mig`: the placements of the pod's MIG instances on the card (each once); `mig_missing`: how many of
    its devices on the card have no MIG instance on record (counted against a card in MIG mode only).
    """

    uuid: str
    vendor: str
    usedmem: int
    usedcores: int
    slots: int
    mig: tuple[MigPlacement, ...] = ()
    mig_missing: int = 0


#: Per vendor CommonWord, one list entry per container (init containers first, then app containers).
PodDevices = dict[str, list[list[ContainerDevice]]]


@dataclass(slots=True)
class PodAllocation:
    """Everything the scheduler decided for one pod: node and per-vendor device lists."""

    node: str
    devices: PodDevices = field(default_factory=dict)
