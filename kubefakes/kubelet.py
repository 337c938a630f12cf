"""A fake kubelet device manager for tests: Registration server, dial-back, ListAndWatch, admission.

It behaves like kubelet's device manager where a plugin can tell the difference:
- serves ``v1beta1.Registration`` on ``<dir>/kubelet.sock``; validates the version and the resource name
  with kubelet's messages; in ``sync`` mode (kubelets >= 1.25) dials the plugin back and calls
  GetDevicePluginOptions *inside* Register, in legacy mode (1.23/1.24) takes ``RegisterRequest.options``
  and dials in the background;
- consumes one ListAndWatch stream per registration, each message a full snapshot (missing = removed);
  a stream end marks every device of the resource unhealthy;
- admits containers one at a time: picks from healthy minus allocated, calls GetPreferredAllocation with
  exactly one container request when the plugin offers it, intersects the answer with the candidates and
  fills up itself, then calls Allocate with exactly one container request and uses only response [0];
  an Allocate error becomes ``Allocate failed due to <err>, which is unexpected`` (UnexpectedAdmissionError);
- `restart()` deletes every socket in the directory (the plugin's too) and creates a new kubelet.sock.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from device_plugin.api import api_pb2 as pb
from device_plugin.api import api_pb2_grpc as rpc

SUPPORTED_VERSIONS = ["v1beta1"]
_QUALIFIED = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")


class AdmissionError(Exception):
    """Pod admission failed (kubelet: reason UnexpectedAdmissionError)."""


def is_extended_resource_name(name: str) -> bool:
    """kubelet's IsExtendedResourceName, enough for tests: has '/', not kubernetes.io, valid qualified name."""
    if "/" not in name or name.startswith("requests."):
        return False
    prefix, _, short = name.partition("/")
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or not prefix or len(prefix) > 253:
        return False
    return len(short) <= 63 and bool(_QUALIFIED.match(short))


@dataclass
class Endpoint:
    """One registered plugin (per resource name)."""

    resource: str
    socket: Path
    options: pb.DevicePluginOptions
    channel: grpc.aio.Channel
    stub: rpc.DevicePluginStub
    devices: dict[str, pb.Device] = field(default_factory=dict)
    snapshots: int = 0
    stopped: bool = False
    task: asyncio.Task | None = None

    def healthy(self) -> set[str]:
        return {i for i, d in self.devices.items() if not self.stopped and d.health == "Healthy"}

    def unhealthy(self) -> set[str]:
        return set(self.devices) - self.healthy()


