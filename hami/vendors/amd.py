"""AMD Instinct GPUs (CommonWord `AMD`): memory in MiB and compute as a percentage of the card's CUs.

HAMi pkg/device/amd, with Project-HAMi/amd-device-plugin. The plugin registers `hami.io/node-amd-register`
(HAMi's JSON; `devcore` is the card's number of compute units, `type` its product name such as
`AMD Instinct MI300X VF`), pops the container's entry of `hami.io/amd-devices-to-allocate` under
`hami.io/mutex.lock` and sets `HIP_DEVICE_MEMORY_LIMIT` and `HSA_CU_MASK` from it. Resources are read
from limits only; `amd.com/gpucores` is a percentage 1..100 (default 100) that the fit turns into CUs
(`devcore x pct / 100`, at least 1), and the device list carries CUs. No exclusivity check beyond the
CUs themselves, as in HAMi. Type rules `amd.com/use-gputype` / `nouse-gputype` are case-insensitive
substrings of the product name.
Differences from HAMi: entries are padded per container even though the device type is the product
name (HAMi pads by device type and so misaligns multi-container pods); quota on `amd.com/gpucores`
counts CUs, as HAMi does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hami.errors import InvalidRequest
from hami.model import ContainerDevice, ContainerRequest, Device, DeviceUsage, Selection
from hami.quantity import to_count, to_mib
from hami.reason_words import Reason
from hami.vendors import common as C
from hami.vendors.base import MutationResult, registered, split_list


@dataclass(frozen=True)
class AMDConfig:
    """The `amd:` section (HAMi chart `devices.amd`, pkg/device/amd)."""

    resourceCountName: str = "amd.com/gpu"
    """GPUs per container (limits only). Default `amd.com/gpu` (HAMi chart)."""
    resourceMemoryName: str = "amd.com/gpumem"
    """Per-GPU memory in MiB (limits only; absent = the whole card). Default `amd.com/gpumem`."""
    resourceCoreName: str = "amd.com/gpucores"
    """Per-GPU compute in percent of its CUs, 1..100 (limits only; absent = 100). Default `amd.com/gpucores`."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


class AMDVendor(C.ShareVendor):
    common_word = "AMD"
    register_key = "hami.io/node-amd-register"
    to_allocate_key = "hami.io/amd-devices-to-allocate"
    allocated_key = "hami.io/amd-devices-allocated"
    use_uuid_key = "amd.com/use-gpu-uuid"
    nouse_uuid_key = "amd.com/nouse-gpu-uuid"
    use_type_key = "amd.com/use-gputype"
    nouse_type_key = "amd.com/nouse-gputype"
    uses_node_lock = True
    custom_fit = True

    def __init__(self, config: AMDConfig | None = None) -> None:
        self.config = c = config or AMDConfig()
        super().__init__(c.resourceCountName, c.resourceMemoryName, c.resourceCoreName)

    def user_annotation_keys(self) -> tuple[str, ...]:
        return (self.use_uuid_key, self.nouse_uuid_key, self.use_type_key, self.nouse_type_key)

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return Selection(
            use_types=split_list(annotations.get(self.use_type_key), field=self.use_type_key),
            nouse_types=split_list(annotations.get(self.nouse_type_key), field=self.nouse_type_key),
            use_uuids=split_list(annotations.get(self.use_uuid_key), field=self.use_uuid_key),
            nouse_uuids=split_list(annotations.get(self.nouse_uuid_key), field=self.nouse_uuid_key),
        )

    def type_matches(self, device: Device, selection: Selection) -> bool:
        t = device.type.lower()
        if selection.use_types and not any(u.lower() in t for u in selection.use_types):
            return False
        return not any(u.lower() in t for u in selection.nouse_types)

    def read_limits(self, container: Mapping[str, Any]) -> dict[str, Any]:
        return C.limits_only(container)

    def _cores(self, container: Mapping[str, Any], limits: Mapping[str, Any]) -> int:
        n = self._names
        if n.cores not in limits:
            return 100
        pct = to_count(limits[n.cores], resource=C.field_name(container, n.cores), unit="percent")
        if not 1 <= pct <= 100:
            raise InvalidRequest(
                f"container {container.get('name', '?')}: {n.cores} must be an integer percentage between 1 and 100"
            )
        return pct

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        n = self._names
        limits = C.limits_only(container)
        nums = C.asked_count(container, limits, n.count)
        if nums is None:
            return None
        mem = (
            to_mib(limits[n.memory], resource=C.field_name(container, n.memory), per_card=True)
            if n.memory in limits
            else 0
        )
        return ContainerRequest(
            self.common_word, nums, mem, 100 if mem == 0 else 101, self._cores(container, limits)
        )

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """Found when any AMD resource is in limits (a memory-only container asks for nothing)."""
        n = self._names
        limits = C.limits_only(container)
        if not any(r in limits for r in (n.count, n.memory, n.cores)):
            return MutationResult()
        if n.count in limits:
            self.container_request(container)
        return MutationResult(uses_device=True)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return registered(
            node, self.register_key, lambda v: C.register_json_cards(v, vendor=self.common_word)
        )

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        if (short := C.fewer_cards(req, cards)) is not None:
            return short
        typed = bool(selection.use_types or selection.nouse_types)

        def mem(d: Device) -> int:
            return req.memreq if req.memreq > 0 else d.devmem

        def cu(d: Device) -> int:
            """The compute units `req.coresreq` percent of the card is (at least 1, at most all)."""
            return min(max(d.devcore * req.coresreq // 100, 1), d.devcore)

        def type_rule(d: Device, _: DeviceUsage) -> Reason | None:
            return Reason.CARD_TYPE_MISMATCH if typed and not self.type_matches(d, selection) else None

        def cores(d: Device, u: DeviceUsage) -> Reason | None:
            return (
                Reason.CARD_INSUFFICIENT_CORE if d.devcore <= 0 or d.devcore - u.usedcores < cu(d) else None
            )

        passing, reasons = C.scan(
            cards, usage, selection=selection, mutex=policy.mutex, mem=mem, cores=cores, first=type_rule
        )
        return C.choose(
            passing,
            reasons,
            req,
            policy,
            lambda d, _: ContainerDevice(uuid=d.uuid, type=d.type, usedmem=mem(d), usedcores=cu(d)),
        )


def build(config: AMDConfig, device_config: Any) -> list[AMDVendor]:
    return [AMDVendor(config)]
