"""Building blocks shared by the non-NVIDIA vendors: HAMi's generic "sharing" vendor, its JSON and
capacity inventories, and the helpers the vendors' own fits use.

HAMi gives most backends one skeleton (count / memory / cores resources, `hami.io/<x>-devices-to-allocate`
and `-allocated` pod keys, `use-`/`nouse-` UUID annotations, the per-card checks of the generic fit);
`ShareVendor` is that skeleton with class attributes for the per-vendor constants, so a vendor module
states only its names, units, defaults and the rules that differ.

Quantities are strict here as everywhere in this project: where HAMi silently drops a request whose
quantity is not a whole number (the pod then schedules without the device), we reject it with an
`InvalidRequest` naming the container and resource (the webhook denies the pod with that message).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hami import annotations as A
from hami import objects
from hami.card_checks import check_card
from hami.errors import AnnotationError
from hami.model import PERCENTAGE_UNSET, ContainerDevice, ContainerRequest, Device, DeviceUsage, Selection
from hami.quantity import to_count, to_mib
from hami.reason_words import Reason
from hami.scoring import card_score, order_cards
from hami.vendors.base import (
    AllocationContext,
    MutationResult,
    ResourceNames,
    UsageOf,
    VendorBase,
    capacity,
    container_limits,
    split_list,
)

_ZERO = DeviceUsage()


_EMPTY: dict[str, Any] = {}


def gated(
    fn: Callable[[Any, Mapping[str, Any]], ContainerRequest | None],
) -> Callable[[Any, Mapping[str, Any]], ContainerRequest | None]:
    """Decorate a vendor's `container_request`: containers naming none of the vendor's `gate_keys`
    in limits or requests get None without building anything. Every filter asks every vendor about
    every container, and most containers ask for one vendor at most."""

    def container_request(self: Any, container: Mapping[str, Any]) -> ContainerRequest | None:
        res = container.get("resources")
        if res:
            lim = res.get("limits") or _EMPTY
            req = res.get("requests") or _EMPTY
            for k in self.gate_keys:
                if k in lim or k in req:
                    return fn(self, container)
        return None

    container_request.__doc__ = fn.__doc__
    container_request.__wrapped__ = fn  # type: ignore[attr-defined]
    return container_request


def field_name(container: Mapping[str, Any], resource: str) -> str:
    """How errors name a container's resource: ``container <name>: resources.limits[<resource>]``."""
    return f"container {container.get('name', '?')}: resources.limits[{resource}]"


def limits_only(container: Mapping[str, Any]) -> dict[str, Any]:
    """`resources.limits` alone (AMD and MetaX sGPU read limits only)."""
    return dict((container.get("resources") or {}).get("limits") or {})


def in_limits(container: Mapping[str, Any], resource: str) -> bool:
    return resource in limits_only(container)


def capacity_count(node: Mapping[str, Any], resource: str, *, unit: str = "devices") -> int | None:
    """`status.capacity[resource]` as a whole number of `unit`; None when absent. Raises AnnotationError
    when it is not a whole number (the node's inventory is then unusable, with that reason)."""
    value = capacity(node, resource)
    if value is None:
        return None
    try:
        return to_count(value, resource=f"status.capacity[{resource}]", unit=unit)
    except ValueError as e:
        raise AnnotationError(str(e)) from None


def capacity_cards(
    node: Mapping[str, Any], resource: str, card: Callable[[str, int, int], Device]
) -> list[Device] | None:
    """The inventory of a vendor whose cards are the node's `status.capacity[resource]` (GCU, MetaX GPU,
    Kunlunxin XPU, AWS Neuron): `card(node name, index, count)` for each index; None when the node has
    no such capacity. Raises AnnotationError when the capacity is not a whole number."""
    n = capacity_count(node, resource)
    if n is None:
        return None
    name = objects.name(node)
    return [card(name, i, n) for i in range(n)]


def asked_count(container: Mapping[str, Any], limits: Mapping[str, Any], resource: str) -> int | None:
    """How many devices `limits[resource]` asks; None when absent or 0 (the container asks nothing of
    the vendor). Raises InvalidRequest naming the container and resource when it is not a whole number."""
    if resource not in limits:
        return None
    return to_count(limits[resource], resource=field_name(container, resource)) or None


# ---------------------------------------------------------------------------------------------------
# JSON registration with Go's encoding/json semantics (HAMi device.UnMarshalNodeDevices).

_FIELDS = ("id", "index", "count", "devmem", "devcore", "type", "numa", "mode", "health", "custominfo")