class FakeKubelet(rpc.RegistrationServicer):
    """The device-manager side of kubelet over a temp socket dir. Use `start()` / `stop()` in a fixture."""

    def __init__(self, socket_dir: str | Path, *, sync_options: bool = True) -> None:
        self.socket_dir = Path(socket_dir)
        self.sync_options = sync_options
        self.endpoints: dict[str, Endpoint] = {}
        self.allocated: dict[str, set[str]] = {}
        self.register_requests: list[pb.RegisterRequest] = []
        self.options_calls = 0
        self.preferred_requests: list[pb.PreferredAllocationRequest] = []
        self.allocate_requests: list[pb.AllocateRequest] = []
        self._server: grpc.aio.Server | None = None
        self._changed = asyncio.Condition()

    @property
    def socket(self) -> Path:
        return self.socket_dir / "kubelet.sock"

    # ----- lifecycle

    async def start(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        server = grpc.aio.server()
        rpc.add_RegistrationServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        for ep in self.endpoints.values():
            await self._close_endpoint(ep)
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def restart(self) -> None:
        """Kubelet restart: stop, delete every socket in the dir (plugins' too), serve a new kubelet.sock.

        Endpoints are kept but stopped (capacity stays, allocatable 0) until the plugin registers again;
        allocations survive, as kubelet restores them from its checkpoint.
        """
        await self.stop()
        for p in self.socket_dir.iterdir():
            with contextlib.suppress(FileNotFoundError):
                if stat.S_ISSOCK(p.lstat().st_mode):
                    p.unlink()
        await self.start()

    async def _close_endpoint(self, ep: Endpoint) -> None:
        ep.stopped = True
        if ep.task is not None:
            ep.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await ep.task
        await ep.channel.close()

    # ----- Registration service

    async def Register(self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext) -> pb.Empty:  # noqa: N802
        self.register_requests.append(request)
        if request.version not in SUPPORTED_VERSIONS:
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f'requested API version "{request.version}" is not supported by kubelet. '
                f"Supported version is {SUPPORTED_VERSIONS}",
            )
        if not is_extended_resource_name(request.resource_name):
            await context.abort(
                grpc.StatusCode.UNKNOWN, f'the ResourceName "{request.resource_name}" is invalid'
            )
        socket = self.socket_dir / request.endpoint
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        stub = rpc.DevicePluginStub(channel)
        if self.sync_options:
            try:
                await asyncio.wait_for(channel.channel_ready(), 10)
            except TimeoutError:
                await channel.close()
                await context.abort(grpc.StatusCode.UNKNOWN, f"failed to dial device plugin: {socket}")
            try:
                opts = await stub.GetDevicePluginOptions(pb.Empty())
                self.options_calls += 1
            except grpc.aio.AioRpcError as e:
                await channel.close()
                await context.abort(
                    grpc.StatusCode.UNKNOWN, f"failed to get device plugin options: {e.details()}"
                )
        else:
            opts = request.options
        old = self.endpoints.get(request.resource_name)
        if old is not None:  # the last registration wins
            await self._close_endpoint(old)
        ep = Endpoint(resource=request.resource_name, socket=socket, options=opts, channel=channel, stub=stub)
        self.endpoints[request.resource_name] = ep
        ep.task = asyncio.create_task(self._list_and_watch(ep))
        return pb.Empty()

    async def _list_and_watch(self, ep: Endpoint) -> None:
        try:
            async for msg in ep.stub.ListAndWatch(pb.Empty()):
                ep.devices = {d.ID: d for d in msg.devices}
                ep.snapshots += 1
                await self._notify()
        except grpc.aio.AioRpcError:
            pass
        finally:
            # The stream ended: kubelet treats the plugin as gone until it registers again.
            ep.stopped = True
            await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # ----- waiting helpers for tests

    async def wait_for(self, predicate: Callable[[], bool], timeout: float = 5.0) -> None:
        """Wait until `predicate()` holds (re-checked on every kubelet-side change); TimeoutError otherwise."""

        async def _wait() -> None:
            async with self._changed:
                await self._changed.wait_for(predicate)

        # Registration and file-based changes do not always pass through _notify; poll as well.
        async def _poll() -> None:
            while not predicate():
                await asyncio.sleep(0.05)

        done, pending = await asyncio.wait(
            [asyncio.create_task(_wait()), asyncio.create_task(_poll())],
            timeout=timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
        for t in pending:
            t.cancel()
        if not done:
            raise TimeoutError(f"condition not met within {timeout} s")

    async def wait_registered(self, resource: str, *, count: int = 1, timeout: float = 5.0) -> Endpoint:
        """Wait for the `count`-th Register of `resource` and its first ListAndWatch snapshot."""

        def ok() -> bool:
            n = sum(1 for r in self.register_requests if r.resource_name == resource)
            ep = self.endpoints.get(resource)
            return n >= count and ep is not None and not ep.stopped and ep.snapshots > 0

        await self.wait_for(ok, timeout)
        return self.endpoints[resource]

    # ----- admission, as the device manager does it per container

    async def admit_container(
        self, resource: str, count: int, *, must_include: Iterable[str] = (), use_preferred: bool = True
    ) -> tuple[list[str], pb.ContainerAllocateResponse]:
        """Pick `count` devices for one container and call Allocate; returns (ids, response [0]).

        Raises AdmissionError with kubelet's message on any failure (the pod would fail admission).
        """
        ep = self.endpoints.get(resource)
        if ep is None or ep.stopped:
            raise AdmissionError(f"Allocate failed due to device plugin for {resource} is not registered")
        in_use = self.allocated.setdefault(resource, set())
        must = list(must_include)
        candidates = sorted(ep.healthy() - in_use)
        if len(candidates) + len(must) < count:
            raise AdmissionError(
                f"Allocate failed due to requested number of devices unavailable for {resource}. "
                f"Requested: {count}, Available: {len(candidates)}, which is unexpected"
            )
        chosen = list(must)
        if use_preferred and ep.options.get_preferred_allocation_available and len(chosen) < count:
            req = pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=sorted(set(candidates) | set(must)),
                        must_include_deviceIDs=must,
                        allocation_size=count,
                    )
                ]
            )
            self.preferred_requests.append(req)
            try:
                resp = await ep.stub.GetPreferredAllocation(req)
            except grpc.aio.AioRpcError as e:
                raise AdmissionError(f"Allocate failed due to {e.details()}, which is unexpected") from None
            if resp.container_responses:
                for dev in resp.container_responses[0].deviceIDs:
                    if dev in candidates and dev not in chosen and len(chosen) < count:
                        chosen.append(dev)
        for dev in candidates:  # kubelet fills up whatever the preference left open
            if len(chosen) >= count:
                break
            if dev not in chosen:
                chosen.append(dev)
        return chosen, await self.allocate(resource, chosen)

    async def allocate(self, resource: str, ids: list[str]) -> pb.ContainerAllocateResponse:
        """Call Allocate with exactly one container request for `ids`; on success record them as in use."""
        ep = self.endpoints[resource]
        req = pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)])
        self.allocate_requests.append(req)
        try:
            resp = await ep.stub.Allocate(req)
        except grpc.aio.AioRpcError as e:
            raise AdmissionError(f"Allocate failed due to {e.details()}, which is unexpected") from None
        if len(resp.container_responses) < 1:
            raise AdmissionError("Allocate failed due to no containers return in allocation response")
        self.allocated.setdefault(resource, set()).update(ids)
        return resp.container_responses[0]

    async def admit_pod(
        self, pod: Mapping[str, Any], resource: str
    ) -> dict[str, pb.ContainerAllocateResponse]:
        """Admit every container of `pod` that limits `resource`, init containers first; name -> response.

        Like kubelet's device manager, devices of earlier init containers of the pod are reused first:
        when they cover the container's count, Allocate is called with them and GetPreferredAllocation
        is skipped; otherwise they are the must-include ids of the preference request. App containers
        consume reused devices; init containers add theirs to the pool.
        """
        out = {}
        spec = pod.get("spec", {})
        inits = list(spec.get("initContainers") or [])
        reusable: list[str] = []
        for i, ctr in enumerate(inits + list(spec.get("containers") or [])):
            n = int(str(((ctr.get("resources") or {}).get("limits") or {}).get(resource, 0)))
            if n <= 0:
                continue
            reuse = reusable[:n]
            if len(reuse) == n:
                ids, out[ctr["name"]] = reuse, await self.allocate(resource, reuse)
            else:
                ids, out[ctr["name"]] = await self.admit_container(resource, n, must_include=reuse)
            if i < len(inits):  # init containers run one after another: all their devices stay reusable
                reusable = sorted(set(reusable) | set(ids))
            else:
                reusable = [d for d in reusable if d not in ids]
        return out

    def release(self, resource: str, ids: Iterable[str]) -> None:
        """Free devices of a finished container."""
        self.allocated.setdefault(resource, set()).difference_update(ids)


def env_of(resp: pb.ContainerAllocateResponse) -> dict[str, str]:
    """The envs map of a response as a plain dict."""
    return dict(resp.envs)


def mounts_of(resp: pb.ContainerAllocateResponse) -> list[tuple[str, str, bool]]:
    """(container_path, host_path, read_only) of every mount, in response order."""
    return [(m.container_path, m.host_path, m.read_only) for m in resp.mounts]
