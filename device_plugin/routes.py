"""The device plugin's protocol handlers: the generic v1beta1 DevicePlugin gRPC service, serving any
backend's `DeviceState`; the gRPC status codes of refused Allocates are chosen here.

It speaks kubelet's protocol and nothing else (k8s-protocols.md §2): full device list on every
ListAndWatch message, options that match what registration sent, one Allocate response per container
request in request order, and GetPreferredAllocation that never fails (an error there fails the pod).
Which cards a container gets is decided elsewhere (`AllocationPolicy`, in production
`device_plugin.allocator.Allocator`, reading the scheduler's pod annotations); this module never
touches NVML or the API server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import grpc

from device_plugin.api import HEALTHY, UNHEALTHY
from device_plugin.api import api_pb2 as pb
from device_plugin.api import api_pb2_grpc as rpc
from device_plugin.devices import DeviceState
from device_plugin.errors import AllocationRefused, ApiUnavailable

__all__ = [
    "AllocationPolicy",
    "AllocationRefused",
    "DevicePluginService",
    "list_response",
    "options",
    "status_code",
]

log = logging.getLogger(__name__)


def status_code(error: AllocationRefused) -> grpc.StatusCode:
    """The gRPC status of a refused Allocate: UNAVAILABLE when the API server failed (worth a retry),
    else FAILED_PRECONDITION (the pod or node is not in a state that can be served)."""
    if isinstance(error, ApiUnavailable):
        return grpc.StatusCode.UNAVAILABLE
    return grpc.StatusCode.FAILED_PRECONDITION


class AllocationPolicy(Protocol):
    """Decides the answer to kubelet's per-container requests."""

    async def preferred(self, requests: Sequence[pb.ContainerPreferredAllocationRequest]) -> list[list[str]]:
        """One preferred id list per request (empty = no preference). Must not raise."""
        ...

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list[pb.ContainerAllocateResponse]:
        """One response per request of device ids, same order. Raises AllocationRefused."""
        ...


def options() -> pb.DevicePluginOptions:
    """The plugin's options, sent both in RegisterRequest.options and from GetDevicePluginOptions.

    PreStartContainer is not needed (all work happens in Allocate); GetPreferredAllocation is always
    offered because it is what keeps kubelet's replica choice on the scheduler's cards.
    """
    return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)


def list_response(state: DeviceState) -> pb.ListAndWatchResponse:
    """The full device list: one Device per virtual id, health of its card, NUMA topology if enabled."""
    devices = []
    for dev_id, healthy, numa in state.virtual_devices():
        topo = pb.TopologyInfo(nodes=[pb.NUMANode(ID=numa)]) if numa is not None else None
        devices.append(pb.Device(ID=dev_id, health=HEALTHY if healthy else UNHEALTHY, topology=topo))
    return pb.ListAndWatchResponse(devices=devices)


class DevicePluginService(rpc.DevicePluginServicer):
    """`v1beta1.DevicePlugin` over a DeviceState and an AllocationPolicy.

    `on_allocate_error(reason)` is called for every refused Allocate (metrics hook).
    """

    def __init__(
        self,
        state: DeviceState,
        policy: AllocationPolicy,
        *,
        on_allocate_error: Callable[[str], None] | None = None,
    ) -> None:
        self.state = state
        self.policy = policy
        self.on_allocate_error = on_allocate_error or (lambda reason: None)
        self._closing = asyncio.Event()

    def close(self) -> None:
        """End the ListAndWatch streams (before the server stops, so stopping need not wait for them)."""
        self._closing.set()

    async def GetDevicePluginOptions(  # noqa: N802
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> pb.DevicePluginOptions:
        return options()

    async def ListAndWatch(  # noqa: N802
        self, request: pb.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ListAndWatchResponse]:
        version = self.state.version
        log.info("ListAndWatch: kubelet connected, sending %d devices", len(self.state.virtual_devices()))
        yield list_response(self.state)
        # Ending this stream tells kubelet the plugin is gone, so it only ends when the server stops.
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            while not self._closing.is_set():
                change = asyncio.ensure_future(self.state.wait_change(version))
                await asyncio.wait({change, closing}, return_when=asyncio.FIRST_COMPLETED)
                if not change.done():
                    change.cancel()
                    break
                if change.result() != version:
                    version = change.result()
                    yield list_response(self.state)
        finally:
            closing.cancel()

    async def GetPreferredAllocation(  # noqa: N802
        self, request: pb.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreferredAllocationResponse:
        reqs = list(request.container_requests)
        try:
            prefs = await self.policy.preferred(reqs)
        except Exception:  # an error here would fail the pod's admission; no preference is always legal
            log.exception("GetPreferredAllocation failed; answering without preference")
            prefs = [[] for _ in reqs]
        return pb.PreferredAllocationResponse(
            container_responses=[pb.ContainerPreferredAllocationResponse(deviceIDs=p) for p in prefs]
        )

    async def Allocate(  # noqa: N802
        self, request: pb.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> pb.AllocateResponse:
        reqs = [list(r.devices_ids) for r in request.container_requests]
        try:
            if not reqs:
                raise AllocationRefused("empty_request", "AllocateRequest has no container_requests")
            responses = await self.policy.allocate(reqs)
        except AllocationRefused as e:
            log.warning("Allocate %s refused (%s): %s", reqs, e.reason, e.message)
            self.on_allocate_error(e.reason)
            await context.abort(status_code(e), e.message)
        except Exception as e:  # never show a stack trace to kubelet / the user
            log.exception("Allocate %s failed unexpectedly", reqs)
            self.on_allocate_error("internal")
            await context.abort(
                grpc.StatusCode.INTERNAL, f"device plugin internal error: {type(e).__name__}: {e}"
            )
        return pb.AllocateResponse(container_responses=responses)

    async def PreStartContainer(  # noqa: N802
        self, request: pb.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> pb.PreStartContainerResponse:
        return pb.PreStartContainerResponse()
