"""Huawei Ascend NPUs: one vendor per `vnpus.configs` entry (CommonWord = chip, e.g. `Ascend910B3`), hard
vNPU templates or the soft `hami-core` split.

HAMi pkg/device/ascend, with Project-HAMi/ascend-device-plugin; enabled by `scheduler.enableAscend`
(HAMi `--enable-ascend`, chart `devices.ascend.enabled`). The plugin registers
`hami.io/node-register-<CW>` (HAMi's JSON, `custominfo.NetworkID` on 910 chips), answers
`hami.io/node-handshake-<CW>`, writes node annotation `hami-vnpu-core: "true"` when the node runs the
soft split, and, holding `hami.io/mutex.lock`, pops the container's entry of
`hami.io/<CW>-devices-to-allocate` and looks its cards up in the pod annotation `huawei.com/<CW>`
(JSON `[{"UUID", "temp", "memory", "core"}]`): `temp` is the vNPU template name (hard split; absent for
a whole card), `memory`/`core` the soft-split limits.

- Hard split (default): the webhook rounds `huawei.com/<CW>-memory` up to the chip's smallest template
  that holds it (or the whole card), writes it to limits and requests, rejects memory beyond the card,
  `-core` requests, and vNPU templates for several cards (only whole cards may be combined).
- Soft split: pod annotation `huawei.com/vnpu-mode: hami-core`; memory and `-core` (percent) are kept as
  asked; such a pod only fits a node in soft mode (ModeNotFit otherwise).
- 910C (`superPod`): NPUs come in modules of two (index / 2); a request of 1 becomes 2, other odd counts
  are rejected, and several NPUs are taken as whole modules.
- 910 chips with a NetworkID on every card: several NPUs are taken from the NetworkID group with the most
  fitting cards first, and nodes score 10 x (most NPUs of a container in one NetworkID / its NPUs).

Differences from HAMi: an `Ascend910B4` request only uses `Ascend910B4` cards (HAMi's substring match
also picks `Ascend910B4-1` cards, whose plugin never sees the request); the multi-device vNPU check
runs after the 910C 1 -> 2 rounding (HAMi checks the count before rounding); `ASCEND_VISIBLE_DEVICES=""`
(`overwriteEnv`) is added once, not once per configured chip.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami.configparse import parse_section, require
from hami.errors import ConfigError, InvalidRequest
from hami.model import ContainerDevice, ContainerRequest, Device, Selection
from hami.quantity import to_count, to_mib
from hami.reason_words import Reason
from hami.vendors import common as C
from hami.vendors.base import (
    AllocationContext,
    MutationResult,
    container_limits,
    group_score,
    set_env,
    split_list,
)

VNPU_MODE = "huawei.com/vnpu-mode"
NODE_SOFT = "hami-vnpu-core"
PREDICATE_TIME = "predicate-time"
ENV_VISIBLE = "ASCEND_VISIBLE_DEVICES"


@dataclass(frozen=True)
class AscendTemplate:
    """One vNPU template of a chip (`vnpus.configs[].templates[]`)."""

    name: str = ""
    """Template name as the device plugin knows it (e.g. `vir05_1c_16g`). Default "" (required)."""
    memory: int = 0
    """Memory of the template in MiB. Default 0 (required)."""
    aiCore: int = 0
    """AI cores of the template. Default 0."""
    aiCPU: int = 0
    """AI CPUs of the template. Default 0."""


@dataclass(frozen=True)
class AscendChip:
    """One entry of `vnpus.configs` (HAMi chart `devices.ascend`): one scheduled chip."""

    chipName: str = ""
    """Chip name as the device plugin reports it (e.g. `910B3`). Default ""."""
    commonWord: str = ""
    """CommonWord: request type, resource and annotation infix (e.g. `Ascend910B3`). Default "" (required)."""
    resourceName: str = ""
    """NPUs per container; "" = `huawei.com/<CW>`. Default ""."""
    resourceMemoryName: str = ""
    """Per-NPU memory in MiB (times `memoryFactor`), rounded up to a template in hard mode; "" = `huawei.com/<CW>-memory`. Default ""."""
    resourceCoreName: str = ""
    """Per-NPU compute in percent, soft (hami-core) mode only; "" = `huawei.com/<CW>-core`. Default ""."""
    memoryAllocatable: int = 0
    """MiB a whole NPU gives a container (what a request above the largest template becomes). Default 0 (required)."""
    memoryCapacity: int = 0
    """Physical MiB of an NPU; larger memory requests are rejected. Default 0 (= `memoryAllocatable`)."""
    memoryFactor: int = 1
    """Multiplier applied to memory requests and memory quotas. Default 1 (HAMi)."""
    aiCore: int = 0
    """AI cores of a whole NPU. Default 0."""
    aiCPU: int = 0
    """AI CPUs of a whole NPU. Default 0."""
    runtimeClassName: str = ""
    """RuntimeClass the webhook sets on pods of this chip without one; "" = none. Default ""."""
    overwriteEnv: bool = False
    """Set `ASCEND_VISIBLE_DEVICES=""` in containers that ask for no Ascend NPU. Default false (HAMi)."""
    superPod: bool = False
    """910C super-pod chips: NPUs in modules of two; 1 becomes 2, other odd counts are rejected. Default false."""
    templates: tuple[AscendTemplate, ...] = ()
    """The chip's vNPU templates (sorted by memory at load). Default none."""


