"""Serving the plugin socket and registering with kubelet, again after every kubelet restart.

Order matters (k8s-protocols.md §2.2-2.3): serve our own socket first, then call
``v1beta1.Registration/Register`` on ``kubelet.sock`` - kubelets >= 1.25 dial back and call
GetDevicePluginOptions while Register is still in flight, which is why the server is ``grpc.aio``.
A restarted kubelet deletes every socket in the directory (ours included) and creates a new
``kubelet.sock``; it never re-dials, so we watch the directory and, when kubelet.sock is new or our
socket is gone, stop the old server, serve a fresh socket and register again. The directory is polled
(every `poll_s`, default 0.25 s) rather than inotify-watched: it needs no extra dependency, sees file
replacement the same way on every filesystem, and keeps re-registration well inside the 5 s target.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import grpc

from device_plugin.api import KUBELET_SOCKET_NAME, VERSION
from device_plugin.api import api_pb2 as pb
from device_plugin.api import api_pb2_grpc as rpc
from device_plugin.routes import options
from hami.kube.retry import Backoff, retry_call_async

log = logging.getLogger(__name__)

REGISTER_TIMEOUT_S = 15.0  # kubelet's own dial-back timeout is 10 s; leave room for it
STOP_GRACE_S = 0.5  # lets an in-flight Allocate finish when we restart the server
REGISTER_BACKOFF_MAX_S = 2.0  # failed registrations are retried from `poll_s`, doubling up to this


def socket_name(resource_name: str) -> str:
    """HAMi's socket file name: ``nvidia.com/gpu`` -> ``nvidia-gpu.sock`` ("nvidia-" + part after the slash)."""
    return f"nvidia-{resource_name.rsplit('/', 1)[-1]}.sock"


def _identity(path: Path) -> tuple[int, int] | None:
    """(inode, ctime ns) of a file, None if missing: a re-created file differs even if the inode is reused."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_ctime_ns)


class KubeletRegistration:
    """Runs the DevicePlugin gRPC server on ``<socket_dir>/<endpoint>`` and keeps it registered.

    `make_servicer()` returns the servicer to serve (called for every fresh server). `on_registered()`
    / `on_lost()` are notified (metrics, logs).
    """

    def __init__(
        self,
        make_servicer: Callable[[], rpc.DevicePluginServicer],
        *,
        socket_dir: str | Path,
        resource_name: str,
        endpoint: str | None = None,
        poll_s: float = 0.25,
        on_registered: Callable[[], None] | None = None,
        on_lost: Callable[[], None] | None = None,
    ) -> None:
        self.make_servicer = make_servicer
        self.socket_dir = Path(socket_dir)
        self.resource_name = resource_name
        self.endpoint = endpoint or socket_name(resource_name)
        self.poll_s = poll_s
        self.on_registered = on_registered or (lambda: None)
        self.on_lost = on_lost or (lambda: None)
        self.registrations = 0
        self._server: grpc.aio.Server | None = None
        self._servicer: rpc.DevicePluginServicer | None = None
        self._task: asyncio.Task | None = None
        self._registered_with: tuple[int, int] | None = None
        self._served_at: tuple[int, int] | None = None

    @property
    def socket_path(self) -> Path:
        return self.socket_dir / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        return self.socket_dir / KUBELET_SOCKET_NAME

    @property
    def registered(self) -> bool:
        return self._registered_with is not None

    async def start(self) -> None:
        """Serve the socket now, then register (and keep re-registering) in the background."""
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        await self._serve()
        self._task = asyncio.create_task(self._watch(), name="kubelet-registration")

    async def stop(self) -> None:
        """Stop watching and serving, and remove our socket so kubelet does not dial a dead endpoint."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._stop_server()
        remove_socket(self.socket_path)
        self._registered_with = None

    async def _serve(self) -> None:
        await self._stop_server()
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()  # a stale socket from our previous life would make bind fail
        server = grpc.aio.server()
        self._servicer = self.make_servicer()
        rpc.add_DevicePluginServicer_to_server(self._servicer, server)
        try:
            server.add_insecure_port(f"unix://{self.socket_path}")
        except RuntimeError as e:
            # grpc reports a failed bind as RuntimeError; as OSError it is one line at start and
            # retried by `_watch` after a kubelet restart, like the other socket failures.
            raise OSError(f"cannot serve the device plugin socket {self.socket_path}: {e}") from None
        await server.start()
        self._server = server
        self._served_at = _identity(self.socket_path)
        log.info("serving device plugin on %s", self.socket_path)

    async def _stop_server(self) -> None:
        if self._server is not None:
            # Ending the ListAndWatch streams makes kubelet mark our devices unhealthy until we register
            # again; closing them first lets stop() wait only for in-flight Allocate calls.
            close = getattr(self._servicer, "close", None)
            if close is not None:
                close()
            await self._server.stop(STOP_GRACE_S)
            self._server = None

    async def register_once(self) -> None:
        """Call Register on kubelet.sock; raises grpc.aio.AioRpcError when kubelet refuses or is absent."""
        request = pb.RegisterRequest(
            version=VERSION, endpoint=self.endpoint, resource_name=self.resource_name, options=options()
        )
        async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
            await rpc.RegistrationStub(channel).Register(request, timeout=REGISTER_TIMEOUT_S)

    async def _watch(self) -> None:
        while True:
            await retry_call_async(
                self._check_once,
                retry_on=(grpc.aio.AioRpcError, OSError),
                backoff=Backoff(self.poll_s, max_s=REGISTER_BACKOFF_MAX_S),
                on_retry=self._registration_failed,
            )
            await asyncio.sleep(self.poll_s)

    async def _check_once(self) -> None:
        """One look at the sockets: re-serve and register when kubelet or our socket is new.

        Raises grpc.aio.AioRpcError / OSError when serving or registering failed (retried by `_watch`).
        """
        kubelet = _identity(self.kubelet_socket)
        ours = _identity(self.socket_path)
        if kubelet is None:
            if self._registered_with is not None:
                log.warning("kubelet socket %s disappeared; waiting for kubelet", self.kubelet_socket)
                self._registered_with = None
                self.on_lost()
            return
        if kubelet == self._registered_with and ours == self._served_at:
            return
        if self._registered_with is not None or ours != self._served_at:
            log.info("kubelet restarted or our socket vanished; serving again and re-registering")
            if self._registered_with is not None:
                self._registered_with = None
                self.on_lost()
            await self._serve()
        await self.register_once()
        self._registered_with = kubelet
        self.registrations += 1
        log.info(
            "registered %s with kubelet (endpoint %s, version %s)", self.resource_name, self.endpoint, VERSION
        )
        self.on_registered()

    def _registration_failed(self, _failures: int, e: BaseException) -> None:
        detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else str(e)
        log.warning("registering %s with kubelet failed: %s; retrying", self.resource_name, detail)


def remove_socket(path: Path) -> None:
    """Delete a socket file if present (used on shutdown so kubelet does not dial a dead socket)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
