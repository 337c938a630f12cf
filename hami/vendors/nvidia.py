"""NVIDIA: JSON registration, HAMi-core sharing (memory MiB, SM percent, slots), MIG and MPS modes.

Rules from hami-legacy-spec §1.1 (requests), §1.3 (selection annotations), §1.6.1 (registration),
§2.1 (admission) and §2.5 (per-card type checks); the per-card fit itself is generic (`hami.fit`). A
card's mode is its node's `operatingmode` (`hami-core`, `mig`, `mps`) and a pod's
`nvidia.com/vgpu-mode` must contain it. On cards in MIG mode each device of a container is one MIG
instance: one container may take several on one card, and the profile and placement follow HAMi's
dynamic MIG (`hami.vendors.nvidia_mig`), recorded in ``hami.io/vgpu-mig-allocations``.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hami import annotations as A
from hami import booleans
from hami.configparse import parse_section, require
from hami.errors import AnnotationError, ConfigError, InvalidRequest
from hami.model import (
    HAMI_CORE_MODE,
    MIG_MODE,
    MPS_MODE,
    PERCENTAGE_UNSET,
    ContainerDevice,
    ContainerRequest,
    Device,
    DeviceUsage,
    MigSlot,
    Selection,
)
from hami.quantity import to_count, to_mib, to_percent
from hami.registration import decode_node_devices_json
from hami.vendors import nvidia_mig
from hami.vendors.base import (
    AllocationContext,
    MutationResult,
    ResourceNames,
    VendorBase,
    container_limits,
    registered,
    set_env,
    split_list,
)
from hami.vendors.nvidia_mig import MIG_PROFILE, MigProfileAllowlist

USE_GPUTYPE = "nvidia.com/use-gputype"
NOUSE_GPUTYPE = "nvidia.com/nouse-gputype"
USE_GPUUUID = "nvidia.com/use-gpuuuid"
NOUSE_GPUUUID = "nvidia.com/nouse-gpuuuid"
NUMA_BIND = "nvidia.com/numa-bind"
VGPU_MODE = "nvidia.com/vgpu-mode"

#: Env the webhook injects (read by libvgpu).
ENV_TASK_PRIORITY = "CUDA_TASK_PRIORITY"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"
#: Values of `nvidia.gpuCorePolicy` (libvgpu core limiter).
CORE_POLICIES = ("default", "force", "disable")
#: Values of `operatingMode` (per node `operatingmode`) and of `migStrategy` (per node `migstrategy`).
OPERATING_MODES = (HAMI_CORE_MODE, MIG_MODE, MPS_MODE)
MIG_STRATEGIES = ("none", "single", "mixed")


@dataclass(frozen=True)
class NvidiaConfig:
    """The `nvidia:` section of device-config.yaml (HAMi chart `devices.nvidia`, pkg/device/nvidia)."""

    resourceCountName: str = "nvidia.com/gpu"
    """Extended resource counting cards per container. Default `nvidia.com/gpu` (HAMi chart)."""
    resourceMemoryName: str = "nvidia.com/gpumem"
    """Per-card device memory in MiB (a unit such as `16Gi` is converted). Default `nvidia.com/gpumem`."""
    resourceMemoryPercentageName: str = "nvidia.com/gpumem-percentage"
    """Per-card device memory in percent of the card. Default `nvidia.com/gpumem-percentage`."""
    resourceCoreName: str = "nvidia.com/gpucores"
    """Per-card share of the SMs in percent (100 = exclusive card). Default `nvidia.com/gpucores`."""
    resourcePriorityName: str = "nvidia.com/priority"
    """Task priority (0 high, 1 low), passed to libvgpu as `CUDA_TASK_PRIORITY`. Default `nvidia.com/priority`."""
    overwriteEnv: bool = False
    """Set `NVIDIA_VISIBLE_DEVICES=none` in containers that ask for no NVIDIA card. Default false (HAMi)."""
    defaultMemory: int = 0
    """MiB per card when a container gives neither memory form; 0 = the whole card. Default 0 (HAMi `defaultMem`)."""
    defaultCores: int = 0
    """Percent of SMs per card when a container gives none. Default 0 (HAMi)."""
    defaultGPUNum: int = 1
    """Cards added when a container asks for memory or cores but no count; 0 = add none. Default 1 (HAMi)."""
    memoryFactor: int = 1
    """Multiplier applied to `gpumem` requests and to memory quotas. Default 1 (HAMi)."""
    preConfiguredDeviceMemory: int = 0
    """Device plugin: MiB to register per card instead of NVML's figure; 0 = NVML. Default 0 (HAMi)."""
    deviceSplitCount: int = 10
    """Device plugin: how many containers may share one card (slots). Default 10 (HAMi chart)."""
    deviceMemoryScaling: float = 1.0
    """Device plugin: registered memory = physical MiB x this (above 1 oversubscribes). Default 1 (HAMi)."""
    deviceCoreScaling: float = 1.0
    """Device plugin: registered cores = 100 x this percent. Default 1 (HAMi)."""
    enableNumaTopology: bool = False
    """Device plugin: register each card's NUMA node (else 0). Default false (HAMi)."""
    gpuCorePolicy: str = "default"
    """libvgpu core limiter policy `default`, `force` or `disable` (env `GPU_CORE_UTILIZATION_POLICY`). Default `default` (HAMi)."""
    libCudaLogLevel: int = 1
    """libvgpu log level (env `LIBCUDA_LOG_LEVEL`): 0 silent, 1 errors, 2 + warnings, 3 + info, 4 + debug. Default 1 (HAMi)."""
    runtimeClassName: str = ""
    """RuntimeClass the webhook sets on NVIDIA pods without one; "" = leave unset. Default "" (HAMi)."""
    disableCoreLimit: bool = False
    """Device plugin: do not pass core limits to libvgpu (memory limits stay). Default false (HAMi)."""
    operatingMode: str = HAMI_CORE_MODE
    """Device plugin: how cards are shared, `hami-core` (libvgpu time-slicing), `mig` (one MIG instance
    per container device, created on demand) or `mps` (an MPS control daemon per card, libvgpu still
    accounting memory). Usually set per node in `nodeconfig` (`operatingmode`, HAMi's key). Default
    `hami-core`."""
    migStrategy: str = "none"
    """Device plugin, with `operatingMode: hami-core`: `none` (cards with MIG mode on are skipped),
    `single` or `mixed` (MIG instances an administrator made are registered as cards of their own,
    shared by libvgpu like whole cards). HAMi's `migstrategy` / `--mig-strategy`. Default `none`."""
    migProfileAllowlist: tuple[MigProfileAllowlist, ...] = ()
    """MIG profiles cards may offer in `mig` mode, per model: a list of `{models: [...], profiles: [...]}`
    (HAMi's key); a card whose model no entry names registers no profile. HAMi's older
    `knownMigGeometries` (`{models, allowedGeometries}`) is read too: the profile names of its geometries
    join the list. Default none."""

    DOC_PARTS = (MigProfileAllowlist,)

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid key."""
        require(
            self.operatingMode in OPERATING_MODES,
            "nvidia.operatingMode",
            self.operatingMode,
            ", ".join(OPERATING_MODES),
        )
        strategies = ", ".join(MIG_STRATEGIES)
        require(self.migStrategy in MIG_STRATEGIES, "nvidia.migStrategy", self.migStrategy, strategies)
        nvidia_mig.validate_allowlist(self.migProfileAllowlist)
        require(
            self.deviceSplitCount >= 1, "nvidia.deviceSplitCount", self.deviceSplitCount, "an integer >= 1"
        )
        require(
            self.deviceMemoryScaling > 0,
            "nvidia.deviceMemoryScaling",
            self.deviceMemoryScaling,
            "a number > 0",
        )
        require(
            self.deviceCoreScaling > 0, "nvidia.deviceCoreScaling", self.deviceCoreScaling, "a number > 0"
        )
        require(self.defaultMemory >= 0, "nvidia.defaultMemory", self.defaultMemory, "MiB >= 0")
        require(0 <= self.defaultCores <= 100, "nvidia.defaultCores", self.defaultCores, "percent 0..100")
        require(self.defaultGPUNum >= 0, "nvidia.defaultGPUNum", self.defaultGPUNum, "an integer >= 0")
        require(self.memoryFactor >= 1, "nvidia.memoryFactor", self.memoryFactor, "an integer >= 1")
        require(
            self.preConfiguredDeviceMemory >= 0,
            "nvidia.preConfiguredDeviceMemory",
            self.preConfiguredDeviceMemory,
            "MiB >= 0 (0 = the memory NVML reports)",
        )
        require(
            0 <= self.libCudaLogLevel <= 4,
            "nvidia.libCudaLogLevel",
            self.libCudaLogLevel,
            "0 (silent), 1 (errors), 2 (+ warnings), 3 (+ info) or 4 (+ debug)",
        )
        require(
            self.gpuCorePolicy in CORE_POLICIES,
            "nvidia.gpuCorePolicy",
            self.gpuCorePolicy,
            ", ".join(CORE_POLICIES),
        )


def parse_config(key: str, raw: Any) -> NvidiaConfig:
    """The `nvidia:` section: flat keys, plus the MIG allow-list in HAMi's current form
    (`migProfileAllowlist`) and its older one (`knownMigGeometries`, appended). Raises ConfigError."""
    if raw is not None and not isinstance(raw, Mapping):
        raise ConfigError(f"{key}: must be a mapping")
    raw = dict(raw or {})
    allow = nvidia_mig.parse_allowlist(raw.pop("migProfileAllowlist", None), key=f"{key}.migProfileAllowlist")
    allow += nvidia_mig.parse_known_geometries(
        raw.pop("knownMigGeometries", None), key=f"{key}.knownMigGeometries"
    )
    cfg = parse_section(NvidiaConfig, key, raw, aliases={"defaultMem": "defaultMemory"})
    return replace(cfg, migProfileAllowlist=allow) if allow else cfg


def model_type(nvml_name: str) -> str:
    """HAMi's type rule: prefix ``NVIDIA-`` unless the NVML name already starts with ``NVIDIA``."""
    return nvml_name if nvml_name.startswith("NVIDIA") else f"NVIDIA-{nvml_name}"


