"""Enflame: whole GCUs (CommonWord `GCU`, from node capacity) and DRS hard partitions (`Enflame`).

HAMi pkg/device/enflame. Two backends from one `enflame:` section:

- Whole GCU: `enflame.com/gcu` capacity -> cards `<node>-GCU-<i>` (1 slot, 100 "MiB", 100 cores, as
  HAMi registers them); a card is taken only when idle (ExclusiveDeviceAllocateConflict otherwise).
  The plugin allocates by kubelet device IDs: no node lock.
- DRS: Enflame's `gcushare-device-plugin` publishes `enflame.com/gcu-drs-capacity` (cards with their
  slice capacity and the node's profiles `"<N>g.<M>gb": "<profile id>"`). A container asks either for a
  profile size (`enflame.com/drs-gcu: 2` = the 2-slice profile) or for memory and cores
  (`enflame.com/gcu-memory`, `enflame.com/gcu-core`), which pick the smallest profile that holds both;
  each profile's compute share is `ceil(size x 100 / largest size)` percent. One card per container.
  The plugin finds the pod by `enflame.com/gcu-assigned: "false"`, reads its container's entry in
  `assigned-containers` and creates the partition on `enflame.com/gcu-assigned-index`; no node lock.

Differences from HAMi: a DRS card's usage is counted in memory and compute (HAMi's slot counter is
restored as a container count after a restart, so both count the same); `enflame.com/gcu-memory` with
a unit (`16Gi`) is converted to MiB instead of being read as bytes; non-whole quantities are rejected.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami import objects
from hami.errors import AnnotationError, InvalidRequest
from hami.model import ContainerDevice, ContainerRequest, Device, DeviceUsage
from hami.quantity import INT32_MAX, to_count, to_mib
from hami.reason_words import Reason
from hami.vendors import common as C
from hami.vendors.base import AllocationContext, MutationResult, ResourceNames, container_limits

DRS_CAPACITY = "enflame.com/gcu-drs-capacity"
ASSIGNED = "enflame.com/gcu-assigned"
ASSIGNED_TIME = "enflame.com/gcu-assigned-time"
ASSIGNED_INDEX = "enflame.com/gcu-assigned-index"
ASSIGNED_ID = "enflame.com/gcu-assigned-id"
ASSIGNED_MINOR = "enflame.com/gcu-assigned-minor"
REQUEST_SIZE = "enflame.com/gcu-request-size"
ASSIGNED_CONTAINERS = "assigned-containers"
#: mem_percentage markers of a DRS request: memreq is a profile size / a memory amount.
DIRECT, BY_SPEC = 0, -1


@dataclass(frozen=True)
class EnflameConfig:
    """The `enflame:` section (HAMi chart `devices.enflame`, pkg/device/enflame)."""

    resourceNameGCU: str = "enflame.com/gcu"
    """Whole GCUs per container (also the node capacity the cards come from). Default `enflame.com/gcu`."""
    resourceNameDRSGCU: str = "enflame.com/drs-gcu"
    """DRS profile size in slices (one partition per container); "" = `resourceNameVGCU`, then `enflame.com/drs-gcu`. Default `enflame.com/drs-gcu`."""
    resourceNameGCUMemory: str = "enflame.com/gcu-memory"
    """DRS memory: GB, or MiB when above twice the largest profile's GB; "" = `enflame.com/gcu-memory`. Default `enflame.com/gcu-memory`."""
    resourceNameGCUCore: str = "enflame.com/gcu-core"
    """DRS compute in percent, 1..100; "" = `enflame.com/gcu-core`. Default `enflame.com/gcu-core`."""
    resourceNameVGCU: str = ""
    """Legacy name, used only as the fallback of an empty `resourceNameDRSGCU`. Default ""."""
    resourceNameVGCUPercentage: str = ""
    """Legacy name, accepted and unused (HAMi v2.10). Default ""."""

    def validate(self) -> None:
        """Nothing to check beyond the types."""

    @property
    def drs_names(self) -> tuple[str, str, str]:
        return (
            self.resourceNameDRSGCU or self.resourceNameVGCU or "enflame.com/drs-gcu",
            self.resourceNameGCUMemory or "enflame.com/gcu-memory",
            self.resourceNameGCUCore or "enflame.com/gcu-core",
        )


class GCUVendor(C.ShareVendor):
    common_word = "GCU"
    to_allocate_key = "hami.io/enflame-gcu-devices-to-allocate"
    allocated_key = "hami.io/enflame-gcu-devices-allocated"
    custom_fit = True
    whole_card = (100, 100, 100)

    def __init__(self, config: EnflameConfig | None = None) -> None:
        self.config = c = config or EnflameConfig()
        super().__init__(c.resourceNameGCU)
        self.node_capacity_keys = (c.resourceNameGCU,)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return C.capacity_cards(
            node,
            self._names.count,
            lambda name, i, _: Device(
                uuid=f"{name}-GCU-{i}", index=i, count=1, devmem=100, devcore=100, type="GCU", vendor="GCU"
            ),
        )

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        if (short := C.fewer_cards(req, cards)) is not None:
            return short
        reasons: Counter = Counter()
        passing = []
        for d in cards:
            u = usage(d.uuid)
            if not d.health:
                reasons[Reason.CARD_NOT_HEALTH] += 1
            elif u.used > 0:
                reasons[Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT] += 1
            else:
                passing.append((d, u, 100))
        return C.choose(passing, reasons, req, policy, lambda d, _: C.take(d, req, 100, 100))


