"""Wiring: backend -> DeviceState -> gRPC service + kubelet registration + node annotation + metrics.

`DevicePluginApp` is what the console script runs and what integration tests start in-process, so the
tests exercise exactly the production assembly (only the backend and the socket directory differ).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from device_plugin.allocator import Allocator, AllocatorSettings
from device_plugin.api import DEFAULT_SOCKET_DIR
from device_plugin.backends.base import Backend
from device_plugin.devices import DeviceState
from device_plugin.kubelet import KubeletRegistration
from device_plugin.metrics import PluginMetrics, metrics_app
from device_plugin.mig.manager import APPLY_LOCK
from device_plugin.mps.daemon import CONTROL as MPS_CONTROL
from device_plugin.node_register import INTERVAL_S, NodeRegistrar
from device_plugin.routes import DevicePluginService
from hami.config import DeviceConfig
from hami.errors import ConfigError
from hami.model import MIG_MODE, MPS_MODE

MIG_INTERVAL_S = 5.0  # HAMi's reconcile period

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginOptions:
    """What the assembly needs (built by `device_plugin.cli` from flags, environment and config; tests
    build it directly). See docs/device-plugin.md for the flags and environment variables."""

    node_name: str
    """This node's name: its lock is read and its annotations written."""
    config: DeviceConfig = field(default_factory=DeviceConfig)
    """The parsed device-config.yaml (its ``nvidia`` section with the node's override applied)."""
    resource_name: str | None = None
    """Resource advertised to kubelet; None = ``nvidia.resourceCountName`` of `config` (nvidia.com/gpu)."""
    scheduler_name: str | None = None
    """Only pods of this scheduler are served; None = ``scheduler.schedulerName`` of `config`."""
    socket_dir: str = DEFAULT_SOCKET_DIR
    """kubelet's device plugin directory (default /var/lib/kubelet/device-plugins/)."""
    hook_path: str = "/usr/local"
    """HAMi's HOOK_PATH: libvgpu.so and ld.so.preload live in ``<hook_path>/vgpu``."""
    metrics_port: int | None = None
    """Port of /metrics and /healthz; None = no metrics server, 0 = any free port."""
    metrics_host: str = "0.0.0.0"
    """Listen address of the metrics server."""
    register_interval_s: float = INTERVAL_S
    """Seconds between node registration annotation checks (default 30 s)."""
    poll_s: float = 0.25
    """Seconds between checks of kubelet's socket (re-registration after a kubelet restart)."""
    mig_apply_lock: str = APPLY_LOCK
    """`mig` mode: HAMi's MIG apply lock file, present while instances are being changed."""
    mig_reconcile_s: float = MIG_INTERVAL_S
    """`mig` mode: seconds between reconciliations of the MIG instances with the pods (HAMi: 5 s)."""
    mps_control: str = MPS_CONTROL
    """`mps` mode: the MPS control daemon's program (``nvidia-cuda-mps-control``)."""

    @property
    def mig_ledger(self) -> Path:
        """`mig` mode: the file listing the MIG instances this plugin made (``<hook>/vgpu/mig``)."""
        return Path(self.hook_path) / "vgpu" / "mig" / "instances.json"

    @property
    def mps_root(self) -> Path:
        """`mps` mode: where each card's MPS pipe and log directories live (``<hook>/vgpu/mps``)."""
        return Path(self.hook_path) / "vgpu" / "mps"