def _chip(
    cw: str,
    mem: int,
    cap: int,
    core: int,
    temps: tuple[tuple[str, int, int], ...],
    *,
    super_pod: bool = False,
) -> AscendChip:
    return AscendChip(
        chipName=cw.removeprefix("Ascend"), commonWord=cw, memoryAllocatable=mem, memoryCapacity=cap, aiCore=core,
        superPod=super_pod, templates=tuple(AscendTemplate(n, m, c) for n, m, c in temps),
    )  # fmt: skip


_910B3_T = (("vir05_1c_16g", 16384, 5), ("vir10_3c_32g", 32768, 10))


def _chart_chips() -> tuple[AscendChip, ...]:
    """The chips and templates of HAMi's chart (values.yaml `devices.ascend`)."""
    return (
        _chip("Ascend910A", 32768, 32768, 30, (("vir02", 2184, 2), ("vir04", 4369, 4), ("vir08", 8738, 8), ("vir16", 17476, 16))),
        _chip("Ascend910B2", 65536, 65536, 24, (("vir03_1c_8g", 8192, 3), ("vir06_1c_16g", 16384, 6), ("vir12_3c_32g", 32768, 12))),
        _chip("Ascend910B3", 65536, 65536, 20, _910B3_T),
        _chip("Ascend910B4-1", 65536, 65536, 20, _910B3_T),
        _chip("Ascend910B4", 32768, 32768, 20, (("vir05_1c_8g", 8192, 5), ("vir10_3c_16g", 16384, 10))),
        _chip("Ascend310P", 21527, 24576, 8, (("vir01", 3072, 1), ("vir02", 6144, 2), ("vir04", 12288, 4))),
        _chip("Ascend910C", 65536, 65536, 20, _910B3_T, super_pod=True),
    )  # fmt: skip


@dataclass(frozen=True)
class AscendConfig:
    """The `vnpus:` section (HAMi chart `devices.ascend`, pkg/device/ascend)."""

    hamiVnpuCore: bool = False
    """Soft split (hami-core) on nodes that do not say otherwise with annotation `hami-vnpu-core`. Default false."""
    configs: tuple[AscendChip, ...] = field(default_factory=_chart_chips)
    """The chips to schedule, one vendor each. Default: the chart's seven chips (910A, 910B2, 910B3, 910B4-1, 910B4, 310P, 910C)."""

    DOC_PARTS = (AscendChip, AscendTemplate)

    def validate(self) -> None:
        seen = set()
        for i, c in enumerate(self.configs):
            where = f"vnpus.configs[{i}]"
            if not c.commonWord:
                raise ConfigError(
                    f"{where}.commonWord: must not be empty; valid: a chip CommonWord such as Ascend910B3"
                )
            if c.commonWord in seen:
                raise ConfigError(f"{where}.commonWord: {c.commonWord!r} is listed twice")
            seen.add(c.commonWord)
            if c.memoryAllocatable <= 0:
                raise ConfigError(
                    f"{where}.memoryAllocatable: {c.memoryAllocatable!r} is invalid; valid: MiB > 0"
                )
            if c.memoryFactor < 1:
                raise ConfigError(
                    f"{where}.memoryFactor: {c.memoryFactor!r} is invalid; valid: an integer >= 1"
                )
            for key, val in (("memoryCapacity", c.memoryCapacity), ("aiCore", c.aiCore), ("aiCPU", c.aiCPU)):
                require(val >= 0, f"{where}.{key}", val, "an integer >= 0")
            for j, t in enumerate(c.templates):
                # A nameless template is written as no `temp` (a whole NPU to the device plugin) while
                # the scheduler counts only the template's memory; a template of no memory never matches.
                tw = f"{where}.templates[{j}]"
                if not t.name:
                    raise ConfigError(
                        f"{tw}.name: must not be empty; valid: a vNPU template name such as vir05_1c_16g"
                    )
                require(t.memory > 0, f"{tw}.memory", t.memory, "MiB > 0")
                require(t.aiCore >= 0, f"{tw}.aiCore", t.aiCore, "an integer >= 0")
                require(t.aiCPU >= 0, f"{tw}.aiCPU", t.aiCPU, "an integer >= 0")


