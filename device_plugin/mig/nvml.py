"""The NVML calls of MIG: a card's GPU-instance profiles and placements, its instances, creating and
destroying a GPU instance with its compute instance.

Through `nvidia-ml-py` (`pynvml`), whose module is injected (`kubefakes.nvml.FakeNvml` in tests), so
the same code runs against a real driver and against the fake. Blocking: call it from a thread.
Errors are pynvml's `NVMLError` subclasses, except where a method says otherwise. MIG mode itself is
only ever read here, never changed: enabling it is an administrator's step (it may reset the card).
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from hami.model import MigPlacement

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProfileInfo:
    """One GPU-instance profile a card supports: NVML's profile id, its name (``2g.20gb``), compute
    slices, how many instances the card takes of it, SMs, MiB, and where instances may start."""

    id: int
    name: str
    slices: int
    instances: int
    sms: int
    memory_mb: int
    placements: tuple[MigPlacement, ...]


@dataclass(frozen=True, slots=True)
class Instance:
    """One GPU instance on a card, with its compute instance (`ci_id` None and `mig_uuid` "" when it
    has none); `busy` when a process runs on it (or NVML could not say)."""

    gpu_uuid: str
    profile: str
    placement: MigPlacement
    gi_id: int
    ci_id: int | None
    mig_uuid: str
    busy: bool = False


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _profile_name(raw: Any, slices: int, memory_mb: int) -> str:
    name = _text(raw).strip()
    if name.startswith("MIG "):
        name = name[4:]
    # Drivers before R470 leave the name empty: NVIDIA's naming rule, <slices>g.<GB>gb.
    return name or f"{slices}g.{round(memory_mb / 1024)}gb"


class MigNvml:
    """MIG through an NVML module (pynvml or its fake). The caller owns nvmlInit / nvmlShutdown."""

    def __init__(self, nvml: ModuleType | Any) -> None:
        self.nv = nvml
        # Compute-instance profile filling a GPU instance of N compute slices (NVML's constants).
        names = {n: f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE" for n in (1, 2, 3, 4, 6, 7, 8)}
        self._ci_of_slices = {n: getattr(nvml, v) for n, v in names.items() if hasattr(nvml, v)}

    # -- reading ------------------------------------------------------------------------------

    def mig_mode(self, handle: Any) -> tuple[bool, bool] | None:
        """(current, pending) MIG mode of a card; None when the card has no MIG."""
        try:
            current, pending = self.nv.nvmlDeviceGetMigMode(handle)
        except self.nv.NVMLError:
            return None
        return bool(current), bool(pending)

    def profiles(self, handle: Any) -> list[ProfileInfo]:
        """Every GPU-instance profile the card supports, with its possible placements."""
        nv, out = self.nv, []
        for pid in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfoV(handle, pid)
            except nv.NVMLError:
                continue  # not supported on this card
            out.append(
                ProfileInfo(
                    id=pid,
                    name=_profile_name(info.name, info.sliceCount, info.memorySizeMB),
                    slices=int(info.sliceCount),
                    instances=int(info.instanceCount),
                    sms=int(info.multiprocessorCount),
                    memory_mb=int(info.memorySizeMB),
                    placements=self._placements(handle, pid),
                )
            )
        return out

    def _placements(self, handle: Any, pid: int) -> tuple[MigPlacement, ...]:
        nv = self.nv
        count = ctypes.c_uint(0)
        try:
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, pid, None, ctypes.byref(count))
            arr = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(handle, pid, arr, ctypes.byref(count))
        except nv.NVMLError as e:
            log.info("no placements for GPU-instance profile %d: %s", pid, e)
            return ()
        return tuple(MigPlacement(int(arr[i].start), int(arr[i].size)) for i in range(count.value))

    def instances(self, handle: Any, gpu_uuid: str, profiles: list[ProfileInfo]) -> list[Instance]:
        """Every GPU instance on the card (of the `profiles` it supports), with its compute instance,
        MIG UUID and whether a process runs on it."""
        nv = self.nv
        migs = self._mig_devices(handle)
        out = []
        for prof in profiles:
            for gi in self._handles(
                nv.nvmlDeviceGetGpuInstances, handle, prof.id, nv.c_nvmlGpuInstance_t, prof.instances
            ):
                info = nv.nvmlGpuInstanceGetInfo(gi)
                placement = MigPlacement(int(info.placement.start), int(info.placement.size))
                ci_id = self._compute_instance(gi)
                mig = migs.get((int(info.id), ci_id)) if ci_id is not None else None
                out.append(
                    Instance(
                        gpu_uuid=gpu_uuid,
                        profile=prof.name,
                        placement=placement,
                        gi_id=int(info.id),
                        ci_id=ci_id,
                        mig_uuid=mig[0] if mig else "",
                        busy=mig[1] if mig else False,
                    )
                )
        return sorted(out, key=lambda i: (i.placement.start, i.gi_id))

    def _handles(self, fn: Any, parent: Any, pid: int, ctype: Any, most: int) -> list[Any]:
        count = ctypes.c_uint(max(most, 1))
        arr = (ctype * max(most, 1))()
        try:
            fn(parent, pid, arr, ctypes.byref(count))
        except self.nv.NVMLError_NotSupported:
            return []
        return [arr[i] for i in range(count.value)]

    def _compute_instance(self, gi: Any) -> int | None:
        nv = self.nv
        for cpid in range(nv.NVML_COMPUTE_INSTANCE_PROFILE_COUNT):
            try:
                cinfo = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                    gi, cpid, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
                )
            except nv.NVMLError:
                continue
            for ci in self._handles(nv.nvmlGpuInstanceGetComputeInstances, gi, cpid, nv.c_nvmlComputeInstance_t,
                                    int(cinfo.instanceCount)):  # fmt: skip
                return int(nv.nvmlComputeInstanceGetInfo(ci).id)
        return None

    def _mig_devices(self, handle: Any) -> dict[tuple[int, int], tuple[str, bool]]:
        """(gi id, ci id) -> (MIG UUID, busy) of the card's MIG devices."""
        nv, out = self.nv, {}
        try:
            most = nv.nvmlDeviceGetMaxMigDeviceCount(handle)
        except nv.NVMLError:
            return out
        for i in range(most):
            try:
                mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except nv.NVMLError:
                continue  # indexes of a card's MIG devices may have gaps
            key = (int(nv.nvmlDeviceGetGpuInstanceId(mig)), int(nv.nvmlDeviceGetComputeInstanceId(mig)))
            out[key] = (_text(nv.nvmlDeviceGetUUID(mig)), self._busy(mig))
        return out

    def _busy(self, mig_handle: Any) -> bool:
        try:
            return bool(self.nv.nvmlDeviceGetComputeRunningProcesses(mig_handle))
        except self.nv.NVMLError:
            return True  # cannot tell: never treat it as idle (it could be destroyed under a process)

    def busy(self, mig_uuid: str) -> bool:
        """Whether a process runs on MIG device `mig_uuid` (True when NVML cannot tell)."""
        try:
            return self._busy(self.nv.nvmlDeviceGetHandleByUUID(mig_uuid))
        except self.nv.NVMLError_NotFound:
            return False
        except self.nv.NVMLError:
            return True

    # -- changing -----------------------------------------------------------------------------

    def create(self, handle: Any, gpu_uuid: str, profile: ProfileInfo, placement: MigPlacement) -> Instance:
        """A GPU instance of `profile` at exactly `placement`, with a compute instance filling it.

        A GPU instance whose compute instance cannot be made is destroyed again, so nothing is left
        half made. Raises pynvml's NVMLError (INVALID_ARGUMENT: a placement the profile does not
        allow; INSUFFICIENT_RESOURCES: it overlaps an instance, or the profile's count is reached).
        """
        nv = self.nv
        want = nv.c_nvmlGpuInstancePlacement_t()
        want.start, want.size = placement.start, placement.size
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(handle, profile.id, want)
        try:
            info = nv.nvmlGpuInstanceGetInfo(gi)
            cpid = self._ci_of_slices[profile.slices]
            cinfo = nv.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, cpid, nv.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = nv.nvmlGpuInstanceCreateComputeInstance(gi, int(cinfo.id))
        except Exception:
            self._quietly(nv.nvmlGpuInstanceDestroy, gi)
            raise
        try:
            ci_id = int(nv.nvmlComputeInstanceGetInfo(ci).id)
            mig = self._mig_devices(handle).get((int(info.id), ci_id))
            if mig is None:
                raise nv.NVMLError(nv.NVML_ERROR_NOT_FOUND)
        except Exception:
            self._quietly(nv.nvmlComputeInstanceDestroy, ci)
            self._quietly(nv.nvmlGpuInstanceDestroy, gi)
            raise
        return Instance(gpu_uuid, profile.name, placement, int(info.id), ci_id, mig[0], False)

    def destroy(self, handle: Any, gi_id: int, ci_id: int | None) -> None:
        """Destroy compute instance `ci_id` (if any) and then GPU instance `gi_id`; gone already is fine.

        Raises NVMLError_InUse when a process still runs on it.
        """
        nv = self.nv
        try:
            gi = nv.nvmlDeviceGetGpuInstanceById(handle, gi_id)
        except nv.NVMLError_NotFound:
            return
        if ci_id is not None:
            try:
                nv.nvmlComputeInstanceDestroy(nv.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id))
            except nv.NVMLError_NotFound:
                pass
        nv.nvmlGpuInstanceDestroy(gi)

    def _quietly(self, fn: Any, *args: Any) -> None:
        try:
            fn(*args)
        except self.nv.NVMLError as e:
            log.warning("cleanup of a half-made MIG instance failed: %s", e)
