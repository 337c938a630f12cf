"""Cambricon MLU (CommonWord `MLU`): dynamic sMLU shares from node capacity, memory in 256 MiB units.

HAMi pkg/device/cambricon. The inventory is not an annotation: Cambricon's device plugin advertises
`cambricon.com/mlu.smlu.vcore` (100 per card) and `cambricon.com/mlu.smlu.vmemory` (256 MiB units) as
node capacity, and the cards are derived from them (`<node>-cambricon-mlu-<i>`, 100 slots, equal memory).
A container without memory gets the whole card's memory, without cores the whole card (100). The
generic fit applies, with the namespace quota checked per card as in HAMi.

At filter time the pod gets `CAMBRICON_DSMLU_PROFILE=<index>_<cores>_<memory units>` (first card of the
first container with one; Cambricon's plugin serves one sMLU per pod) and the "not yet assigned" flag,
which we write under both spellings: `CAMBRICON_DSMLU_ASSIGNED` (HAMi since late 2025) and
`CAMBRICON_DSMLU_ASSIGHED` (what Cambricon's device plugin and Koordinator's adapter read).
Differences from HAMi: bind does not take HAMi's own `cambricon.com/dsmlu.lock` (an owner-less
timestamp whose release HAMi does not scope to MLU pods); the device plugin finds the pod by the
assigned flag. Quantities that are not whole numbers are rejected instead of dropping the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import objects
from hami.model import ContainerDevice, Device
from hami.vendors.base import AllocationContext
from hami.vendors.common import ShareVendor, capacity_count

UNIT_MIB = 256
PROFILE = "CAMBRICON_DSMLU_PROFILE"
ASSIGNED = "CAMBRICON_DSMLU_ASSIGNED"
ASSIGNED_DP = "CAMBRICON_DSMLU_ASSIGHED"  # sic: the spelling Cambricon's device plugin reads


@dataclass(frozen=True)
class CambriconConfig:
    """The `cambricon:` section (HAMi chart `devices.cambricon`, pkg/device/cambricon)."""

    resourceCountName: str = "cambricon.com/vmlu"
    """Extended resource counting sMLUs per container. Default `cambricon.com/vmlu` (HAMi chart)."""
    resourceMemoryName: str = "cambricon.com/mlu.smlu.vmemory"
    """Per-card memory in units of 256 MiB; also the node capacity of 256 MiB units. Default `cambricon.com/mlu.smlu.vmemory`."""
    resourceCoreName: str = "cambricon.com/mlu.smlu.vcore"
    """Per-card compute in percent (absent = 100, a whole card); also the node capacity, 100 per card. Default `cambricon.com/mlu.smlu.vcore`."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


class CambriconVendor(ShareVendor):
    common_word = "MLU"
    to_allocate_key = "hami.io/cambricon-mlu-devices-to-allocate"
    allocated_key = "hami.io/cambricon-mlu-devices-allocated"
    use_uuid_key = "cambricon.com/use-gpuuuid"
    nouse_uuid_key = "cambricon.com/nouse-gpuuuid"
    memory_unit_mib = UNIT_MIB
    default_cores = 100
    quota_memory_factor = UNIT_MIB

    def __init__(self, config: CambriconConfig | None = None) -> None:
        self.config = c = config or CambriconConfig()
        super().__init__(c.resourceCountName, c.resourceMemoryName, c.resourceCoreName)
        self.node_capacity_keys = (c.resourceCoreName, c.resourceMemoryName)

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.to_allocate_key, self.allocated_key, PROFILE, ASSIGNED, ASSIGNED_DP)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        """Cards from capacity: `i` while `i*100 < vcore`, each `vmemory*256*100/vcore` MiB."""
        c = self.config
        cores = capacity_count(node, c.resourceCoreName, unit="percent")
        if cores is None:
            return None
        mem = capacity_count(node, c.resourceMemoryName, unit="256 MiB units") or 0
        name = objects.name(node)
        devmem = mem * UNIT_MIB * 100 // cores if cores else 0
        return [
            Device(uuid=f"{name}-cambricon-mlu-{i}", index=i, count=100, devmem=devmem, devcore=100,
                   type=self.common_word, vendor=self.common_word)
            for i in range((cores + 99) // 100)
        ]  # fmt: skip

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        out = super().allocation_annotations(containers, context=context)
        first = next((c[0] for c in containers if c), None)
        if first is not None:
            cards = context.cards if context else {}
            idx = cards[first.uuid].index if first.uuid in cards else 0
            out[PROFILE] = f"{idx}_{first.usedcores}_{first.usedmem // UNIT_MIB}"
            out[ASSIGNED] = out[ASSIGNED_DP] = "false"
        return out


def build(config: CambriconConfig, device_config: Any) -> list[CambriconVendor]:
    return [CambriconVendor(config)]
