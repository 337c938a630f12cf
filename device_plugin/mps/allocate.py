"""Allocate in `mps` mode: the hami-core response (libvgpu preloaded, so memory limits, the usage
file and the monitor's metrics stay what they are in `hami-core` mode) with the SMs shared by MPS
instead of libvgpu's time-slicing limiter.

The container is a client of its card's MPS control daemon (`device_plugin.mps.daemon`):

- ``CUDA_MPS_PIPE_DIRECTORY`` / ``CUDA_MPS_LOG_DIRECTORY`` point at the card's pipe and log
  directories, mounted at ``/tmp/nvidia-mps`` and ``/tmp/nvidia-log``;
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` is the container's ``nvidia.com/gpucores`` (not set for 0,
  HAMi's "no core limit", or 100);
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` is ``0=<gpumem>M``, MPS's own memory cap, beside libvgpu's;
- ``CUDA_DEVICE_SM_LIMIT=0``: libvgpu's compute limiter is off, MPS does that part.

One daemon serves one card, and a CUDA client talks to one daemon, so a container in this mode gets
exactly one card; a container the scheduler gave more is refused with a message saying so.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from device_plugin.api import api_pb2 as pb
from device_plugin.errors import AllocationRefused
from device_plugin.mps.daemon import MpsDaemons
from hami.model import ContainerDevice

if TYPE_CHECKING:
    from device_plugin.allocation_types import PendingPod

CTR_PIPE_DIR = "/tmp/nvidia-mps"
CTR_LOG_DIR = "/tmp/nvidia-log"
ENV_PIPE = "CUDA_MPS_PIPE_DIRECTORY"
ENV_LOG = "CUDA_MPS_LOG_DIRECTORY"
ENV_THREADS = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_PINNED = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

Refuse = Callable[[str, str], Awaitable[AllocationRefused]]


def mps_env(device: ContainerDevice) -> dict[str, str]:
    """The MPS client environment of a container holding `device` (one card)."""
    envs = {ENV_PIPE: CTR_PIPE_DIR, ENV_LOG: CTR_LOG_DIR, ENV_PINNED: f"0={device.usedmem}M"}
    if 0 < device.usedcores < 100:
        envs[ENV_THREADS] = str(device.usedcores)
    return envs


class MpsResponder:
    """The `mps` mode's container responses (plugged into `device_plugin.allocator.Allocator`)."""

    def __init__(self, daemons: MpsDaemons, *, ready_timeout_s: float = 10.0) -> None:
        self.daemons = daemons
        self.ready_timeout_s = ready_timeout_s

    async def respond(
        self, pending: PendingPod, ctr: dict, entry: list[ContainerDevice], refuse: Refuse, base: Any
    ) -> pb.ContainerAllocateResponse:
        """`base` is the hami-core response builder (``_respond_hami_core``)."""
        if len(entry) != 1:
            raise await refuse(
                "mps_one_card",
                f"operatingmode mps serves one card per container (one MPS daemon per card, and a CUDA process "
                f"talks to one), but the scheduler recorded {len(entry)}: ask nvidia.com/gpu: 1",
            )
        device = entry[0]
        daemon = self.daemons.get(device.uuid)
        if daemon is None or not await daemon.ready(self.ready_timeout_s):
            where = daemon.log_dir if daemon is not None else self.daemons.root
            raise await refuse(
                "mps_daemon",
                f"the MPS control daemon of card {device.uuid} is not running (its log: {where})",
            )
        response = await base(pending, ctr, entry, refuse, sm_limit=False)
        response.envs.update(mps_env(device))
        response.mounts.extend(
            [
                pb.Mount(container_path=CTR_PIPE_DIR, host_path=str(daemon.pipe_dir), read_only=False),
                pb.Mount(container_path=CTR_LOG_DIR, host_path=str(daemon.log_dir), read_only=False),
            ]
        )
        return response