def parse_bool(value: str, *, field: str) -> bool:
    """An annotation boolean by the shared truth table (`hami.booleans`), surrounding white space
    trimmed (annotations are typed by hand). Raises InvalidRequest naming `field`."""
    return booleans.parse_bool(value.strip(), field=field)


#: Container env that turns libvgpu's limits off (read by value, as the device plugin does).
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"
#: Quantities whose unit makes them bytes (binary suffixes; decimal M and up), converted to bare MiB.
_BYTE_FORM = re.compile(r"(Ki|Mi|Gi|Ti|Pi|Ei|[MGTPE])$")


def control_disabled(container: Mapping[str, Any]) -> bool:
    """Whether the container sets `CUDA_DISABLE_CONTROL` to a true value (the last entry wins, as in
    kubelet; a ``valueFrom`` entry cannot be resolved by the scheduler and counts as not true).
    Values are read by the truth table libvgpu also uses (`hami.booleans`); an invalid one keeps
    control on, as libvgpu does."""
    value = None
    for env in container.get("env") or []:
        if isinstance(env, Mapping) and env.get("name") == ENV_DISABLE_CONTROL:
            value = env.get("value")
    return booleans.bool_or_default(
        None if value is None else str(value), field=ENV_DISABLE_CONTROL, default=False
    )