def decode_register_json(value: str, *, vendor: str) -> list[tuple[Device, dict[str, Any]]]:
    """Decode a vendor JSON registration into (device, custominfo) pairs.

    Go semantics: keys match case-insensitively (``"ID"``, ``"Devmem"``), unknown keys are ignored
    (``devicepairscore``, ``devicevendor``), missing fields are zero (a missing ``health`` is false),
    ``"[]"`` is no device. Raises AnnotationError for invalid JSON, a non-array, a device without an id,
    one id listed twice, or a field of the wrong type.
    """
    raw = A.load_json(value)
    if not isinstance(raw, list):
        raise AnnotationError("must be a JSON array of devices")
    out = []
    seen: dict[str, int] = {}
    for i, obj in enumerate(raw):
        if not isinstance(obj, dict):
            raise AnnotationError(f"device {i}: must be a JSON object")
        norm: dict[str, Any] = {}
        for k, v in obj.items():
            lk = str(k).lower()
            if lk in _FIELDS and lk not in norm:
                norm[lk] = v
        uuid = norm.get("id")
        if not isinstance(uuid, str) or not uuid:
            raise AnnotationError(f"device {i}: field 'id' must be a non-empty string")
        A.check_card_id(uuid, f"device {i}")
        if uuid in seen:
            # One card listed twice would let a multi-card container get it twice.
            raise AnnotationError(
                f"devices {seen[uuid]} and {i} both have id {uuid!r}; every card must be listed once"
            )
        seen[uuid] = i
        where = f"device {i} ({uuid})"
        ints = {}
        for k in ("index", "count", "devmem", "devcore", "numa"):
            v = norm.get(k, 0)
            if isinstance(v, float) and v.is_integer():
                v = int(v)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise AnnotationError(f"{where}: field {k!r} must be an integer >= 0, got {v!r}")
            ints[k] = v
        dtype, mode, health = norm.get("type", ""), norm.get("mode", ""), norm.get("health", False)
        if not isinstance(dtype, str) or not isinstance(mode, str):
            raise AnnotationError(f"{where}: fields 'type' and 'mode' must be strings")
        if not isinstance(health, bool):
            raise AnnotationError(f"{where}: field 'health' must be true or false, got {health!r}")
        custom = norm.get("custominfo") or {}
        if not isinstance(custom, dict):
            raise AnnotationError(f"{where}: field 'custominfo' must be a JSON object")
        device = Device(
            uuid=uuid, index=ints["index"], count=ints["count"], devmem=ints["devmem"], devcore=ints["devcore"],
            type=dtype, numa=ints["numa"], mode=mode or "hami-core", health=health, vendor=vendor,
        )  # fmt: skip
        out.append((device, custom))
    return out


def register_json_cards(value: str, *, vendor: str) -> list[Device]:
    """The devices of a JSON registration, their custominfo left out (`decode_register_json`)."""
    return [d for d, _ in decode_register_json(value, vendor=vendor)]


# ---------------------------------------------------------------------------------------------------
# Fit helpers for vendors with their own algorithm.


def check_all(
    req: ContainerRequest,
    cards: Sequence[Device],
    usage: UsageOf,
    *,
    vendor: Any,
    selection: Selection,
    mutex: bool,
    quota_ok: Callable[[int, int], bool] | None = None,
) -> tuple[list[tuple[Device, DeviceUsage, int]], Counter]:
    """The generic per-card checks (`hami.card_checks.check_card`, HAMi's order) over every card.

    Returns the passing (card, usage, MiB) triples in card order and the reasons of the others.
    """
    passing = []
    reasons: Counter = Counter()
    for d in cards:
        u = usage(d.uuid)
        mem = req.memory_on(d)
        r = check_card(
            d, u, req, mem, selection, vendor, mutex=mutex, cordoned=frozenset(), quota_ok=quota_ok
        )
        if r is None:
            passing.append((d, u, mem))
        else:
            reasons[r] += 1
    return passing, reasons


#: A vendor's own rule on one card with its usage: the card's reason word, or None when it passes.
CardRule = Callable[[Device, DeviceUsage], Reason | None]


