"""NVIDIA cards through NVML (`nvidia-ml-py`, imported as `pynvml`): discovery and XID health.

Discovery follows HAMi's plugin (hami-legacy-spec §3.2): UUID, index, total memory in MiB (scaling is
applied later by the registration writer), the NVML name with HAMi's ``NVIDIA-`` type rule, and the
NUMA node (NVML first, then sysfs ``/sys/bus/pci/devices/<bus id>/numa_node``). Cards with MIG mode on
depend on the node's mode: in ``mig`` mode they are the cards served, each with the MIG profiles the
allow-list permits for its model (NVML's memory, SMs and placements; the others are skipped, as cards
whose MIG mode is off: this plugin never changes MIG mode); in ``hami-core`` / ``mps`` mode they are
skipped with ``migStrategy: none``, and with ``single`` / ``mixed`` every MIG instance an administrator
made is a card of its own (static MIG). Health follows the NVIDIA device plugin's ``rm/health.go``
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
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from device_plugin.backends.base import BackendOptions, HealthReport
from device_plugin.devices import Card, nvidia_type
from device_plugin.mig.nvml import MigNvml, ProfileInfo
from hami.errors import ConfigError
from hami.model import MIG_MODE, MigProfile
from hami.vendors import nvidia_mig

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
        operating_mode: str = "hami-core",
        mig_strategy: str = "none",
        mig_allowlist: tuple[nvidia_mig.MigProfileAllowlist, ...] = (),
    ) -> None:
        if nvml is None:
            import pynvml as nvml  # noqa: PLC0415 - only the nvidia backend needs the library
        self.nvml = nvml
        self.preconfigured_memory_mib = preconfigured_memory_mib
        self.checks_enabled, self.ignored_xids = xid_policy(os.environ if env is None else env)
        self.sysfs = sysfs
        self.operating_mode = operating_mode
        self.mig_strategy = mig_strategy
        self.mig_allowlist = mig_allowlist
        self.mig = MigNvml(nvml)
        #: In `mig` mode: per served card UUID, every GPU-instance profile NVML reports for it.
        self.mig_profiles: dict[str, list[ProfileInfo]] = {}
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

    def handle(self, uuid: str) -> Any:
        """The NVML handle of card `uuid` (for the MIG manager)."""
        self._init()
        return self.nvml.nvmlDeviceGetHandleByUUID(uuid)

    def discover(self) -> list[Card]:
        self._init()
        nv = self.nvml
        cards: list[Card] = []
        static: list[Card] = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nv.nvmlDeviceGetUUID(h))
            mode = self.mig.mig_mode(h)
            if self.operating_mode == MIG_MODE:
                card = self._mig_card(i, h, uuid, mode)
                if card is not None:
                    cards.append(card)
                continue
            if mode is not None and mode[0]:
                if self.mig_strategy == "none":
                    log.warning(
                        "card %s (index %d) has MIG mode on; skipped (migStrategy none; use operatingmode mig, "
                        "or migstrategy single/mixed for instances an administrator made)", uuid, i,
                    )  # fmt: skip
                else:
                    static += self._static_mig_cards(h, uuid, numa=self._numa(h))
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
        return self._with_static(cards, static) if static else cards

    def _mig_card(self, i: int, h: Any, uuid: str, mode: tuple[bool, bool] | None) -> Card | None:
        """A card served in `mig` mode, or None (logged) when it cannot be: no MIG, MIG mode off or
        changing, or no profile its model is allowed."""
        nv = self.nvml
        name = nvidia_type(_text(nv.nvmlDeviceGetName(h)))
        if mode is None:
            log.warning("card %s (index %d, %s) has no MIG; operatingmode mig skips it", uuid, i, name)
            return None
        if not mode[0] or mode[0] != mode[1]:
            log.warning(
                "card %s (index %d): MIG mode is %s (pending %s); operatingmode mig needs it on, and this plugin "
                "never changes it: drain the card and run `nvidia-smi -i %d -mig 1`", uuid, i,
                "on" if mode[0] else "off", "on" if mode[1] else "off", i,
            )  # fmt: skip
            return None
        allowed = nvidia_mig.allowed_profiles(name, self.mig_allowlist)
        if not allowed:
            log.warning("card %s (%s): nvidia.migProfileAllowlist names no profile for its model", uuid, name)
            return None
        offered = self.mig.profiles(h)
        full = max((p.sms for p in offered), default=0)
        by_name = {p.name: p for p in offered}
        profiles = tuple(
            MigProfile(p.name, p.memory_mb, nvidia_mig.profile_core(p.sms, full), p.slices, p.placements)
            for p in (by_name.get(n) for n in allowed)
            if p is not None
        )
        missing = [n for n in allowed if n not in by_name]
        if missing:
            log.warning("card %s (%s) offers no MIG profile %s; NVML's profiles: %s", uuid, name, missing,
                        ", ".join(by_name))  # fmt: skip
        if not profiles:
            return None
        self.mig_profiles[uuid] = offered
        memory = int(nv.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
        slots = max(by_name[p.name].instances for p in profiles)
        return Card(uuid=uuid, index=i, model=name, memory_mib=memory, numa=self._numa(h), mig_profiles=profiles,
                    slots=slots)  # fmt: skip

    def _static_mig_cards(self, h: Any, parent: str, *, numa: int | None) -> list[Card]:
        """The MIG instances an administrator made on a card, each a card of its own (static MIG)."""
        nv = self.nvml
        out = []
        for inst in self.mig.instances(h, parent, self.mig.profiles(h)):
            if not inst.mig_uuid:
                continue  # a GPU instance without a compute instance is no device
            mig = nv.nvmlDeviceGetHandleByUUID(inst.mig_uuid)
            memory = int(nv.nvmlDeviceGetMemoryInfo(mig).total) // (1024 * 1024)
            model = nvidia_type(_text(nv.nvmlDeviceGetName(mig)))
            out.append(Card(uuid=inst.mig_uuid, index=0, model=model, memory_mib=memory, numa=numa))
        return out

    def _with_static(self, whole: list[Card], static: list[Card]) -> list[Card]:
        """Whole cards and MIG instances, indexed in that order (a MIG instance has no NVML index of its
        own); `single` wants one kind of device on the node, as the NVIDIA device plugin does."""
        if self.mig_strategy == "single":
            kinds = sorted({c.model for c in static})
            if whole or len(kinds) > 1:
                raise ConfigError(
                    f"migstrategy single: every device of the node must be a MIG instance of one profile; found "
                    f"{len(whole)} whole card(s) and MIG instances {kinds}; use migstrategy mixed"
                )
        return [replace(c, index=k) for k, c in enumerate([*whole, *static])]

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
    return NvidiaBackend(
        preconfigured_memory_mib=options.preconfigured_memory_mib,
        operating_mode=options.operating_mode,
        mig_strategy=options.mig_strategy,
        mig_allowlist=options.mig_allowlist,
    )
