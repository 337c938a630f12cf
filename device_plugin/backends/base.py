"""The interface between card discovery/health (NVML, a YAML file) and the generic plugin.

The gRPC server and the registration writer never touch NVML: they see `Card`s from `discover()` and
health reports from `watch_health()`. Adding a vendor means one module here plus one line in
`device_plugin.backends.BACKENDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from device_plugin.devices import Card

#: report(uuid or None for every card, healthy, reason). Called on the event loop thread.
HealthReport = Callable[[str | None, bool, str], None]


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