def scan(
    cards: Sequence[Device],
    usage: UsageOf,
    *,
    selection: Selection,
    mutex: bool,
    mem: Callable[[Device], int] | None = None,
    cores: CardRule | None = None,
    first: CardRule | None = None,
    busy: Callable[[Device, DeviceUsage], bool] | None = None,
    unhealthy: Reason = Reason.CARD_NOT_HEALTH,
) -> tuple[list[tuple[Device, DeviceUsage, int]], Counter]:
    """The per-card checks of the vendors' own fits (HAMi pkg/device/<vendor> Fit), in HAMi's order:
    health (reason `unhealthy`), the vendor's `first` rule (AMD's card type, MetaX's QoS), UUID, slots,
    the mutex policy (a card in use, or one the vendor calls `busy`), memory (`mem(card)` MiB, where
    the vendor counts memory) and the vendor's `cores` rule.

    Returns the passing (card, usage, MiB) triples in card order (MiB 0 without `mem`) and the reasons
    of the others.
    """
    passing = []
    reasons: Counter = Counter()
    for d in cards:
        u = usage(d.uuid)
        m = mem(d) if mem is not None else 0
        why: Reason | None
        if not d.health:
            why = unhealthy
        elif first is not None and (why := first(d, u)) is not None:
            pass
        elif not uuid_ok(d, selection):
            why = Reason.CARD_UUID_MISMATCH
        elif d.count <= u.used:
            why = Reason.CARD_TIME_SLICING_EXHAUSTED
        elif mutex and (u.used > 0 or (busy is not None and busy(d, u))):
            why = Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT
        elif mem is not None and d.devmem - u.usedmem < m:
            why = Reason.CARD_INSUFFICIENT_MEMORY
        else:
            why = cores(d, u) if cores is not None else None
        if why is None:
            passing.append((d, u, m))
        else:
            reasons[why] += 1
    return passing, reasons


def choose(
    passing: Sequence[tuple[Device, DeviceUsage, int]],
    reasons: Counter,
    req: ContainerRequest,
    policy: Any,
    device: Callable[[Device, DeviceUsage], ContainerDevice],
) -> tuple[list[ContainerDevice] | None, Counter]:
    """The end of a vendor's fit: the `req.nums` passing cards the card policy prefers, each as
    `device(card, usage)`, or the failed scan (`insufficient`) when fewer pass."""
    if len(passing) < req.nums:
        return insufficient(reasons, len(passing))
    return [device(d, u) for d, u in by_policy(passing, req, policy)[: req.nums]], reasons


def fewer_cards(req: ContainerRequest, cards: Sequence[Device]) -> tuple[None, Counter] | None:
    """HAMi's NodeInsufficientDevice (counted once per card, at least once) when the node has fewer
    cards than the container asks; None otherwise."""
    if req.nums > len(cards):
        return None, Counter({Reason.NODE_INSUFFICIENT_DEVICE: len(cards) or 1})
    return None


def by_policy(passing: Sequence[tuple[Device, DeviceUsage, int]], req: ContainerRequest, policy: Any) -> list:
    """Passing cards in the card policy's preference order (binpack fullest first, spread emptiest)."""
    cores = min(req.coresreq, 100)
    scored = [(d, u, card_score(d, u, mem=m, cores=cores, weights=policy.weights)) for d, u, m in passing]
    return [(d, u) for d, u, _ in order_cards(scored, policy.cards)]


def uuid_ok(device: Device, selection: Selection) -> bool:
    """HAMi CheckUUID: exact match on the use list (if any) and not on the nouse list."""
    if selection.use_uuids and device.uuid not in selection.use_uuids:
        return False
    return device.uuid not in selection.nouse_uuids


def take(d: Device, req: ContainerRequest, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=d.uuid, type=req.vendor, usedmem=mem, usedcores=cores)


def insufficient(reasons: Counter, found: int) -> tuple[None, Counter]:
    """A failed scan: `found` fitting cards were too few (HAMi AllocatedCardsInsufficientRequest)."""
    if found:
        reasons[Reason.ALLOCATED_CARDS_INSUFFICIENT_REQUEST] += found
    return None, reasons


def unix_ns(context: AllocationContext | None) -> str:
    """`time.Now().UnixNano()` of the allocation, as HAMi's predicate-time annotations write it."""
    now = context.now if context else 0.0
    whole = int(now)  # split: a float holds Unix seconds x 1e9 only to ~256 ns
    return str(whole * 1_000_000_000 + round((now - whole) * 1_000_000_000))


def indexes(
    containers: Sequence[Sequence[ContainerDevice]], context: AllocationContext | None, *, last: bool
) -> str:
    """Comma list of the card indexes of one container with devices (the first or the last such one)."""
    cards = context.cards if context else {}
    chosen = [c for c in containers if c]
    if not chosen:
        return ""
    pick = chosen[-1] if last else chosen[0]
    return ",".join(str(cards[cd.uuid].index if cd.uuid in cards else 0) for cd in pick)


# ---------------------------------------------------------------------------------------------------
# The generic sharing vendor.


