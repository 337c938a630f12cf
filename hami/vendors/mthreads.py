"""Moore Threads (CommonWord `Mthreads`): sGPU shares from node capacity, 512 MiB memory units, 16 cores a card.

HAMi pkg/device/mthreads. Moore Threads' device plugin advertises `mthreads.com/sgpu-core` (16 per card)
and `mthreads.com/sgpu-memory` (512 MiB units) as node capacity; cards are derived from them
(`<node>-mthreads-<i>`, 100 slots, 16 cores). The plugin identifies the pod by
`mthreads.com/predicate-node` and the earliest `mthreads.com/predicate-time` and uses
`mthreads.com/gpu-index` (the card indexes of the last container with cards, as HAMi writes it), so
there is no node lock and HAMi's allocated key is for accounting only (the to-allocate key is never
written). The webhook turns a bare count or a multi-card count into whole cards (16 cores, 96 units
each, as HAMi hard-codes) and checks a single card's memory against the legal sizes; the request is
split evenly per card. HAMi's custom rule holds: containers of a pod may share one card only.
Difference from HAMi: quantities that are not whole numbers are rejected instead of dropping the request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami import objects
from hami.errors import InvalidRequest
from hami.model import PERCENTAGE_UNSET, ContainerDevice, ContainerRequest, Device
from hami.quantity import to_count, to_mib
from hami.vendors import common as C
from hami.vendors.base import AllocationContext, MutationResult, container_limits

UNIT_MIB = 512
CORES_PER_CARD = 16
WHOLE_CARD_UNITS = 96  # HAMi memoryPerMthreadsGPU
LEGAL_UNITS = (2, 4, 8, 16, 32, 64, 96)
GPU_INDEX = "mthreads.com/gpu-index"
PREDICATE_TIME = "mthreads.com/predicate-time"
PREDICATE_NODE = "mthreads.com/predicate-node"
REQUEST_GPU_NUM = "mthreads.com/request-gpu-num"


@dataclass(frozen=True)
class MthreadsConfig:
    """The `mthreads:` section (HAMi chart `devices.mthreads`, pkg/device/mthreads)."""

    resourceCountName: str = "mthreads.com/vgpu"
    """sGPUs per container. Default `mthreads.com/vgpu` (HAMi chart)."""
    resourceMemoryName: str = "mthreads.com/sgpu-memory"
    """Memory in 512 MiB units for the container (split over its cards); also node capacity. Default `mthreads.com/sgpu-memory`."""
    resourceCoreName: str = "mthreads.com/sgpu-core"
    """Compute for the container, 16 per whole card (split over its cards); also node capacity. Default `mthreads.com/sgpu-core`."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


class MthreadsVendor(C.ShareVendor):
    common_word = "Mthreads"
    allocated_key = "hami.io/mthreads-vgpu-devices-allocated"
    use_uuid_key = "mthreads.ai/use-gpuuuid"
    nouse_uuid_key = "mthreads.ai/nouse-gpuuuid"
    memory_unit_mib = UNIT_MIB
    default_cores = 0
    quota_memory_factor = UNIT_MIB
    custom_fit = True

    def __init__(self, config: MthreadsConfig | None = None) -> None:
        self.config = c = config or MthreadsConfig()
        super().__init__(c.resourceCountName, c.resourceMemoryName, c.resourceCoreName)
        self.node_capacity_keys = (c.resourceCoreName, c.resourceMemoryName)

    def allocation_keys(self) -> tuple[str, ...]:
        return (
            self.allocated_key,
            GPU_INDEX,
            PREDICATE_TIME,
            PREDICATE_NODE,
            "hami.io/mthreads-vgpu-devices-to-allocate",
        )

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        """Per card: memory `units x 512 / nums` MiB, cores `cores / nums` (integer division, HAMi)."""
        n = self._names
        limits = container_limits(container)
        nums = C.asked_count(container, limits, n.count)
        if nums is None:
            return None
        mem = 0
        if n.memory in limits:
            mem = to_mib(
                limits[n.memory], resource=C.field_name(container, n.memory), unit_mib=UNIT_MIB, per_card=True
            )
        cores = (
            to_count(limits[n.cores], resource=C.field_name(container, n.cores), unit="sGPU cores")
            if n.cores in limits
            else 0
        )
        return ContainerRequest(
            self.common_word, nums, mem // nums, 100 if mem == 0 else PERCENTAGE_UNSET, cores // nums
        )

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        n = self._names
        cores = C.capacity_count(node, n.cores, unit="sGPU cores")
        if cores is None:
            return None
        mem = C.capacity_count(node, n.memory, unit="512 MiB units") or 0
        name = objects.name(node)
        devmem = mem * UNIT_MIB * CORES_PER_CARD // cores if cores else 0
        return [
            Device(uuid=f"{name}-mthreads-{i}", index=i, count=100, devmem=devmem, devcore=CORES_PER_CARD,
                   type=self.common_word, vendor=self.common_word)
            for i in range((cores + CORES_PER_CARD - 1) // CORES_PER_CARD)
        ]  # fmt: skip

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        return C.same_card_fit(
            self, req, cards, usage, selection=selection, policy=policy, earlier=earlier, quota_ok=quota_ok
        )

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        return {
            self.allocated_key: A.encode_pod_devices(containers),
            GPU_INDEX: C.indexes(containers, context, last=True),
            PREDICATE_TIME: C.unix_ns(context),
            PREDICATE_NODE: context.node if context else "",
        }

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """HAMi's admission: count > 1 or a bare count = whole cards; one card's memory must be legal."""
        n = self._names
        present = container_limits(container)
        if n.count not in present:
            return MutationResult()
        count = to_count(present[n.count], resource=C.field_name(container, n.count))
        if count <= 0:
            raise InvalidRequest(f"container {container.get('name', '?')}: {n.count} must be greater than 0")
        limits = container.setdefault("resources", {}).setdefault("limits", {})
        if count > 1:
            limits[n.cores] = str(CORES_PER_CARD * count)
            limits[n.memory] = str(WHOLE_CARD_UNITS * count)
            pod.setdefault("metadata", {}).setdefault("annotations", {})[REQUEST_GPU_NUM] = str(count)
        elif n.memory not in limits:
            limits[n.cores] = str(CORES_PER_CARD)
            limits[n.memory] = str(WHOLE_CARD_UNITS)
        else:
            units = to_count(
                limits[n.memory], resource=C.field_name(container, n.memory), unit="512 MiB units"
            )
            if units not in LEGAL_UNITS:
                raise InvalidRequest(
                    "sGPU memory request value is invalid, valid values are [2, 4, 8, 16, 32, 64, 96]"
                )
        self.container_request(container)
        return MutationResult(uses_device=True)


def build(config: MthreadsConfig, device_config: Any) -> list[MthreadsVendor]:
    return [MthreadsVendor(config)]
