"""NVIDIA: JSON registration, HAMi-core sharing (memory MiB, SM percent, slots).

Rules from hami-legacy-spec §1.1 (requests), §1.3 (selection annotations), §1.6.1 (registration),
§2.1 (admission) and §2.5 (per-card type checks); the per-card fit itself is generic (`hami.fit`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami import booleans
from hami.configparse import require
from hami.errors import InvalidRequest
from hami.model import PERCENTAGE_UNSET, ContainerDevice, ContainerRequest, Device, Selection
from hami.quantity import to_count, to_mib, to_percent
from hami.vendors.base import (
    AllocationContext,
    MutationResult,
    ResourceNames,
    VendorBase,
    container_limits,
    set_env,
    split_list,
)

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

    def validate(self) -> None:
        """Raise ConfigError naming the first invalid key."""
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


class NvidiaVendor(VendorBase):
    common_word = "NVIDIA"
    register_key = A.NVIDIA_REGISTER
    handshake_key: str | None = A.NVIDIA_HANDSHAKE
    to_allocate_key: str | None = A.NVIDIA_TO_ALLOCATE
    allocated_key = A.NVIDIA_ALLOCATED
    uses_node_lock = True

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
        return (USE_GPUTYPE, NOUSE_GPUTYPE, USE_GPUUUID, NOUSE_GPUUUID, NUMA_BIND, VGPU_MODE)

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
        return Selection(
            use_types=split_list(annotations.get(USE_GPUTYPE)),
            nouse_types=split_list(annotations.get(NOUSE_GPUTYPE)),
            use_uuids=split_list(annotations.get(USE_GPUUUID)),
            nouse_uuids=split_list(annotations.get(NOUSE_GPUUUID)),
            numa_bind=parse_bool(numa, field=NUMA_BIND) if numa is not None else False,
            mode=(annotations.get(VGPU_MODE) or "").strip(),
        )

    def type_matches(self, device: Device, selection: Selection) -> bool:
        t = device.type.lower()
        if selection.use_types and not any(u.lower() in t for u in selection.use_types):
            return False
        if any(u.lower() in t for u in selection.nouse_types):
            return False
        # HAMi: the device's mode must be a substring of the pod's vgpu-mode value.
        return not (selection.mode and device.mode not in selection.mode)

    # -- registration / allocation --------------------------------------------------------------

    def node_devices(self, node: Mapping[str, Any]) -> list[Device] | None:
        value = A.pod_annotations(node).get(self.register_key)
        if value is None:
            return None
        return A.decode_node_devices_json(value, vendor=self.common_word)

    def allocation_annotations(
        self, containers: Sequence[Sequence[ContainerDevice]], *, context: AllocationContext | None = None
    ) -> dict[str, str]:
        encoded = A.encode_pod_devices(containers)
        return {A.NVIDIA_TO_ALLOCATE: encoded, A.NVIDIA_ALLOCATED: encoded}

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