log = logging.getLogger(__name__)


class NvidiaVendor(VendorBase):
    common_word = "NVIDIA"
    register_key = A.NVIDIA_REGISTER
    handshake_key: str | None = A.NVIDIA_HANDSHAKE
    to_allocate_key: str | None = A.NVIDIA_TO_ALLOCATE
    allocated_key = A.NVIDIA_ALLOCATED
    uses_node_lock = True
    #: The MIG reservations decide the instance the device plugin makes (profile and placement), and
    #: the device list does not name them.
    stamped_keys = (A.NVIDIA_ALLOCATED, A.MIG_ALLOCATIONS)

    def __init__(self, config: NvidiaConfig | None = None) -> None:
        self.config = config or NvidiaConfig()
        c = self.config
        self._names = ResourceNames(
            count=c.resourceCountName,
            memory=c.resourceMemoryName,
            memory_percentage=c.resourceMemoryPercentageName,
            cores=c.resourceCoreName,
            priority=c.resourcePriorityName,
            memory_factor=c.memoryFactor,
        )

    def resource_names(self) -> ResourceNames:
        return self._names

    def user_annotation_keys(self) -> tuple[str, ...]:
        return (USE_GPUTYPE, NOUSE_GPUTYPE, USE_GPUUUID, NOUSE_GPUUUID, NUMA_BIND, VGPU_MODE, MIG_PROFILE)

    def allocation_keys(self) -> tuple[str, ...]:
        return (A.NVIDIA_TO_ALLOCATE, A.NVIDIA_ALLOCATED, A.MIG_ALLOCATIONS)

    # -- requests -------------------------------------------------------------------------------

    def container_request(self, container: Mapping[str, Any]) -> ContainerRequest | None:
        """HAMi GenerateResourceRequests (§1.1), strict: bad quantities raise instead of dropping.

        Per card: `memreq` MiB (gpumem x memoryFactor), else `mem_percentage`, else `defaultMemory`,
        else 100 %; `coresreq` gpucores, else `defaultCores`; 100 (exclusive cards) when the container
        opts out of enforcement with env `CUDA_DISABLE_CONTROL=true`.
        """
        n, cfg = self._names, self.config
        limits = container_limits(container)
        name = container.get("name", "?")
        if n.count not in limits:
            return None
        nums = to_count(limits[n.count], resource=f"container {name}: {n.count}")
        if nums == 0:
            return None
        memreq = 0
        if n.memory and n.memory in limits:
            memreq = (
                to_mib(limits[n.memory], resource=f"container {name}: {n.memory}", per_card=True)
                * cfg.memoryFactor
            )
        pct = PERCENTAGE_UNSET
        if n.memory_percentage and n.memory_percentage in limits:
            p = to_percent(limits[n.memory_percentage], resource=f"container {name}: {n.memory_percentage}")
            pct = p if p > 0 else PERCENTAGE_UNSET  # HAMi: <= 0 means unset
        if memreq == 0 and pct == PERCENTAGE_UNSET:
            if cfg.defaultMemory > 0:
                memreq = cfg.defaultMemory
            else:
                pct = 100
        cores = cfg.defaultCores
        if n.cores and n.cores in limits:
            cores = to_percent(limits[n.cores], resource=f"container {name}: {n.cores}")
        if control_disabled(container):
            # libvgpu enforces nothing in this container, so it must not share its cards (HAMi#1678).
            cores = 100
        return ContainerRequest(
            vendor=self.common_word, nums=nums, memreq=memreq, mem_percentage=pct, coresreq=cores
        )

    def selection(self, annotations: Mapping[str, str]) -> Selection:
        numa = annotations.get(NUMA_BIND)
        profile = (annotations.get(MIG_PROFILE) or "").strip()
        if profile and not nvidia_mig.valid_profile_name(profile):
            raise InvalidRequest(
                f"annotation {MIG_PROFILE}: {profile!r} is not a MIG profile name; valid: a profile such as "
                "1g.10gb or 3g.40gb that the node's cards offer"
            )
        return Selection(
            use_types=split_list(annotations.get(USE_GPUTYPE), field=USE_GPUTYPE),
            nouse_types=split_list(annotations.get(NOUSE_GPUTYPE), field=NOUSE_GPUTYPE),
            use_uuids=split_list(annotations.get(USE_GPUUUID), field=USE_GPUUUID),
            nouse_uuids=split_list(annotations.get(NOUSE_GPUUUID), field=NOUSE_GPUUUID),
            numa_bind=parse_bool(numa, field=NUMA_BIND) if numa is not None else False,
            mode=(annotations.get(VGPU_MODE) or "").strip(),
            mig_profile=profile,
        )

    def type_matches(self, device: Device, selection: Selection) -> bool:
        t = device.type.lower()
        if selection.use_types and not any(u.lower() in t for u in selection.use_types):
            return False
        if any(u.lower() in t for u in selection.nouse_types):
            return False
        if selection.mig_profile and device.mode != MIG_MODE:
            return False  # an explicit MIG profile asks for MIG cards only
        # HAMi: the device's mode must be a substring of the pod's vgpu-mode value.
        return not (selection.mode and device.mode not in selection.mode)

    # -- MIG (HAMi's CustomFilterRule / AddResourceUsage for cards in MIG mode) ---------------------

    def card_repeats(self, device: Device, selection: Selection) -> bool:
        # HAMi's isMIGRequest: a pod that names another mode never takes instances.
        return device.mode == MIG_MODE and (not selection.mode or MIG_MODE in selection.mode)

    def card_rule(
        self,
        device: Device,
        usage: DeviceUsage,
        req: ContainerRequest,
        mem: int,
        selection: Selection,
        taken: Sequence[ContainerDevice],
    ) -> str | None:
        if device.mode != MIG_MODE:
            return None
        got = nvidia_mig.place_all(
            device.mig_profiles, usage.mig, [*(c.usedmem for c in taken), mem], only=selection.mig_profile
        )
        return None if got is not None else "CardMigTopologyInfeasible"

    def finish_card(
        self, device: Device, usage: DeviceUsage, devices: Sequence[ContainerDevice], selection: Selection
    ) -> list[ContainerDevice]:
        if device.mode != MIG_MODE:
            return list(devices)
        got = nvidia_mig.place_all(
            device.mig_profiles, usage.mig, [c.usedmem for c in devices], only=selection.mig_profile
        )
        if got is None:  # card_rule accepted each of them: cannot happen unless the caller skipped it
            raise AssertionError(f"card {device.uuid}: MIG placements vanished between check and booking")
        return [
            ContainerDevice(
                uuid=c.uuid,
                type=c.type,
                usedmem=profile.memory_mb,
                usedcores=profile.core,
                mig=MigSlot(profile.name, placement),
            )
            for c, (profile, placement) in zip(devices, got, strict=True)
        ]

    # -- registration / allocation --------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        return registered(
            node, self.register_key, lambda v: decode_node_devices_json(v, vendor=self.common_word)
        )

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        encoded = A.encode_pod_devices(containers)
        out = {A.NVIDIA_TO_ALLOCATE: encoded, A.NVIDIA_ALLOCATED: encoded}
        mig = A.mig_allocations_of(containers)
        if mig:
            out[A.MIG_ALLOCATIONS] = A.encode_mig_allocations(mig)
        return out

    def pod_devices(
        self, annotations: Mapping[str, str], containers: int
    ) -> list[list[ContainerDevice]] | None:
        """The device list, each device with its MIG instance from ``hami.io/vgpu-mig-allocations``
        (matched by container and device index). An unreadable MIG annotation is logged and ignored:
        the devices then carry no instance, and cards in MIG mode holding them take no new instance
        (HAMi's fail-closed rule)."""
        devices = super().pod_devices(annotations, containers)
        raw = annotations.get(A.MIG_ALLOCATIONS)
        if devices is None or not raw:
            return devices
        try:
            allocations = A.decode_mig_allocations(raw)
        except AnnotationError as e:
            log.warning("ignoring %s: %s", A.MIG_ALLOCATIONS, e)
            return devices
        for a in allocations:
            if a.container_index < len(devices) and a.device_index < len(devices[a.container_index]):
                cd = devices[a.container_index][a.device_index]
                if cd.uuid == a.gpu_uuid:
                    slot = MigSlot(a.profile, a.placement)
                    devices[a.container_index][a.device_index] = replace(cd, mig=slot)
        return devices

    # -- admission ------------------------------------------------------------------------------

    def mutate_container(self, container: dict[str, Any], *, pod: dict[str, Any]) -> MutationResult:
        """HAMi's NVIDIA MutateAdmission (§2.1), with quantities validated and normalised.

        `gpumem` with a unit becomes a bare MiB count (``16Gi`` -> ``16384``); a bare `nvidia.com/gpu`
        becomes an exclusive card (`gpucores: 100`); `nvidia.com/priority` becomes env
        `CUDA_TASK_PRIORITY`. Raises InvalidRequest naming container, field and valid values.
        """
        n, cfg = self._names, self.config
        cname = container.get("name", "?")
        res = container.setdefault("resources", {}) if container.get("resources") is not None else None
        limits = dict((res or {}).get("limits") or {})
        requests = dict((res or {}).get("requests") or {})
        present = {**requests, **limits}
        result = MutationResult()

        def field(r: str) -> str:
            return f"container {cname}: resources.limits[{r}]"

        count = to_count(present[n.count], resource=field(n.count)) if n.count in present else None
        mem = None
        if n.memory and n.memory in present:
            mem = to_mib(present[n.memory], resource=field(n.memory), per_card=True)
            # Only byte forms are rewritten: the API server stores 3000 as "3k" again, and a review of
            # its own canonical form must not produce a patch (the webhook must be idempotent).
            for d in (limits, requests):
                if n.memory in d and _BYTE_FORM.search(str(d[n.memory]).strip()):
                    d[n.memory] = str(mem)
        pct = None
        if n.memory_percentage and n.memory_percentage in present:
            pct = to_percent(present[n.memory_percentage], resource=field(n.memory_percentage))
        if n.cores and n.cores in present:
            to_percent(present[n.cores], resource=field(n.cores))
        if mem is not None and pct is not None and mem > 0 and pct > 0:
            raise InvalidRequest(
                f"container {cname}: {n.memory} and {n.memory_percentage} are both set; "
                f"give memory either in MiB ({n.memory}) or in percent ({n.memory_percentage}), not both"
            )
        if n.priority and n.priority in present:
            prio = str(present[n.priority]).strip()
            # ASCII only: libvgpu reads the env var with atoi, and isdigit() also takes "١" or "²"
            if not re.fullmatch(r"-?[0-9]+", prio):
                raise InvalidRequest(f"{field(n.priority)}: {prio!r} must be an integer (0 high, 1 low)")
            set_env(container, ENV_TASK_PRIORITY, prio)

        uses = bool(count)
        if count is None and any(r and r in limits for r in (n.memory, n.memory_percentage, n.cores)):
            if cfg.defaultGPUNum > 0:
                limits[n.count] = str(cfg.defaultGPUNum)
                uses = True
        if uses:
            has_cores = bool(n.cores and n.cores in present)
            if not has_cores and (pct == 100 or (pct is None and mem is None)) and n.cores:
                limits[n.cores] = "100"  # a bare count means whole, exclusive cards
            if cfg.gpuCorePolicy != "default":
                set_env(container, ENV_CORE_POLICY, cfg.gpuCorePolicy)
            if cfg.runtimeClassName and not pod.get("spec", {}).get("runtimeClassName"):
                pod.setdefault("spec", {})["runtimeClassName"] = cfg.runtimeClassName
        elif cfg.overwriteEnv:
            set_env(container, "NVIDIA_VISIBLE_DEVICES", "none")

        if limits or requests:
            res = container.setdefault("resources", {})
            if limits:
                res["limits"] = limits
            if requests:
                res["requests"] = requests
        result.uses_device = uses
        return result