class DevicePluginApp:
    """One running plugin. `kube` may be None (no API server): then Allocate refuses and nothing is published."""

    def __init__(self, options: PluginOptions, backend: Backend, kube: object | None = None) -> None:
        self.options = options
        self.backend = backend
        self.kube = kube
        self.nvidia = options.config.nvidia_for_node(options.node_name)
        self.resource_name = options.resource_name or self.nvidia.resourceCountName
        self.scheduler_name = options.scheduler_name or options.config.scheduler.schedulerName
        self.metrics = PluginMetrics()
        self.state: DeviceState | None = None
        self.registration: KubeletRegistration | None = None
        self.registrar: NodeRegistrar | None = None
        self.allocator: Allocator | None = None
        self.mode = self.nvidia.operatingMode
        self.mig: Any = None  # device_plugin.mig.controller.MigController in mig mode
        self.mps: Any = None  # device_plugin.mps.daemon.MpsDaemons in mps mode
        self._mode_responder: Any = None
        self.metrics_url: str | None = None
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        """Discover cards, serve and register, start health watching and the registration writer.

        Raises hami.errors.ConfigError when the backend cannot discover cards.
        """
        o = self.options
        cards = await asyncio.to_thread(self.backend.discover)
        if not cards:
            log.warning("backend %s found no usable cards; advertising none", self.backend.name)
        self.state = DeviceState(
            cards, split_count=self.nvidia.deviceSplitCount, numa_topology=self.nvidia.enableNumaTopology
        )
        self.metrics.update_devices(self.state)
        log.info(
            "node %s: %d card(s) via %s backend, mode %s, split %d, resource %s",
            o.node_name, len(cards), self.backend.name, self.mode, self.nvidia.deviceSplitCount, self.resource_name,
        )  # fmt: skip
        if self.mode == MIG_MODE:
            await self._start_mig(cards)
        elif self.mode == MPS_MODE:
            self._start_mps(cards)
        policy = self._policy()
        self.registration = KubeletRegistration(
            lambda: DevicePluginService(
                self.state,
                policy,
                on_allocate_error=lambda r: self.metrics.allocation_errors.labels(reason=r).inc(),
            ),
            socket_dir=o.socket_dir,
            resource_name=self.resource_name,
            poll_s=o.poll_s,
            on_registered=self._registered,
            on_lost=lambda: self.metrics.registered.set(0),
        )
        await self._start_metrics()
        await self.registration.start()
        self._spawn(self.backend.watch_health(self._health), "health")
        if self.kube is not None:
            mig = self.mode == MIG_MODE  # a MIG card registers its memory and cores unscaled (HAMi)
            self.registrar = NodeRegistrar(
                self.kube,
                o.node_name,
                self.state,
                memory_scaling=1.0 if mig else self.nvidia.deviceMemoryScaling,
                core_scaling=1.0 if mig else self.nvidia.deviceCoreScaling,
                mode=self.mode,
                interval_s=o.register_interval_s,
                on_patch=self.metrics.register_patches.inc,
                on_error=self.metrics.register_errors.inc,
            )
            self._spawn(self.registrar.run(), "node-register")

    async def _start_mig(self, cards: Sequence[Any]) -> None:
        """`mig` mode: the MIG instance manager over the backend's NVML, a first reconciliation (adopt,
        clean up, find foreign instances), the periodic one, and the Allocate responder."""
        from device_plugin.mig.allocate import MigResponder
        from device_plugin.mig.controller import MigController
        from device_plugin.mig.manager import MigManager

        backend: Any = self.backend
        if not hasattr(backend, "mig_profiles"):
            raise ConfigError(f"operatingmode mig needs the nvidia backend, not --backend {backend.name}")
        manager = MigManager(
            backend.mig,
            {c.uuid: (lambda u=c.uuid: backend.handle(u)) for c in cards},
            backend.mig_profiles,
            ledger=self.options.mig_ledger,
            apply_lock=self.options.mig_apply_lock,
        )
        self.mig = MigController(
            self.kube, self.state, manager, node_name=self.options.node_name, scheduler_name=self.scheduler_name,
            interval_s=self.options.mig_reconcile_s,
        )  # fmt: skip
        if self.kube is not None:
            await self.mig.reconcile_once()
            self._spawn(self.mig.run(), "mig-reconcile")
            self._mode_responder = MigResponder(self.kube, manager, self.mig)

    def _start_mps(self, cards: Sequence[Any]) -> None:
        """`mps` mode: one MPS control daemon per card, kept running; the Allocate responder."""
        from device_plugin.mps.allocate import MpsResponder
        from device_plugin.mps.daemon import MpsDaemons

        self.mps = MpsDaemons(
            [c.uuid for c in cards], self.options.mps_root, control=self.options.mps_control
        )
        self.mps.start()
        self._mode_responder = MpsResponder(self.mps)

    def _spawn(self, coro: Coroutine[object, object, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)

        def check(t: asyncio.Task) -> None:
            # A background task that dies silently would leave health or the annotation frozen.
            if not t.cancelled() and t.exception() is not None:
                log.error("background task %s failed: %r", name, t.exception())

        task.add_done_callback(check)
        self._tasks.append(task)

    def _policy(self):
        if self.kube is None:
            return _NoKube()
        self.allocator = Allocator(
            self.kube,
            self.state,
            AllocatorSettings(
                node_name=self.options.node_name,
                scheduler_name=self.scheduler_name,
                resource_name=self.resource_name,
                hook_path=self.options.hook_path,
                memory_scaling=self.nvidia.deviceMemoryScaling,
                core_scaling=self.nvidia.deviceCoreScaling,
                lib_cuda_log_level=str(self.nvidia.libCudaLogLevel),
                disable_core_limit=self.nvidia.disableCoreLimit,
                nvidia=self.nvidia,
            ),
            on_allocated=self.metrics.allocations.inc,
            on_preferred_fallback=lambda r: self.metrics.preferred_fallbacks.labels(reason=r).inc(),
            on_card_mismatch=self.metrics.card_mismatches.inc,
            on_readmitted=self.metrics.readmissions.inc,
            mode_responder=self._mode_responder,
        )
        return self.allocator

    def _registered(self) -> None:
        self.metrics.registered.set(1)
        self.metrics.registrations.inc()

    def _health(self, uuid: str | None, healthy: bool, reason: str) -> None:
        if self.state is not None and self.state.set_health(uuid, healthy, reason):
            self.metrics.update_devices(self.state)

    async def _start_metrics(self) -> None:
        o = self.options
        if o.metrics_port is None:
            return
        app = metrics_app(
            self.metrics, healthy=lambda: bool(self.registration and self.registration.registered)
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, o.metrics_host, o.metrics_port)
        await site.start()
        port = self._runner.addresses[0][1]
        self.metrics_url = f"http://{o.metrics_host}:{port}/metrics"
        log.info("metrics on %s", self.metrics_url)

    async def stop(self) -> None:
        """Cancel background tasks, stop serving (socket removed), stop metrics, close the backend."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        if self.mps is not None:
            await self.mps.stop()
        if self.registration is not None:
            await self.registration.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await asyncio.to_thread(self.backend.close)

    @property
    def socket_path(self) -> Path | None:
        return self.registration.socket_path if self.registration else None


class _NoKube:
    """Policy without an API server: no preference, and Allocate refuses (it cannot identify the pod)."""

    async def preferred(self, requests: Sequence[object]) -> list[list[str]]:
        return [[] for _ in requests]

    async def allocate(self, requests: Sequence[Sequence[str]]) -> list:
        from device_plugin.errors import AllocationRefused

        raise AllocationRefused("no_api_server", "the device plugin runs without an API server connection")