def parse(key: str, raw: Any) -> AscendConfig:
    """`vnpus:` as HAMi v2.10 writes it ({hamiVnpuCore, configs: [chips]}), or as HAMi up to v2.9 read it:
    the list of chips itself, hamiVnpuCore false. ConfigError names the first bad key."""
    if raw is None:
        return AscendConfig()
    if isinstance(raw, list):
        return AscendConfig(configs=_chips(key, raw))
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: must be a mapping with hamiVnpuCore and configs, or a list of chips")
    top = parse_section(AscendConfig, key, raw, skip=("configs",))
    if "configs" not in raw:
        return top
    if not isinstance(raw["configs"], list):
        raise ConfigError(f"{key}.configs: must be a list of chips")
    return AscendConfig(hamiVnpuCore=top.hamiVnpuCore, configs=_chips(f"{key}.configs", raw["configs"]))


def _chips(key: str, entries: list[Any]) -> tuple[AscendChip, ...]:
    chips = []
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        chip = parse_section(AscendChip, where, entry, skip=("templates",))
        temps = (entry or {}).get("templates") or []
        if not isinstance(temps, list):
            raise ConfigError(f"{where}.templates: must be a list of {{name, memory, aiCore, aiCPU}}")
        parsed = [parse_section(AscendTemplate, f"{where}.templates[{j}]", t) for j, t in enumerate(temps)]
        chips.append(
            AscendChip(**{**chip.__dict__, "templates": tuple(sorted(parsed, key=lambda t: t.memory))})
        )
    return tuple(chips)


@dataclass(frozen=True, slots=True)
class AscendDevice(Device):
    """An NPU with its NetworkID (None when not registered) and whether its node runs the soft split."""

    network_id: int | None = None
    soft: bool = False


@dataclass(frozen=True, slots=True)
class AscendSelection(Selection):
    hami_core: bool = False