@dataclass(frozen=True, slots=True)
class Profile:
    """One DRS profile: `size` slices, `mem_gb` GB, `cores` percent of the card, and its name and ID."""

    size: int
    mem_gb: int
    cores: int
    name: str
    id: str


@dataclass(frozen=True, slots=True)
class DRSDevice(Device):
    """A DRS-partitionable card: its minor number, index string and the node's profiles."""

    minor: str = ""
    index_str: str = ""
    profiles: tuple[Profile, ...] = field(default_factory=tuple)


def parse_profiles(raw: Mapping[str, Any]) -> tuple[Profile, ...]:
    """Profiles from `{"<N>g.<M>gb": "<id>"}` sorted by size then memory; cores = ceil(size x 100 / max).

    Raises AnnotationError when no profile has a size > 0.
    """
    parsed = []
    for name, pid in raw.items():
        parts = str(name).lower().split(".")
        try:
            size = int(parts[0].removesuffix("g"))
        except ValueError:
            continue
        try:
            mem = int(parts[1].removesuffix("gb")) if len(parts) > 1 else 0
        except ValueError:
            mem = 0
        if size > 0:
            parsed.append((size, mem, str(name), str(pid)))
    if not parsed:
        raise AnnotationError("profiles: no profile of size > 0 (want names like '2g.16gb')")
    max_slice = max(p[0] for p in parsed)
    return tuple(
        sorted((Profile(s, m, math.ceil(s * 100 / max_slice), n, i) for s, m, n, i in parsed),
               key=lambda p: (p.size, p.mem_gb))
    )  # fmt: skip


