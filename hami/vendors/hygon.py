"""Hygon DCU: legacy colon registration (`hami.io/node-dcu-register`), memory and cores shares.

Its device plugin is Hygon's own; only the scheduler side lives here (hami-legacy-spec §6.2): default
cores 100 (a DCU is exclusive unless the pod asks for a share), memory x memoryFactor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami.configparse import require
from hami.model import PERCENTAGE_UNSET, ContainerDevice, ContainerRequest, Device, Selection
from hami.quantity import to_count, to_mib, to_percent
from hami.registration import decode_node_devices_colon
from hami.vendors.base import (
    AllocationContext,
    MutationResult,
    ResourceNames,
    VendorBase,
    container_limits,
    registered,
    split_list,
)

USE_DCUTYPE = "hygon.com/use-dcutype"
NOUSE_DCUTYPE = "hygon.com/nouse-dcutype"
USE_GPUUUID = "hygon.com/use-gpuuuid"
NOUSE_GPUUUID = "hygon.com/nouse-gpuuuid"


@dataclass(frozen=True)
class HygonConfig:
    """The `hygon:` section of device-config.yaml (HAMi pkg/device/hygon)."""

    resourceCountName: str = "hygon.com/dcunum"
    """Extended resource counting DCUs per container. Default `hygon.com/dcunum` (HAMi chart)."""
    resourceMemoryName: str = "hygon.com/dcumem"
    """Per-DCU memory in MiB (times `memoryFactor`). Default `hygon.com/dcumem` (HAMi chart)."""
    resourceCoreName: str = "hygon.com/dcucores"
    """Per-DCU share of the compute units in percent; absent = 100 (exclusive). Default `hygon.com/dcucores`."""
    memoryFactor: int = 1
    """Multiplier applied to memory requests and memory quotas. Default 1 (HAMi chart)."""

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid key."""
        require(self.memoryFactor >= 1, "hygon.memoryFactor", self.memoryFactor, "an integer >= 1")


class HygonVendor(VendorBase):
    common_word = "DCU"
    register_key = "hami.io/node-dcu-register"
    handshake_key: str | None = "hami.io/node-handshake-dcu"
    to_allocate_key: str | None = "hami.io/dcu-devices-to-allocate"
    allocated_key = "hami.io/dcu-devices-allocated"
    uses_node_lock = True

    def __init__(self, config: HygonConfig | None = None) -> None:
        self.config = config or HygonConfig()
        c = self.config
        self._names = ResourceNames(
            count=c.resourceCountName, memory=c.resourceMemoryName, cores=c.resourceCoreName,
            memory_factor=c.memoryFactor,
        )  # fmt: skip

    def resource_names(self) -> ResourceNames:
        return self._names

    def user_annotation_keys(self) -> tuple[str, ...]:
        return (USE_DCUTYPE, NOUSE_DCUTYPE, USE_GPUUUID, NOUSE_GPUUUID)

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.to_allocate_key or "", self.allocated_key)

    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        n = self._names
        limits = container_limits(container)
        name = container.get("name", "?")
        if n.count not in limits:
            return None
        nums = to_count(limits[n.count], resource=f"container {name}: {n.count}")
        if nums == 0:
            return None
        memreq, pct = 0, PERCENTAGE_UNSET
        if n.memory and n.memory in limits:
            memreq = (
                to_mib(limits[n.memory], resource=f"container {name}: {n.memory}", per_card=True)
                * n.memory_factor
            )
        if memreq == 0:
            pct = 100
        cores = 100
        if n.cores and n.cores in limits:
            cores = to_percent(limits[n.cores], resource=f"container {name}: {n.cores}")
        return ContainerRequest(
            vendor=self.common_word, nums=nums, memreq=memreq, mem_percentage=pct, coresreq=cores
        )

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return Selection(
            use_types=split_list(annotations.get(USE_DCUTYPE), field=USE_DCUTYPE),
            nouse_types=split_list(annotations.get(NOUSE_DCUTYPE), field=NOUSE_DCUTYPE),
            use_uuids=split_list(annotations.get(USE_GPUUUID), field=USE_GPUUUID),
            nouse_uuids=split_list(annotations.get(NOUSE_GPUUUID), field=NOUSE_GPUUUID),
        )

    def type_matches(self, device: Device, selection: Selection) -> bool:
        t = device.type.lower()
        if selection.use_types and not any(u.lower() in t for u in selection.use_types):
            return False
        return not any(u.lower() in t for u in selection.nouse_types)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return registered(
            node, self.register_key, lambda v: decode_node_devices_colon(v, vendor=self.common_word)
        )

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        encoded = A.encode_pod_devices(containers)
        return {self.to_allocate_key or "": encoded, self.allocated_key: encoded}

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """Validate DCU quantities (whole MiB, cores 0..100); a DCU container uses the device."""
        n = self._names
        limits = container_limits(container)
        cname = container.get("name", "?")
        if n.count not in limits:
            return MutationResult()
        to_count(limits[n.count], resource=f"container {cname}: resources.limits[{n.count}]")
        if n.memory and n.memory in limits:
            to_mib(
                limits[n.memory], resource=f"container {cname}: resources.limits[{n.memory}]", per_card=True
            )
        if n.cores and n.cores in limits:
            to_percent(limits[n.cores], resource=f"container {cname}: resources.limits[{n.cores}]")
        return MutationResult(uses_device=True)
