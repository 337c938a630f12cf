"""Kunlunxin XPUs: whole cards on the 8-card interconnect board (CommonWord `kunlun`) and vXPU memory
templates (`XPU`).

HAMi pkg/device/kunlun. Both pick cards with HAMi's board rule: indexes 0-3 are the left wing, 4-7 the
right; 8 cards take the board, 1, 2 or 4 cards come from one wing when a wing has enough free cards
(the wing with the fewest free cards that fits wins, which packs), else across the wings over the
interconnect (pairs 0-4, 1-5, 2-6, 3-7; quads 0-1-4-5, 2-3-6-7, 0-2-4-6, 1-3-5-7, 0-3-4-7, 1-2-5-6);
other counts never fit. Failure: `CardUuidMismatch` for cards the UUID rules exclude, else `NumaNotFit`.

- Whole XPU: `kunlunxin.com/xpu` capacity -> `<node>-kunlun-<i>` (98304 MiB, the upper half on NUMA 1 as
  HAMi registers it); a card is free only when idle. The plugin reads `BAIDU_COM_DEVICE_IDX` (the card
  indexes of the last container with cards); no node lock, allocated key for accounting only.
- vXPU: `hami.io/node-register-xpu` JSON, handshake `hami.io/node-handshake-xpu`, node lock; memory is
  rounded up to a template (24576, 49152 or 98304 MiB; none = the whole card) and the compute share is
  `memory x 100 / 98304`; only slices of the same size share a card.

Difference from HAMi: the board positions are the cards' registered indexes (HAMi uses positions in a
policy-sorted list, so its wings drift once usage differs); the "bubble" node score is not implemented.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami.model import ContainerDevice, ContainerRequest, Device, Selection
from hami.quantity import to_mib
from hami.reason_words import Reason
from hami.vendors import common as C
from hami.vendors.base import AllocationContext, MutationResult, container_limits, registered, split_list

FULL_MIB = 98304
TEMPLATES = (24576, 49152, FULL_MIB)
DEVICE_IDX = "BAIDU_COM_DEVICE_IDX"
UUID_KEYS = (
    "hami.io/use-xpu-uuid",
    "hami.io/no-use-xpu-uuid",
    "baidu.com/use-gpuuuid",
    "baidu.com/nouse-gpuuuid",
)
PAIRS = ((0, 4), (1, 5), (2, 6), (3, 7))
QUADS = ((0, 1, 4, 5), (2, 3, 6, 7), (0, 2, 4, 6), (1, 3, 5, 7), (0, 3, 4, 7), (1, 2, 5, 6))


@dataclass(frozen=True)
class KunlunConfig:
    """The `kunlun:` section (HAMi chart `devices.kunlun`, pkg/device/kunlun)."""

    resourceCountName: str = "kunlunxin.com/xpu"
    """Whole XPUs per container (also the node capacity the cards come from). Default `kunlunxin.com/xpu`."""
    resourceVCountName: str = "kunlunxin.com/vxpu"
    """vXPUs per container. Default `kunlunxin.com/vxpu` (HAMi chart)."""
    resourceVMemoryName: str = "kunlunxin.com/vxpu-memory"
    """Per-vXPU memory in MiB, rounded up to 24576, 49152 or 98304. Default `kunlunxin.com/vxpu-memory`."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""


@dataclass(frozen=True, slots=True)
class XPUSelection(Selection):
    """Both UUID rule sets must pass (HAMi checks the `hami.io` and the `baidu.com` annotations)."""

    use_uuids2: tuple[str, ...] = ()
    nouse_uuids2: tuple[str, ...] = ()


def xpu_selection(annotations: Mapping[str, str]) -> XPUSelection:
    a, b, c, d = (split_list(annotations.get(k), field=k) for k in UUID_KEYS)
    return XPUSelection(use_uuids=a, nouse_uuids=b, use_uuids2=c, nouse_uuids2=d)


def uuid_ok(device: Device, sel: Selection) -> bool:
    if not C.uuid_ok(device, sel):
        return False
    if isinstance(sel, XPUSelection):
        if sel.use_uuids2 and device.uuid not in sel.use_uuids2:
            return False
        return device.uuid not in sel.nouse_uuids2
    return True


def trim_memory(mib: int) -> int:
    """HAMi trimMemory: the smallest template >= `mib` (0 -> 24576), else the whole card."""
    return next((t for t in TEMPLATES if mib <= t), FULL_MIB)


def board_select(free: set[int], nums: int) -> list[int] | None:
    """HAMi's board choice of `nums` card indexes among `free` ones (see the module docstring)."""
    if nums == 8:
        return list(range(8)) if set(range(8)) <= free else None
    if nums not in (1, 2, 4):
        return None
    wings = ([i for i in range(4) if i in free], [i for i in range(4, 8) if i in free])
    if any(len(w) >= nums for w in wings):
        for slots in range(nums, 5):
            want = (1, 3, 2, 4)[slots - 1] if nums == 1 else slots
            for w in wings:
                if len(w) == want:
                    return w[:nums]
    if nums == 2:
        return next((list(p) for p in PAIRS if set(p) <= free), None)
    if nums == 4:
        fitting = [q for q in QUADS if set(q) <= free]
        if not fitting:
            return None
        if len(free) == 6:
            for q in fitting:
                rest = free - set(q)
                if any(set(p) == rest for p in PAIRS):
                    return list(q)
            return list(fitting[-1])
        return list(fitting[0])
    return None


