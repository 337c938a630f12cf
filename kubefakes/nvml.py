"""A fake NVML with MIG geometry, for the device plugin's tests on machines without a MIG card.

`FakeNvml` stands in for the `pynvml` module (`nvidia-ml-py`): the device plugin's NVML code
(`device_plugin.backends.nvidia`, `device_plugin.mig.nvml`) takes the module as an argument and runs
unchanged against this object. It answers the calls that code makes with pynvml's own signatures,
constants and ctypes structures, including the C-style ones that fill caller-allocated arrays
(`nvmlDeviceGetGpuInstancePossiblePlacements`, `nvmlDeviceGetGpuInstances`, ...).

MIG is modelled as NVIDIA's MIG user guide describes it
(https://docs.nvidia.com/datacenter/tesla/mig-user-guide/):

- a card has 8 memory slices; every GPU-instance profile has its slice count, the number of
  instances the card takes of it, its SMs, its memory and the placements it may start at (the
  ``nvidia-smi mig -lgipp`` table: 1g at 0..6 size 1, 1g with double memory at 0/2/4/6 size 2, 2g at
  0/2/4 size 2, 3g at 0/4 size 4, 4g at 0 size 4, 7g at 0 size 8);
- creating a GPU instance needs MIG mode on (else NOT_SUPPORTED), a placement the profile allows
  (else INVALID_ARGUMENT) that overlaps no existing instance and a profile below its instance count
  (else INSUFFICIENT_RESOURCES); a compute instance of the same size goes into it; a MIG device (with
  its ``MIG-`` UUID) exists for every compute instance;
- destroying a GPU instance that still has compute instances, or a compute instance with running
  processes, is IN_USE; MIG mode is never changed by this fake (the device plugin must not either).

Tests can make one call fail (`fail_next`), start "processes" on a MIG device (`run_process`), create
instances behind the plugin's back as an administrator would (`admin_create`) and wipe every instance
as a reboot does (`reboot`). The card models and their profile tables (`A100_40GB`, `H100_80GB`,
`H200_141GB`, `V100`, ...) are in `kubefakes.gpu_models`, re-exported here.
"""

from __future__ import annotations

import ctypes
import threading
import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pynvml

from kubefakes.gpu_models import (
    A100_40GB,
    A100_80GB,
    CI_PROFILE_OF_SLICES,
    H100_80GB,
    H200_141GB,
    V100,
    GiProfile,
    Model,
)

# -- state ------------------------------------------------------------------------------------------


@dataclass
class _Ci:
    id: int
    profile_id: int
    mig_uuid: str
    processes: list[int] = field(default_factory=list)


@dataclass
class _Gi:
    id: int
    profile: GiProfile
    start: int
    cis: dict[int, _Ci] = field(default_factory=dict)

    def slices(self) -> range:
        return range(self.start, self.start + self.profile.size)


@dataclass
class Gpu:
    """One fake card: model, UUID, MIG mode (current, pending), NUMA node, its GPU instances."""

    model: Model
    uuid: str
    mig: bool = False
    pending: bool | None = None
    numa: int | None = 0
    gis: dict[int, _Gi] = field(default_factory=dict)
    processes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class _Handle:
    """A device handle: a card (`mig` None) or one of its MIG devices (gi, ci ids)."""

    gpu: int
    mig: tuple[int, int] | None = None


