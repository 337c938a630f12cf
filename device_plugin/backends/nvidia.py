"""NVIDIA cards through NVML (`nvidia-ml-py`, imported as `pynvml`): discovery and XID health.

Discovery follows HAMi's plugin (hami-legacy-spec §3.2): UUID, index, total memory in MiB (scaling is
applied later by the registration writer), the NVML name with HAMi's ``NVIDIA-`` type rule, and the
NUMA node (NVML first, then sysfs ``/sys/bus/pci/devices/<bus id>/numa_node``). Cards with MIG mode on
are skipped: hami-core shares whole cards only. Health follows the NVIDIA device plugin's ``rm/health.go``
(§3.6): critical XID events mark a card unhealthy, a small set of application-caused XIDs is ignored,
``DP_DISABLE_HEALTHCHECKS`` / ``DP_ENABLE_HEALTHCHECKS`` adjust the list, and an NVML wait error marks
every card unhealthy. There is no recovery path, as upstream: a card with a critical XID needs a reset.

The NVML module is injectable so the logic is testable without a GPU.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from device_plugin.backends.base import BackendOptions, HealthReport
from device_plugin.devices import Card, nvidia_type
from hami.errors import ConfigError

log = logging.getLogger(__name__)

#: XIDs caused by applications, not by the card (rm/health.go): they never mark a card unhealthy.
DEFAULT_IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
ENV_DISABLE = "DP_DISABLE_HEALTHCHECKS"  # "all" / "xids" / comma list of extra XIDs to ignore
ENV_ENABLE = "DP_ENABLE_HEALTHCHECKS"  # comma list of XIDs to treat as critical even if ignored by default
SYSFS_PCI = Path("/sys/bus/pci/devices")
_WAIT_MS = 1000  # event wait slice; bounds how long close() waits for the health thread


def xid_policy(env: Mapping[str, str]) -> tuple[bool, frozenset[int]]:
    """(health checks enabled, ignored XIDs) from the DP_* environment variables.

    ``DP_DISABLE_HEALTHCHECKS=all`` or ``xids`` disables checking; otherwise its comma-separated numbers
    are added to `DEFAULT_IGNORED_XIDS`, and ``DP_ENABLE_HEALTHCHECKS`` numbers are removed from it.
    Non-numeric list items raise ConfigError naming the variable.
    """
    disable = env.get(ENV_DISABLE, "").strip().lower()
    if disable in ("all", "xids"):
        return False, frozenset()

    def numbers(var: str) -> set[int]:
        out = set()
        for item in env.get(var, "").split(","):
            item = item.strip()
            if not item:
                continue
            if not re.fullmatch(r"[0-9]+", item):  # str.isdigit() also takes "²", which int() refuses
                raise ConfigError(
                    f"{var}: {item!r} is not an XID number; valid: 'all', 'xids' or e.g. '13,31'"
                )
            out.add(int(item))
        return out

    return True, frozenset((DEFAULT_IGNORED_XIDS | numbers(ENV_DISABLE)) - numbers(ENV_ENABLE))


def sysfs_bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:3B:00.0`` -> sysfs's ``0000:3b:00.0`` (4-digit domain, lower case)."""
    bus = nvml_bus_id.strip().lower()
    domain, _, rest = bus.partition(":")
    return f"{domain[-4:]}:{rest}" if rest else bus


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvidiaBackend:
    """Cards from NVML. `preconfigured_memory_mib` stands in for cards whose memory NVML cannot report."""

    name = "nvidia"

    def __init__(
        self,
        *,
        nvml: ModuleType | None = None,
        preconfigured_memory_mib: int = 0,
        env: Mapping[str, str] | None = None,
        sysfs: Path = SYSFS_PCI,
    ) -> None:
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - only the nvidia backend needs the library
        self.nvml = nvml
        self.preconfigured_memory_mib = preconfigured_memory_mib
        self.checks_enabled, self.ignored_xids = xid_policy(os.environ if env is None else env)
        self.sysfs = sysfs
        self._initialised = False
        self._stop = threading.Event()

    def _init(self) -> None:
        if self._initialised:
            return
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as e:
            raise ConfigError(
                f"NVML init failed ({e}); is the NVIDIA driver installed and the container started with "
                "the nvidia runtime? Use --backend fake to run without a GPU"
            ) from None
        self._initialised = True

    def discover(self) -> list[Card]:
        self._init()
        nv = self.nvml
        cards = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            if self._mig_enabled(h):
                log.warning("card %s (index %d) has MIG mode on; hami-core mode skips it", uuid, i)
                continue
            try:
                memory = int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
            except nv.NVMLError_NotSupported:
                memory = self.preconfigured_memory_mib
            if memory <= 0:
                log.warning(
                    "card %s (index %d): NVML cannot report its memory and nvidia.preConfiguredDeviceMemory "
                    "is 0; skipping it",
                    uuid,
                    i,
                )
                continue
            cards.append(
                Card(uuid=uuid, index=i, model=nvidia_type(_text(nv.nvmlDeviceGetName(h))), memory_mib=memory,
                     numa=self._numa(h))
            )  # fmt: skip
        return cards

    def _mig_enabled(self, h: Any) -> bool:
        try:
            current, _pending = self.nvml.nvmlDeviceGetMigMode(h)
        except self.nvml.NVMLError:
            return False  # NotSupported on cards without MIG
        return bool(current)

    def _numa(self, h: Any) -> int | None:
        nv = self.nvml
        try:
            node = int(nv.nvmlDeviceGetNumaNodeId(h))
            if node >= 0:
                return node
        except (nv.NVMLError, AttributeError):
            pass
        try:
            bus = sysfs_bus_id(_text(nv.nvmlDeviceGetPciInfo(h).busId))
            node = int((self.sysfs / bus / "numa_node").read_text().strip())
        except (nv.NVMLError, OSError, ValueError):
            return None
        return node if node >= 0 else None  # -1 = the platform has no NUMA information

    async def watch_health(self, report: HealthReport) -> None:
        if not self.checks_enabled:
            log.info("%s disables XID health checks", ENV_DISABLE)
            await asyncio.Event().wait()  # nothing to watch; wait to be cancelled
            return
        loop = asyncio.get_running_loop()

        def call(fn: Callable[..., object], *args: object) -> None:
            try:
                loop.call_soon_threadsafe(fn, *args)
            except RuntimeError:
                pass  # the loop is closed: the plugin is shutting down

        def threadsafe(uuid: str | None, healthy: bool, reason: str) -> None:
            call(report, uuid, healthy, reason)

        # A dedicated thread, not asyncio.to_thread: this loop lives as long as the plugin and must not
        # occupy one of the default executor's few workers that the API calls need.
        done = loop.create_future()

        def finish(exc: BaseException | None) -> None:
            if not done.done():
                done.set_exception(exc) if exc else done.set_result(None)

        def runner() -> None:
            try:
                self._event_loop(threadsafe)
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting task
                call(finish, e)
            else:
                call(finish, None)

        self._stop.clear()
        threading.Thread(target=runner, name="nvml-xid-events", daemon=True).start()
        try:
            await done
        finally:
            self._stop.set()

    def _event_loop(self, report: HealthReport) -> None:
        """Blocking NVML event loop (runs in a worker thread until `_stop` is set)."""
        self._init()
        nv = self.nvml
        try:
            event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as e:
            log.error("NVML event sets unavailable (%s); XID health checks are off", e)
            return
        wanted = nv.nvmlEventTypeXidCriticalError
        try:
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _text(nv.nvmlDeviceGetUUID(h))
                try:
                    supported = nv.nvmlDeviceGetSupportedEventTypes(h)
                    nv.nvmlDeviceRegisterEvents(h, wanted & supported, event_set)
                except nv.NVMLError as e:
                    # Upstream marks such a card unhealthy: we could never see its failures.
                    report(uuid, False, f"cannot register for NVML XID events: {e}")
            while not self._stop.is_set():
                try:
                    event = nv.nvmlEventSetWait(event_set, _WAIT_MS)
                except nv.NVMLError_Timeout:
                    continue
                except nv.NVMLError as e:
                    report(None, False, f"NVML event wait failed: {e}")
                    self._stop.wait(_WAIT_MS / 1000)
                    continue
                self._handle_event(event, report)
        finally:
            try:
                nv.nvmlEventSetFree(event_set)
            except nv.NVMLError:
                pass

    def _handle_event(self, event: Any, report: HealthReport) -> None:
        nv = self.nvml
        if event.eventType != nv.nvmlEventTypeXidCriticalError:
            return
        xid = int(event.eventData)
        if xid in self.ignored_xids:
            log.info("ignoring application XID %d", xid)
            return
        try:
            uuid: str | None = _text(nv.nvmlDeviceGetUUID(event.device))
        except nv.NVMLError:
            uuid = None  # upstream: an event we cannot attribute makes every card unhealthy
        report(uuid, False, f"critical XID {xid}")

    def close(self) -> None:
        self._stop.set()
        if self._initialised:
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError:
                pass
            self._initialised = False


def build(options: BackendOptions) -> NvidiaBackend:
    """The NVML backend for ``--backend nvidia`` (NVML is initialised in `NvidiaBackend.discover`)."""
    return NvidiaBackend(preconfigured_memory_mib=options.preconfigured_memory_mib)
