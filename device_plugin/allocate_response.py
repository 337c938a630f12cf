"""The Allocate response for one container's cards: HAMi-core's env (limits in MiB ``<n>m``, SM percent,
the shared usage cache) and the mounts (libvgpu, its preload file, the per-container cache dir), after
preparing the host directories (hami-legacy-spec §3.4). HAMi also mounts a node-wide writable lock
directory at /tmp/vgpulock into every container; libvgpu reads nothing there, and a directory every
tenant of the node can write is a channel between them, so it is not mounted.

`ResponseBuilder` is a mixin of `device_plugin.allocator.Allocator`, which holds the settings.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import uuid as uuidlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from device_plugin import vgpu_config
from device_plugin.api import api_pb2 as pb
from hami.model import ContainerDevice
from hami.vendors.nvidia import control_disabled

if TYPE_CHECKING:
    from device_plugin.allocation_types import AllocatorSettings, PendingPod

# Env names HAMi-core reads (hami-legacy-spec §3.4).
ENV_VISIBLE = "NVIDIA_VISIBLE_DEVICES"
ENV_MEMORY_LIMIT = "CUDA_DEVICE_MEMORY_LIMIT_{i}"  # "<MiB>m" per device position in the container
ENV_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"  # percent of SMs; 0 = no core limit
ENV_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"  # the usage file libvgpu writes, read by the monitor
ENV_OVERSUBSCRIBE = "CUDA_OVERSUBSCRIBE"  # "true" when deviceMemoryScaling > 1
ENV_LOG_LEVEL = "LIBCUDA_LOG_LEVEL"
ENV_CORE_POLICY = "GPU_CORE_UTILIZATION_POLICY"  # "disable" when disableCoreLimit
ENV_DISABLE_CONTROL = "CUDA_DISABLE_CONTROL"  # set (and written to vgpu.config) for an exclusive opt-out

# Container-side paths (HAMi-core's expectations).
CTR_PRELOAD = "/etc/ld.so.preload"


class ResponseBuilder:
    """Env and mounts of `device_plugin.allocator.Allocator`'s responses (a mixin)."""

    settings: AllocatorSettings  # set by Allocator.__init__
    #: The `mig` / `mps` mode's responder (`device_plugin.mig.allocate`, `device_plugin.mps.allocate`),
    #: None in `hami-core` mode; it may build on the hami-core response (`_respond_hami_core`).
    mode_responder: Any = None

    async def _respond(
        self,
        pending: PendingPod,
        ctr: dict,
        entry: list[ContainerDevice],
        refuse: Callable[[str, str], Any],
        *,
        fresh: bool = True,
    ) -> pb.ContainerAllocateResponse:
        """The response for `entry`'s cards, by the node's operating mode. `fresh`: see
        `_respond_hami_core`."""
        core = functools.partial(self._respond_hami_core, fresh=fresh)
        if self.mode_responder is not None:
            return await self.mode_responder.respond(pending, ctr, entry, refuse, core)
        return await core(pending, ctr, entry, refuse)

    async def _respond_hami_core(
        self,
        pending: PendingPod,
        ctr: dict,
        entry: list[ContainerDevice],
        refuse: Callable[[str, str], Any],
        *,
        sm_limit: bool = True,
        fresh: bool = True,
    ) -> pb.ContainerAllocateResponse:
        """The response for `entry`'s cards: env (limits, shared cache) and mounts (libvgpu, dirs).

        `refuse(reason, message)` is awaited to build the error raised when the host is not ready.
        Without `sm_limit` libvgpu limits memory only (MPS shares the SMs).
        `fresh`: start the container's host directory empty (False when the same container is served
        again after a reboot: it is its own directory).
        """
        s = self.settings
        name = ctr.get("name", "?")
        recorded = [d.uuid for d in entry]
        lib = s.vgpu_dir / "libvgpu.so"
        preload = s.vgpu_dir / "ld.so.preload"
        # The control switch turns off only for a container the scheduler gave whole, exclusive cards
        # because its spec literally sets CUDA_DISABLE_CONTROL true (what the scheduler can see; 100 %
        # of every card is its mark). A value from envFrom/valueFrom, or a shared card, keeps libvgpu
        # enforcing: the file below is the authority, and libvgpu ignores the environment's switch.
        control = not (control_disabled(ctr) and bool(entry) and all(d.usedcores >= 100 for d in entry))
        missing = [str(p) for p in ((lib, preload) if control else (lib,)) if not p.is_file()]
        if missing:
            raise await refuse(
                "libvgpu_missing",
                f"{', '.join(missing)} missing on node {s.node_name}; the device plugin DaemonSet installs them",
            )
        try:
            cache_dir = await asyncio.to_thread(self._prepare_dirs, pending.uid, name, fresh)
        except OSError as e:
            raise await refuse("host_dir", f"cannot prepare host directories: {e}") from None

        envs = {ENV_VISIBLE: ",".join(recorded)}
        for i, dev in enumerate(entry):
            envs[ENV_MEMORY_LIMIT.format(i=i)] = f"{dev.usedmem}m"
        envs[ENV_SM_LIMIT] = str(entry[0].usedcores) if sm_limit else "0"
        envs[ENV_SHARED_CACHE] = f"{s.vgpu_dir}/{uuidlib.uuid4()}.cache"
        if s.memory_scaling > 1:
            envs[ENV_OVERSUBSCRIBE] = "true"
        if s.lib_cuda_log_level:
            envs[ENV_LOG_LEVEL] = s.lib_cuda_log_level
        if s.disable_core_limit:
            envs[ENV_CORE_POLICY] = "disable"
        # libvgpu's read-only config file (the authority for its limits, switch, region path and
        # priority: the container's environment may only lower a limit) and the node-wide per-card
        # regions (fair sharing between the card's containers): vgpu_config.py
        envs[vgpu_config.ENV_CARD_DIR] = str(vgpu_config.card_dir(s.vgpu_dir))
        if not control:
            envs[ENV_DISABLE_CONTROL] = "true"  # written into vgpu.config as well
        try:
            extra = await asyncio.to_thread(vgpu_config.prepare, s.vgpu_dir, cache_dir, envs, recorded, ctr)
        except (OSError, vgpu_config.ConfigFileError) as e:
            raise await refuse(
                "host_dir", f"cannot write the libvgpu config file or card regions: {e}"
            ) from None
        mounts = [
            pb.Mount(container_path=str(lib), host_path=str(lib), read_only=True),
            pb.Mount(container_path=str(s.vgpu_dir), host_path=str(cache_dir), read_only=False),
        ]
        if control:
            mounts.append(pb.Mount(container_path=CTR_PRELOAD, host_path=str(preload), read_only=True))
        mounts += [pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
                   for m in extra]  # fmt: skip
        return pb.ContainerAllocateResponse(envs=envs, mounts=mounts)

    def _prepare_dirs(self, pod_uid: str, container: str, fresh: bool = True) -> Path:
        """``<hook>/vgpu/containers/<podUID>_<ctr>`` (0777; emptied when `fresh`) on the host."""
        s = self.settings
        cache_dir = s.vgpu_dir / "containers" / f"{pod_uid}_{container}"
        if fresh:
            shutil.rmtree(cache_dir, ignore_errors=True)  # a stale cache file would carry another run's usage
        cache_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(cache_dir, 0o777)  # noqa: S103 - any container user must be able to write its cache
        return cache_dir