class FakeNvml:
    """The fake `pynvml` module. `gpus` in index order. Thread-safe (one lock, as the driver's)."""

    NVMLError = pynvml.NVMLError
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVMLError_InsufficientResources = pynvml.NVMLError_InsufficientResources
    NVMLError_InUse = pynvml.NVMLError_InUse
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized

    def __init__(self, gpus: Iterable[Gpu]) -> None:
        self.gpus = list(gpus)
        self._lock = threading.RLock()
        self._inited = 0
        self._fail: dict[str, int] = {}
        self.calls: list[str] = []
        self.mig_mode_changes = 0

    def __getattr__(self, name: str) -> Any:
        # Constants and ctypes structures are pynvml's own; functions not faked are not there.
        if name.startswith(("NVML_", "c_nvml", "nvmlEventType")):
            return getattr(pynvml, name)
        raise AttributeError(f"FakeNvml has no {name}")

    # -- test controls ------------------------------------------------------------------------

    def fail_next(self, function: str, error: int) -> None:
        """Make the next call of `function` raise pynvml's error for code `error`."""
        self._fail[function] = error

    def run_process(self, mig_uuid: str, pid: int) -> None:
        """Pretend process `pid` runs on MIG device `mig_uuid` (GetComputeRunningProcesses lists it)."""
        self._ci_by_uuid(mig_uuid).processes.append(pid)

    def stop_processes(self, mig_uuid: str) -> None:
        self._ci_by_uuid(mig_uuid).processes.clear()

    def admin_create(self, gpu: int, profile_name: str, start: int) -> str:
        """Create an instance as an administrator would (``nvidia-smi mig -cgi ... -C``); its MIG UUID."""
        prof = next(p for p in self.gpus[gpu].model.profiles if p.name == profile_name)
        gi = self._create_gi(gpu, prof.id, start)
        return self._create_ci(gpu, gi.id, CI_PROFILE_OF_SLICES[prof.slices]).mig_uuid

    def instances(self, gpu: int) -> list[tuple[str, int, int, int, str]]:
        """(profile, start, gi id, ci id, MIG UUID) of every compute instance of card `gpu`."""
        return sorted(
            (gi.profile.name, gi.start, gi.id, ci.id, ci.mig_uuid)
            for gi in self.gpus[gpu].gis.values()
            for ci in gi.cis.values()
        )

    def reboot(self) -> None:
        """A node reboot: MIG instances do not survive it (MIG mode does)."""
        for g in self.gpus:
            g.gis.clear()

    # -- internals ----------------------------------------------------------------------------

    def _enter(self, name: str) -> None:
        self.calls.append(name)
        if not self._inited and name not in ("nvmlInit", "nvmlShutdown"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        code = self._fail.pop(name, None)
        if code is not None:
            raise pynvml.NVMLError(code)

    @staticmethod
    def _err(code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def _gpu(self, h: Any) -> Gpu:
        if not isinstance(h, _Handle) or h.mig is not None:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[h.gpu]

    def _ci_by_uuid(self, mig_uuid: str) -> _Ci:
        for g in self.gpus:
            for gi in g.gis.values():
                for ci in gi.cis.values():
                    if ci.mig_uuid == mig_uuid:
                        return ci
        raise KeyError(mig_uuid)

    @staticmethod
    def _key(handle: Any) -> int:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0

    @staticmethod
    def _gi_handle(gpu: int, gi: int) -> Any:
        return ctypes.cast(ctypes.c_void_p((gpu + 1) << 16 | gi), pynvml.c_nvmlGpuInstance_t)

    @staticmethod
    def _ci_handle(gpu: int, gi: int, ci: int) -> Any:
        return ctypes.cast(ctypes.c_void_p((gpu + 1) << 24 | gi << 8 | ci), pynvml.c_nvmlComputeInstance_t)

    def _gi_of(self, handle: Any) -> tuple[int, _Gi]:
        key = self._key(handle)
        gpu, gi_id = (key >> 16) - 1, key & 0xFFFF
        try:
            return gpu, self.gpus[gpu].gis[gi_id]
        except (IndexError, KeyError):
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND) from None

    def _ci_of(self, handle: Any) -> tuple[int, _Gi, _Ci]:
        key = self._key(handle)
        gpu, gi_id, ci_id = (key >> 24) - 1, (key >> 8) & 0xFFFF, key & 0xFF
        try:
            gi = self.gpus[gpu].gis[gi_id]
            return gpu, gi, gi.cis[ci_id]
        except (IndexError, KeyError):
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND) from None

    def _profile(self, g: Gpu, profile_id: int) -> GiProfile:
        if not g.model.profiles:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        for p in g.model.profiles:
            if p.id == profile_id:
                return p
        raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _create_gi(self, gpu: int, profile_id: int, start: int) -> _Gi:
        g = self.gpus[gpu]
        if not g.mig:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        prof = self._profile(g, profile_id)
        if start not in prof.starts:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        want = set(range(start, start + prof.size))
        if any(want & set(gi.slices()) for gi in g.gis.values()):
            raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        if sum(gi.profile.id == profile_id for gi in g.gis.values()) >= prof.instances:
            raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        gi_id = next(i for i in range(1, 64) if i not in g.gis)
        gi = g.gis[gi_id] = _Gi(gi_id, prof, start)
        return gi

    def _create_ci(self, gpu: int, gi_id: int, ci_profile: int) -> _Ci:
        gi = self.gpus[gpu].gis[gi_id]
        if ci_profile != CI_PROFILE_OF_SLICES[gi.profile.slices] or gi.cis:
            raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_RESOURCES)
        mig_uuid = "MIG-" + str(uuidlib.uuid4())
        ci = gi.cis[0] = _Ci(0, ci_profile, mig_uuid)
        return ci

    def _mig_devices(self, gpu: int) -> list[tuple[int, int]]:
        return sorted((gi.id, ci.id) for gi in self.gpus[gpu].gis.values() for ci in gi.cis.values())

    # -- pynvml: init and cards -----------------------------------------------------------------

    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        self._enter("nvmlInit")
        self._inited += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self._enter("nvmlShutdown")
        self._inited = max(0, self._inited - 1)

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self.gpus):
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(i)

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetHandleByUUID")
        uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, g in enumerate(self.gpus):
            if g.uuid == uuid:
                return _Handle(i)
            for gi_id, ci_id in self._mig_devices(i):
                if g.gis[gi_id].cis[ci_id].mig_uuid == uuid:
                    return _Handle(i, (gi_id, ci_id))
        raise self._err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetIndex")
        return h.gpu

    def nvmlDeviceGetUUID(self, h: _Handle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetUUID")
        g = self.gpus[h.gpu]
        if h.mig is None:
            return g.uuid
        gi_id, ci_id = h.mig
        return g.gis[gi_id].cis[ci_id].mig_uuid

    def nvmlDeviceGetName(self, h: _Handle) -> str:  # noqa: N802
        self._enter("nvmlDeviceGetName")
        g = self.gpus[h.gpu]
        if h.mig is None:
            return g.model.name
        return f"{g.model.name} MIG {g.gis[h.mig[0]].profile.name}"

    def nvmlDeviceGetMemoryInfo(self, h: _Handle) -> SimpleNamespace:  # noqa: N802
        self._enter("nvmlDeviceGetMemoryInfo")
        g = self.gpus[h.gpu]
        mib = g.model.memory_mib if h.mig is None else g.gis[h.mig[0]].profile.memory_mb
        return SimpleNamespace(total=mib << 20, free=mib << 20, used=0)

    def nvmlDeviceGetNumaNodeId(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetNumaNodeId")
        numa = self.gpus[h.gpu].numa
        if numa is None:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return numa

    def nvmlDeviceGetPciInfo(self, h: _Handle) -> SimpleNamespace:  # noqa: N802
        self._enter("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=f"00000000:{h.gpu + 0x10:02X}:00.0")

    def nvmlDeviceGetMigMode(self, h: _Handle) -> tuple[int, int]:  # noqa: N802
        self._enter("nvmlDeviceGetMigMode")
        g = self._gpu(h)
        if not g.model.profiles:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        pending = g.mig if g.pending is None else g.pending
        return int(g.mig), int(pending)

    def nvmlDeviceSetMigMode(self, h: _Handle, mode: int) -> int:  # noqa: N802
        # Modelled so a test can prove the plugin never calls it.
        self._enter("nvmlDeviceSetMigMode")
        self.mig_mode_changes += 1
        raise self._err(pynvml.NVML_ERROR_NO_PERMISSION)

    def nvmlDeviceIsMigDeviceHandle(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceIsMigDeviceHandle")
        return int(h.mig is not None)

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, h: _Handle) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle")
        return _Handle(h.gpu)

    def nvmlDeviceGetComputeRunningProcesses(self, h: _Handle) -> list[SimpleNamespace]:  # noqa: N802
        self._enter("nvmlDeviceGetComputeRunningProcesses")
        g = self.gpus[h.gpu]
        if h.mig is None:
            pids = list(g.processes)
            if g.mig:
                pids += [p for gi in g.gis.values() for ci in gi.cis.values() for p in ci.processes]
        else:
            pids = list(g.gis[h.mig[0]].cis[h.mig[1]].processes)
        return [SimpleNamespace(pid=p, usedGpuMemory=0) for p in pids]

    # -- pynvml: MIG ----------------------------------------------------------------------------

    def nvmlDeviceGetGpuInstanceProfileInfoV(self, h: _Handle, profile: int, version: int = 2) -> Any:  # noqa: N802
        self._enter("nvmlDeviceGetGpuInstanceProfileInfoV")
        p = self._profile(self._gpu(h), profile)
        info = pynvml.c_nvmlGpuInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = p.id, p.slices, p.instances
        info.multiprocessorCount, info.memorySizeMB = p.sms, p.memory_mb
        info.name = f"MIG {p.name}".encode()
        return info

    nvmlDeviceGetGpuInstanceProfileInfo = nvmlDeviceGetGpuInstanceProfileInfoV  # noqa: N815

    def nvmlDeviceGetGpuInstancePossiblePlacements(
        self, h: _Handle, profile_id: int, arr: Any, count: Any
    ) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuInstancePossiblePlacements")
        p = self._profile(self._gpu(h), profile_id)
        n = count._obj
        if arr is None:
            n.value = len(p.starts)
            return pynvml.NVML_SUCCESS
        if n.value < len(p.starts):
            raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
        for i, s in enumerate(p.starts):
            arr[i].start, arr[i].size = s, p.size
        n.value = len(p.starts)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, h: _Handle, profile_id: int, placement: Any) -> Any:  # noqa: N802
        self._enter("nvmlDeviceCreateGpuInstanceWithPlacement")
        with self._lock:
            prof = self._profile(self._gpu(h), profile_id)
            if placement.size != prof.size:
                raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gi = self._create_gi(h.gpu, profile_id, placement.start)
            return self._gi_handle(h.gpu, gi.id)

    def nvmlDeviceGetGpuInstances(self, h: _Handle, profile_id: int, arr: Any, count: Any) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuInstances")
        g = self._gpu(h)
        self._profile(g, profile_id)
        ids = sorted(i for i, gi in g.gis.items() if gi.profile.id == profile_id)
        n = count._obj
        if arr is not None:
            if n.value < len(ids):
                raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for k, i in enumerate(ids):
                arr[k] = self._gi_handle(h.gpu, i)
        n.value = len(ids)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, h: _Handle, gi_id: int) -> Any:  # noqa: N802
        self._enter("nvmlDeviceGetGpuInstanceById")
        if gi_id not in self._gpu(h).gis:
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return self._gi_handle(h.gpu, gi_id)

    def nvmlGpuInstanceGetInfo(self, gi_handle: Any) -> Any:  # noqa: N802
        self._enter("nvmlGpuInstanceGetInfo")
        _, gi = self._gi_of(gi_handle)
        info = pynvml.c_nvmlGpuInstanceInfo_t()
        info.id, info.profileId = gi.id, gi.profile.id
        info.placement.start, info.placement.size = gi.start, gi.profile.size
        return info

    def nvmlGpuInstanceGetComputeInstanceProfileInfo(
        self, gi_handle: Any, profile: int, eng: int, version: int = 2
    ) -> Any:  # noqa: N802
        self._enter("nvmlGpuInstanceGetComputeInstanceProfileInfo")
        _, gi = self._gi_of(gi_handle)
        if profile != CI_PROFILE_OF_SLICES.get(gi.profile.slices):
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        info = pynvml.c_nvmlComputeInstanceProfileInfo_v2_t()
        info.id, info.sliceCount, info.instanceCount = profile, gi.profile.slices, 1
        info.multiprocessorCount = gi.profile.sms
        return info

    def nvmlGpuInstanceCreateComputeInstance(self, gi_handle: Any, profile_id: int) -> Any:  # noqa: N802
        self._enter("nvmlGpuInstanceCreateComputeInstance")
        with self._lock:
            gpu, gi = self._gi_of(gi_handle)
            ci = self._create_ci(gpu, gi.id, profile_id)
            return self._ci_handle(gpu, gi.id, ci.id)

    def nvmlGpuInstanceGetComputeInstances(
        self, gi_handle: Any, profile_id: int, arr: Any, count: Any
    ) -> int:  # noqa: N802
        self._enter("nvmlGpuInstanceGetComputeInstances")
        gpu, gi = self._gi_of(gi_handle)
        ids = sorted(i for i, ci in gi.cis.items() if ci.profile_id == profile_id)
        n = count._obj
        if arr is not None:
            if n.value < len(ids):
                raise self._err(pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
            for k, i in enumerate(ids):
                arr[k] = self._ci_handle(gpu, gi.id, i)
        n.value = len(ids)
        return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceGetComputeInstanceById(self, gi_handle: Any, ci_id: int) -> Any:  # noqa: N802
        self._enter("nvmlGpuInstanceGetComputeInstanceById")
        gpu, gi = self._gi_of(gi_handle)
        if ci_id not in gi.cis:
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return self._ci_handle(gpu, gi.id, ci_id)

    def nvmlComputeInstanceGetInfo(self, ci_handle: Any) -> Any:  # noqa: N802
        self._enter("nvmlComputeInstanceGetInfo")
        _, gi, ci = self._ci_of(ci_handle)
        info = pynvml.c_nvmlComputeInstanceInfo_t()
        info.id, info.profileId = ci.id, ci.profile_id
        return info

    def nvmlComputeInstanceDestroy(self, ci_handle: Any) -> int:  # noqa: N802
        self._enter("nvmlComputeInstanceDestroy")
        with self._lock:
            _, gi, ci = self._ci_of(ci_handle)
            if ci.processes:
                raise self._err(pynvml.NVML_ERROR_IN_USE)
            del gi.cis[ci.id]
            return pynvml.NVML_SUCCESS

    def nvmlGpuInstanceDestroy(self, gi_handle: Any) -> int:  # noqa: N802
        self._enter("nvmlGpuInstanceDestroy")
        with self._lock:
            gpu, gi = self._gi_of(gi_handle)
            if gi.cis:
                raise self._err(pynvml.NVML_ERROR_IN_USE)
            del self.gpus[gpu].gis[gi.id]
            return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMaxMigDeviceCount(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetMaxMigDeviceCount")
        g = self._gpu(h)
        return 7 if g.model.profiles else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: _Handle, index: int) -> _Handle:  # noqa: N802
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex")
        self._gpu(h)
        devices = self._mig_devices(h.gpu)
        if not 0 <= index < len(devices):
            raise self._err(pynvml.NVML_ERROR_NOT_FOUND)
        return _Handle(h.gpu, devices[index])

    def nvmlDeviceGetGpuInstanceId(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetGpuInstanceId")
        if h.mig is None:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return h.mig[0]

    def nvmlDeviceGetComputeInstanceId(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetComputeInstanceId")
        if h.mig is None:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return h.mig[1]

    # -- pynvml: XID events (none ever come) ----------------------------------------------------

    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        self._enter("nvmlEventSetCreate")
        return object()

    def nvmlEventSetFree(self, s: object) -> None:  # noqa: N802
        self._enter("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, h: _Handle) -> int:  # noqa: N802
        self._enter("nvmlDeviceGetSupportedEventTypes")
        return pynvml.nvmlEventTypeXidCriticalError

    def nvmlDeviceRegisterEvents(self, h: _Handle, types: int, s: object) -> None:  # noqa: N802
        self._enter("nvmlDeviceRegisterEvents")

    def nvmlEventSetWait(self, s: object, ms: int) -> None:  # noqa: N802
        # Not recorded in `calls`: the health thread polls it every `ms` milliseconds.
        threading.Event().wait(min(ms, 50) / 1000)
        raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


def gpu(model: Model, index: int, *, mig: bool = True, **kw: Any) -> Gpu:
    """A fake card of `model` with a stable UUID ``GPU-fake-<index>-...`` (MIG mode on by default)."""
    uid = uuidlib.uuid5(uuidlib.NAMESPACE_OID, f"fake-gpu-{index}")
    return Gpu(model, f"GPU-{uid}", mig=mig and bool(model.profiles), **kw)


__all__ = ["A100_40GB", "A100_80GB", "CI_PROFILE_OF_SLICES", "FakeNvml", "GiProfile", "Gpu", "H100_80GB",
           "H200_141GB", "Model", "V100", "gpu"]  # fmt: skip