class AscendVendor(C.ShareVendor):
    uses_node_lock = True
    custom_fit = True
    default_cores = 0

    def __init__(self, chip: AscendChip, *, soft_default: bool = False) -> None:
        self.chip = chip
        cw = self.common_word = chip.commonWord
        # HAMi scores 910 nodes by how many of a container's NPUs share one NetworkID.
        self.scores_nodes = cw.startswith("Ascend910")
        self.register_key = f"hami.io/node-register-{cw}"
        self.handshake_key = f"hami.io/node-handshake-{cw}"
        self.to_allocate_key = f"hami.io/{cw}-devices-to-allocate"
        self.allocated_key = f"hami.io/{cw}-devices-allocated"
        self.use_uuid_key = f"hami.io/use-{cw}-uuid"
        self.nouse_uuid_key = f"hami.io/no-use-{cw}-uuid"
        self.json_key = f"huawei.com/{cw}"
        self.quota_memory_factor = chip.memoryFactor
        self.soft_default = soft_default
        super().__init__(
            chip.resourceName or f"huawei.com/{cw}",
            chip.resourceMemoryName or f"huawei.com/{cw}-memory",
            chip.resourceCoreName or f"huawei.com/{cw}-core",
        )

    @property
    def node_annotation_keys(self) -> tuple[str, ...]:
        return (self.register_key, NODE_SOFT)

    def user_annotation_keys(self) -> tuple[str, ...]:
        return (self.use_uuid_key, self.nouse_uuid_key, VNPU_MODE)

    def allocation_keys(self) -> tuple[str, ...]:
        return (self.to_allocate_key, self.allocated_key, self.json_key, PREDICATE_TIME)

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        return AscendSelection(
            use_uuids=split_list(annotations.get(self.use_uuid_key), field=self.use_uuid_key),
            nouse_uuids=split_list(annotations.get(self.nouse_uuid_key), field=self.nouse_uuid_key),
            hami_core=(annotations.get(VNPU_MODE) or "").strip() == "hami-core",
        )

    def trim(self, mib: int) -> tuple[int, str]:
        """HAMi trimMemory: (template MiB, name) of the smallest template >= `mib`, else (whole card, "")
        when `mib` fits the card, else (0, "")."""
        for t in self.chip.templates:
            if mib <= t.memory:
                return t.memory, t.name
        if mib <= (self.chip.memoryCapacity or self.chip.memoryAllocatable):
            return self.chip.memoryAllocatable, ""
        return 0, ""

    # -- requests / admission -------------------------------------------------------------------

    @C.gated
    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        n = self._names
        limits = container_limits(container)
        nums = C.asked_count(container, limits, n.count)
        if nums is None:
            return None
        mem = 0
        if n.memory in limits:
            mem = (
                to_mib(limits[n.memory], resource=C.field_name(container, n.memory), per_card=True)
                * self.chip.memoryFactor
            )
        cores = (
            to_count(limits[n.cores], resource=C.field_name(container, n.cores), unit="percent")
            if n.cores in limits
            else 0
        )
        return ContainerRequest(self.common_word, nums, mem, 100 if mem == 0 else 101, cores)

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        n, chip = self._names, self.chip
        cname = container.get("name", "?")
        res = container.get("resources") or {}
        limits = res.get("limits") or {}
        if n.count not in limits:
            if chip.overwriteEnv and not any(
                e.get("name") == ENV_VISIBLE for e in container.get("env") or []
            ):
                set_env(container, ENV_VISIBLE, "")
            return MutationResult()
        annos = (pod.get("metadata") or {}).get("annotations") or {}
        soft = (annos.get(VNPU_MODE) or "").strip() == "hami-core"
        count = to_count(limits[n.count], resource=C.field_name(container, n.count))
        if chip.superPod:
            if count == 1:
                count = 2
                limits[n.count] = "2"
                if n.count in (res.get("requests") or {}):
                    res["requests"][n.count] = "2"
            elif count % 2:
                raise InvalidRequest(f"{self.common_word} device request must be 1 or 2*n, got {count}")
        present = container_limits(container)
        if (
            not soft
            and n.cores in present
            and to_count(present[n.cores], resource=C.field_name(container, n.cores), unit="percent") > 0
        ):
            raise InvalidRequest(
                f"{n.cores} is only supported in hami-core (soft split) mode: add the pod annotation "
                f"{VNPU_MODE}: hami-core (for nodes in the soft split: vnpus.hamiVnpuCore, or the node "
                f"annotation hami-vnpu-core), or leave out {n.cores} to get a vNPU template"
            )
        if n.memory in limits:
            raw = limits[n.memory]
            mem = to_mib(raw, resource=C.field_name(container, n.memory), per_card=True)
            if not soft:
                mem, _ = self.trim(mem)
                if mem == 0:
                    raise InvalidRequest(
                        f"container {cname}: {n.memory} {raw} is invalid; valid: at most {chip.memoryCapacity or chip.memoryAllocatable} MiB"
                    )
        else:
            mem = chip.memoryAllocatable
        if count > 1 and not soft and mem != chip.memoryAllocatable:
            raise InvalidRequest(f"container {cname}: vNPU not supported for multiple devices")
        res = container.setdefault("resources", {})
        res.setdefault("limits", {})[n.memory] = str(mem)
        res.setdefault("requests", {})[n.memory] = str(mem)
        spec = pod.setdefault("spec", {})
        if chip.runtimeClassName and not spec.get("runtimeClassName"):
            spec["runtimeClassName"] = chip.runtimeClassName
        return MutationResult(uses_device=True)

    # -- inventory / fit ------------------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        annos = A.pod_annotations(node)
        value = annos.get(self.register_key)
        if value is None:
            return None
        flag = annos.get(NODE_SOFT)
        soft = flag == "true" if flag is not None else self.soft_default
        out: list[Device] = []
        for d, custom in C.decode_register_json(value, vendor=self.common_word):
            net = custom.get("NetworkID")
            out.append(
                AscendDevice(
                    uuid=d.uuid,
                    index=d.index,
                    count=d.count,
                    devmem=d.devmem,
                    devcore=d.devcore,
                    type=self.common_word,
                    numa=d.numa,
                    mode=d.mode,
                    health=d.health,
                    vendor=self.common_word,
                    network_id=int(net)
                    if isinstance(net, int | float) and not isinstance(net, bool)
                    else None,
                    soft=soft,
                )  # fmt: skip
            )
        return out

    def fit_cards(self, req, cards, usage, *, selection, policy, earlier, quota_ok):  # noqa: ANN001, ANN201
        sel = selection if isinstance(selection, AscendSelection) else AscendSelection()
        if sel.hami_core and cards and not all(getattr(d, "soft", False) for d in cards):
            return None, Counter({Reason.MODE_NOT_FIT: 1})
        if req.nums > len(cards):
            return None, Counter({Reason.NODE_INSUFFICIENT_DEVICE: len(cards) or 1})
        passing, reasons = C.check_all(req, cards, usage, vendor=self, selection=sel, mutex=policy.mutex)
        ordered = [d for d, _ in C.by_policy(passing, req, policy)]
        cores = min(req.coresreq, 100)
        if self.chip.superPod and req.nums > 1:
            fitting = {d.index for d in ordered}
            modules: dict[int, list[Device]] = {}
            for d in ordered:
                if {d.index // 2 * 2, d.index // 2 * 2 + 1} <= fitting:
                    modules.setdefault(d.index // 2, []).append(d)
            chosen = [d for m in modules.values() for d in sorted(m, key=lambda d: d.index)][: req.nums]
            if len(chosen) != req.nums:
                # HAMi reports "<got>/<nums> AllocatedCardsInsufficientRequest" even when no whole
                # module is free (got 0); here the fitting chips that made no whole module are counted,
                # over the node's card count, so the reason is never empty.
                return C.insufficient(reasons, len(ordered))
            return [C.take(d, req, req.memory_on(d), cores) for d in chosen], reasons
        if len(ordered) < req.nums:
            return C.insufficient(reasons, len(ordered))
        topo = self.common_word.startswith("Ascend910") and all(
            getattr(d, "network_id", None) is not None for d in cards
        )
        if topo and req.nums > 1 and len(ordered) > req.nums:
            groups: dict[int, list[Device]] = {}
            for d in ordered:
                groups.setdefault(d.network_id, []).append(d)  # type: ignore[attr-defined]
            ordered = [d for _, g in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])) for d in g]
        return [C.take(d, req, req.memory_on(d), cores) for d in ordered[: req.nums]], reasons

    def node_score(self, containers, *, cards, node_policy):  # noqa: ANN001, ANN201
        """HAMi: 10 x sum over containers of (most NPUs in one NetworkID / NPUs); 0 when a card has none."""
        s = group_score(containers, lambda uuid: getattr(cards.get(uuid), "network_id", None))
        return 0.0 if s is None else 10.0 * s

    # -- allocation -----------------------------------------------------------------------------

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        out = super().allocation_annotations(containers, context=context)
        annos = ((context.pod if context else {}).get("metadata") or {}).get("annotations") or {}
        soft = (annos.get(VNPU_MODE) or "").strip() == "hami-core"
        entries = []
        for c in containers:
            for cd in c:
                e: dict[str, Any] = {"UUID": cd.uuid}
                if not soft:
                    name = self.trim(cd.usedmem)[1]
                    if name:
                        e["temp"] = name
                if cd.usedmem:
                    e["memory"] = cd.usedmem
                if cd.usedcores:
                    e["core"] = cd.usedcores
                entries.append(e)
        out[self.json_key] = json.dumps(entries, separators=(",", ":"))
        out[PREDICATE_TIME] = str(int(context.now if context else 0))
        return out


def build(config: AscendConfig, device_config: Any) -> list[AscendVendor]:
    if device_config is None or not device_config.scheduler.enableAscend:
        return []
    return [AscendVendor(chip, soft_default=config.hamiVnpuCore) for chip in config.configs]