class ShareVendor(VendorBase):
    """HAMi's generic backend: count + optional memory/cores resources, plain to/al pod keys.

    Subclasses set the constants: `common_word`, keys, `use_uuid_key`/`nouse_uuid_key`,
    `memory_unit_mib` (256 for Cambricon/Iluvatar, 512 for Moore Threads), `default_cores`
    (100 = exclusive unless asked, 0 = share compute) and `quota_memory_factor`; a vendor whose
    containers ask whole cards by count alone sets `whole_card`.
    """

    use_uuid_key = ""
    nouse_uuid_key = ""
    memory_unit_mib = 1
    default_cores = 100
    quota_memory_factor = 1
    #: (MiB, memory percent, cores percent) of the request each asked card stands for, for vendors
    #: whose containers ask whole cards by count alone (GCU, MetaX GPU, Kunlunxin, Biren, Vastai);
    #: None = read the memory and cores resources.
    whole_card: tuple[int, int, int] | None = None

    def __init__(self, count: str, memory: str | None = None, cores: str | None = None) -> None:
        self._names = ResourceNames(
            count=count, memory=memory, cores=cores, memory_factor=self.quota_memory_factor
        )
        #: Resources whose presence makes a container worth reading (`gated`): the count by default.
        self.gate_keys: tuple[str, ...] = (count,)

    def resource_names(self) -> ResourceNames:
        return self._names

    def user_annotation_keys(self) -> tuple[str, ...]:
        return tuple(k for k in (self.use_uuid_key, self.nouse_uuid_key) if k)

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return Selection(
            use_uuids=split_list(annotations.get(self.use_uuid_key), field=self.use_uuid_key)
            if self.use_uuid_key
            else (),
            nouse_uuids=split_list(annotations.get(self.nouse_uuid_key), field=self.nouse_uuid_key)
            if self.nouse_uuid_key
            else (),
        )

    # -- requests ------------------------------------------------------------------------------

    def read_limits(self, container: Mapping[str, Any]) -> dict[str, Any]:
        """Limits first, then requests (HAMi); vendors reading limits only override."""
        return container_limits(container)

    @gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        """`nums` from the count; memory in `memory_unit_mib` units (absent = whole card); cores in
        percent (absent = `default_cores`). Raises InvalidRequest for quantities that are not whole."""
        n = self._names
        limits = self.read_limits(container)
        nums = asked_count(container, limits, n.count)
        if nums is None:
            return None
        if self.whole_card is not None:
            return ContainerRequest(self.common_word, nums, *self.whole_card)
        memreq = 0
        if n.memory and n.memory in limits:
            memreq = to_mib(
                limits[n.memory],
                resource=field_name(container, n.memory),
                unit_mib=self.memory_unit_mib,
                per_card=True,
            )
        cores = self.default_cores
        if n.cores and n.cores in limits:
            cores = to_count(limits[n.cores], resource=field_name(container, n.cores), unit="percent")
        return ContainerRequest(
            vendor=self.common_word, nums=nums, memreq=memreq,
            mem_percentage=100 if memreq == 0 else PERCENTAGE_UNSET, coresreq=cores,
        )  # fmt: skip

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """Found iff the count is in limits (HAMi); the quantities are validated by building the request."""
        if not in_limits(container, self._names.count):
            return MutationResult()
        self.container_request(container)
        return MutationResult(uses_device=True)

    # -- allocation ----------------------------------------------------------------------------

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        encoded = A.encode_pod_devices(containers)
        return {k: encoded for k in (self.to_allocate_key, self.allocated_key) if k}


def same_card_fit(
    vendor: Any,
    req: ContainerRequest,
    cards: Sequence[Device],
    usage: UsageOf,
    *,
    selection: Selection,
    policy: Any,
    earlier: Sequence[Sequence[ContainerDevice]],
    quota_ok: Callable[[int, int], bool] | None,
) -> tuple[list[ContainerDevice] | None, Counter]:
    """The generic fit plus HAMi's custom rule (MetaX GPU, Moore Threads): every card given to an
    earlier container of the pod (same phase) must be this card, so containers can share one card
    only; a container's own several cards are not checked against each other. A card failing only
    this rule counts as CardNotFoundCustomFilterRule (the last check, as in HAMi)."""
    if (short := fewer_cards(req, cards)) is not None:
        return short
    taken = {cd.uuid for c in earlier for cd in c}
    passing, reasons = check_all(
        req, cards, usage, vendor=vendor, selection=selection, mutex=policy.mutex, quota_ok=quota_ok
    )
    if taken:
        kept = [p for p in passing if taken == {p[0].uuid}]
        reasons[Reason.CARD_NOT_FOUND_CUSTOM_FILTER_RULE] += len(passing) - len(kept)
        passing = kept
    cores = min(req.coresreq, 100)
    return choose(passing, reasons, req, policy, lambda d, _: take(d, req, req.memory_on(d), cores))