class DRSVendor(C.ShareVendor):
    common_word = "Enflame"
    register_key = DRS_CAPACITY
    allocated_key = "hami.io/enflame-vgpu-devices-allocated"
    use_uuid_key = "enflame.com/use-gpuuuid"
    nouse_uuid_key = "enflame.com/nouse-gpuuuid"
    custom_fit = True

    def __init__(self, config: EnflameConfig | None = None) -> None:
        self.config = config or EnflameConfig()
        size, mem, core = self.config.drs_names
        super().__init__(size, mem, core)
        self._names = ResourceNames(count=size, memory=mem, cores=core)
        self.gate_keys = (size, mem, core)

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.allocated_key, ASSIGNED, ASSIGNED_TIME, ASSIGNED_INDEX, ASSIGNED_ID, ASSIGNED_MINOR,
                REQUEST_SIZE, ASSIGNED_CONTAINERS)  # fmt: skip

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        """`drs-gcu: N` -> the N-slice profile (memreq = N, DIRECT); else memory/cores (BY_SPEC)."""
        size_name, mem_name, core_name = self._names.count, self._names.memory, self._names.cores
        limits = container_limits(container)
        if size_name in limits:
            size = to_count(limits[size_name], resource=C.field_name(container, size_name), unit="slices")
            if size > 0:
                return ContainerRequest(self.common_word, 1, size, DIRECT, 0)
        if mem_name not in limits and core_name not in limits:
            return None
        mem = (
            to_mib(limits[mem_name], resource=C.field_name(container, mem_name)) if mem_name in limits else 0
        )
        core = (
            to_count(limits[core_name], resource=C.field_name(container, core_name), unit="percent")
            if core_name in limits
            else 0
        )
        return ContainerRequest(self.common_word, 1, mem, BY_SPEC, core)

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """HAMi's checks: size > 0, memory > 0, cores in (0,100]; limits and requests mirrored."""
        size_name, mem_name, core_name = self._names.count, self._names.memory, self._names.cores
        present = container_limits(container)
        cname = container.get("name", "?")
        names = (size_name,) if size_name in present else (mem_name, core_name)
        if not any(n in present for n in names):
            return MutationResult()
        res = container.setdefault("resources", {})
        limits, requests = res.setdefault("limits", {}), res.setdefault("requests", {})
        if size_name in present:
            if to_count(present[size_name], resource=C.field_name(container, size_name), unit="slices") <= 0:
                raise InvalidRequest(f"container {cname}: {size_name} must be greater than 0")
        else:
            if (
                mem_name in present
                and to_mib(present[mem_name], resource=C.field_name(container, mem_name)) <= 0
            ):
                raise InvalidRequest(f"container {cname}: {mem_name} must be greater than 0")
            if core_name in present:
                core = to_count(
                    present[core_name], resource=C.field_name(container, core_name), unit="percent"
                )
                if not 0 < core <= 100:
                    raise InvalidRequest(f"container {cname}: {core_name} must be in range (0,100]")
        for n in names:
            if n in present:
                limits.setdefault(n, present[n])
                requests.setdefault(n, present[n])
        return MutationResult(uses_device=True)

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        """Cards of `enflame.com/gcu-drs-capacity`. Raises AnnotationError (whole node) for a bad value."""
        value = A.pod_annotations(node).get(DRS_CAPACITY)
        if value is None:
            return None
        raw = A.load_json(value)
        if (
            not isinstance(raw, dict)
            or not isinstance(raw.get("devices"), list)
            or not isinstance(raw.get("profiles"), dict)
        ):
            raise AnnotationError('must be a JSON object {"devices": [...], "profiles": {...}}')
        profiles = parse_profiles(raw["profiles"])
        max_gb = max(p.mem_gb for p in profiles) or max(p.size for p in profiles)
        name = objects.name(node)
        out: list[Device] = []
        for pos, d in enumerate(raw["devices"]):
            if not isinstance(d, dict):
                raise AnnotationError(f"devices[{pos}]: must be a JSON object")
            index_str = str(d.get("index", pos))
            index = int(index_str) if re.fullmatch(r"[0-9]+", index_str) else pos
            cap = d.get("capacity")
            if isinstance(cap, str):
                try:
                    cap = float(cap)
                except ValueError:
                    cap = None
            if (
                isinstance(cap, bool)
                or not isinstance(cap, int | float)
                or not math.isfinite(cap)
                or not 0 < cap <= INT32_MAX
            ):
                raise AnnotationError(
                    f"devices[{pos}]: capacity {d.get('capacity')!r} must be a number of slices > 0"
                )
            out.append(
                DRSDevice(
                    uuid=f"{name}-enflame-drs-{index}",
                    index=index,
                    count=int(cap),
                    devmem=max_gb * 1024,
                    devcore=100,
                    type=self.common_word,
                    vendor=self.common_word,
                    minor=str(d.get("minor") or index),
                    index_str=index_str,
                    profiles=profiles,
                )  # fmt: skip
            )
        return out

    @staticmethod
    def pick_profile(req: ContainerRequest, profiles: Sequence[Profile]) -> Profile | None:
        """The profile of a request: the exact size (DIRECT), else the smallest holding memory and cores."""
        if not profiles:
            return None
        if req.mem_percentage == DIRECT:
            return next((p for p in profiles if p.size == req.memreq), None)
        gb = 0
        if req.memreq > 0:
            largest = max(p.mem_gb for p in profiles)
            gb = math.ceil(req.memreq / 1024) if req.memreq > 2 * largest else req.memreq
        return next(
            (
                p
                for p in profiles
                if (gb <= 0 or p.mem_gb >= gb) and (req.coresreq <= 0 or p.cores >= req.coresreq)
            ),
            None,
        )

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        profiles = next((d.profiles for d in cards if isinstance(d, DRSDevice)), ())
        prof = self.pick_profile(req, profiles)
        if prof is None or prof.mem_gb <= 0:
            # HAMi: no profile, or a profile whose memory is out of range (its name's "<M>gb" part
            # unreadable, read as 0) -> ModeNotFit; a partition of 0 MiB is never placed.
            return None, Counter({Reason.MODE_NOT_FIT: 1})
        mem = prof.mem_gb * 1024

        def cores(d: Device, u: DeviceUsage) -> Reason | None:
            short = d.devcore > 0 and d.devcore - u.usedcores < prof.cores
            return Reason.CARD_INSUFFICIENT_CORE if short else None

        passing, reasons = C.scan(
            cards, usage, selection=selection, mutex=policy.mutex, mem=lambda _: mem, cores=cores
        )
        # One partition per container, whatever the count: the policy orders the cards for one.
        scored = ContainerRequest(req.vendor, 1, mem, 0, prof.cores)
        return C.choose(passing, reasons, scored, policy, lambda d, _: C.take(d, req, mem, prof.cores))

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        cards = context.cards if context else {}
        names = context.container_names if context else ()
        out = {
            self.allocated_key: A.encode_pod_devices(containers),
            ASSIGNED: "false",
            ASSIGNED_TIME: C.unix_ns(context),
        }
        assigned: dict[str, Any] = {}
        first = True
        for i, c in enumerate(containers):
            if not c:
                continue
            cd = c[0]
            d = cards.get(cd.uuid)
            prof = None
            if isinstance(d, DRSDevice):
                prof = next(
                    (p for p in d.profiles if p.mem_gb * 1024 == cd.usedmem and p.cores == cd.usedcores), None
                )
            size = prof.size if prof else 0
            name = names[i] if i < len(names) else str(i)
            assigned[name] = {"allocated": False, "request": size, "profileID": prof.id if prof else "",
                              "profileName": prof.name if prof else ""}  # fmt: skip
            if first and isinstance(d, DRSDevice):
                out[ASSIGNED_INDEX] = out[ASSIGNED_ID] = d.index_str
                out[ASSIGNED_MINOR] = d.minor
                out[REQUEST_SIZE] = str(size)
                first = False
        out[ASSIGNED_CONTAINERS] = json.dumps(dict(sorted(assigned.items())), separators=(",", ":"))
        return out


def build(config: EnflameConfig, device_config: Any) -> list[Any]:
    return [GCUVendor(config), DRSVendor(config)]