def board_fit(
    req: ContainerRequest,
    cards: Sequence[Device],
    fits: Any,
    selection: Selection,
    mem: int,
    cores: int,
    *,
    mutex: bool = False,
    usage: Any = None,
) -> tuple[list[ContainerDevice] | None, Counter]:
    """Shared board fit: `fits(card)` says whether a card can take one share."""
    by_index = {d.index: d for d in cards}
    free, uuid_miss, mutex_miss = set(), 0, 0
    for d in cards:
        if not uuid_ok(d, selection):
            uuid_miss += 1
        elif fits(d):
            if mutex and usage(d.uuid).used > 0:
                mutex_miss += 1
            else:
                free.add(d.index)
    chosen = board_select(free, req.nums)
    if chosen is None:
        if mutex_miss:
            return None, Counter({Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT: mutex_miss})
        if uuid_miss:
            return None, Counter({Reason.CARD_UUID_MISMATCH: uuid_miss})
        return None, Counter({Reason.NUMA_NOT_FIT: 1})
    return [C.take(by_index[i], req, mem if mem else by_index[i].devmem, cores if cores else by_index[i].devcore)
            for i in chosen], Counter()  # fmt: skip


class KunlunVendor(C.ShareVendor):
    common_word = "kunlun"
    allocated_key = "hami.io/kunlun-allocated"
    custom_fit = True
    whole_card = (0, 100, 0)

    def __init__(self, config: KunlunConfig | None = None) -> None:
        self.config = c = config or KunlunConfig()
        super().__init__(c.resourceCountName)
        self.node_capacity_keys = (c.resourceCountName,)

    def user_annotation_keys(self) -> tuple[str, ...]:
        return UUID_KEYS

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.allocated_key, DEVICE_IDX)

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return xpu_selection(annotations)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return C.capacity_cards(node, self._names.count, lambda name, i, n: Device(
            uuid=f"{name}-kunlun-{i}", index=i, count=100, devmem=FULL_MIB, devcore=100, type="kunlun",
            numa=1 if i >= n // 2 else 0, vendor="kunlun",
        ))  # fmt: skip

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        return board_fit(req, cards, lambda d: d.health and usage(d.uuid).used == 0, selection, 0, 0)

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        return {
            self.allocated_key: A.encode_pod_devices(containers),
            DEVICE_IDX: C.indexes(containers, context, last=True),
        }


class XPUVendor(C.ShareVendor):
    common_word = "XPU"
    register_key = "hami.io/node-register-xpu"
    handshake_key = "hami.io/node-handshake-xpu"
    to_allocate_key = "hami.io/xpu-devices-to-allocate"
    allocated_key = "hami.io/xpu-devices-allocated"
    uses_node_lock = True
    custom_fit = True

    def __init__(self, config: KunlunConfig | None = None) -> None:
        self.config = c = config or KunlunConfig()
        super().__init__(c.resourceVCountName, c.resourceVMemoryName)

    def user_annotation_keys(self) -> tuple[str, ...]:
        return UUID_KEYS

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return xpu_selection(annotations)

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        req = super().container_request(container)
        if req is None:
            return None
        limits = container_limits(container)
        if self._names.memory in limits:
            mem = trim_memory(
                to_mib(
                    limits[self._names.memory],
                    resource=C.field_name(container, self._names.memory),
                    per_card=True,
                )
            )
            return ContainerRequest(self.common_word, req.nums, mem, 101, mem * 100 // FULL_MIB)
        return ContainerRequest(self.common_word, req.nums, FULL_MIB, 100, 100)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return registered(
            node, self.register_key, lambda v: C.register_json_cards(v, vendor=self.common_word)
        )

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        def fits(d: Device) -> bool:
            u = usage(d.uuid)
            return (
                d.health
                and req.memreq + u.usedmem <= d.devmem
                and (u.used == 0 or u.usedmem // u.used == req.memreq)
            )

        return board_fit(
            req, cards, fits, selection, req.memreq, req.coresreq, mutex=policy.mutex, usage=usage
        )

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """Count in limits: memory in limits is rounded up to its template in limits and requests."""
        n = self._names
        if not C.in_limits(container, n.count):
            return MutationResult()
        res = container["resources"]
        if n.memory in (res.get("limits") or {}):
            mem = trim_memory(
                to_mib(res["limits"][n.memory], resource=C.field_name(container, n.memory), per_card=True)
            )
            res["limits"][n.memory] = str(mem)
            res.setdefault("requests", {})[n.memory] = str(mem)
        self.container_request(container)
        return MutationResult(uses_device=True)


def build(config: KunlunConfig, device_config: Any) -> list[Any]:
    return [KunlunVendor(config), XPUVendor(config)]
