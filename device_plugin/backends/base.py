"""The interface between card discovery/health (NVML, a YAML file) and the generic plugin.

The gRPC server and the registration writer never touch NVML: they see `Card`s from `discover()` and
health reports from `watch_health()`. Adding a backend means one module here (with a ``build``
function) plus one line in the table of `device_plugin.backends`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from device_plugin.devices import Card

#: report(uuid or None for every card, healthy, reason). Called on the event loop thread.
HealthReport = Callable[[str | None, bool, str], None]


@dataclass(frozen=True)
class BackendOptions:
    """What the command line gives the backends; each backend's ``build`` reads what it needs."""

    fake_config: str | None = None
    """``--fake-config``: the CARDS.yaml of the fake backend (required by it)."""
    preconfigured_memory_mib: int = 0
    """``nvidia.preConfiguredDeviceMemory`` of the device config, MiB; 0 = the memory NVML reports."""
    operating_mode: str = "hami-core"
    """The node's ``operatingmode`` (`hami-core`, `mig`, `mps`)."""
    mig_strategy: str = "none"
    """The node's ``migstrategy`` (`none`, `single`, `mixed`): MIG instances an administrator made."""
    mig_allowlist: tuple = ()
    """``nvidia.migProfileAllowlist``: the MIG profiles cards may offer in `mig` mode."""


class Backend(Protocol):
    """A source of cards and health events."""

    name: str

    def discover(self) -> list[Card]:
        """Every usable card on this node, index order. Blocking (run it in a thread).

        Raises `hami.errors.ConfigError` when the source is unusable (bad file, NVML init failure).
        """
        ...

    async def watch_health(self, report: HealthReport) -> None:
        """Report health changes until cancelled. Must not raise on transient errors (log and go on)."""
        ...

    def close(self) -> None:
        """Release the backend's resources (NVML shutdown); idempotent."""
        ...
