"""Prometheus metrics of the device plugin, served on ``/metrics`` (plus ``/healthz``) by a small aiohttp app.

Each plugin instance owns its registry so that tests can run several plugins in one process.
Families (all prefixed ``hami_device_plugin_``): ``registered`` (1 while kubelet knows us),
``registrations_total``, ``card_healthy{uuid,index}``, ``devices{health}`` (virtual devices),
``allocations_total`` (containers served), ``allocation_errors_total{reason}`` (refused Allocate calls by
reason), ``allocation_card_mismatches_total`` (containers served on their recorded cards although kubelet's
device ids sat on other cards), ``allocation_readmissions_total`` (containers served again from their
records with no lock held, after a node reboot), ``preferred_allocation_fallbacks_total{reason}``,
``node_register_patches_total``, ``node_register_errors_total``.
"""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from device_plugin.devices import DeviceState


class PluginMetrics:
    """The metric families; `update_devices(state)` refreshes the health gauges."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        p = "hami_device_plugin_"
        self.registered = Gauge(p + "registered", "1 while the plugin is registered with kubelet", registry=r)
        self.registrations = Counter(p + "registrations", "Successful Register calls to kubelet", registry=r)
        self.card_healthy = Gauge(
            p + "card_healthy", "1 if the card is healthy", ["uuid", "index"], registry=r
        )
        self.devices = Gauge(p + "devices", "Virtual devices advertised to kubelet", ["health"], registry=r)
        self.allocations = Counter(p + "allocations", "Containers served by Allocate", registry=r)
        self.allocation_errors = Counter(
            p + "allocation_errors", "Allocate calls refused, by reason", ["reason"], registry=r
        )
        self.card_mismatches = Counter(
            p + "allocation_card_mismatches",
            "Containers served on their recorded cards although kubelet's device ids sat on other cards",
            registry=r,
        )
        self.readmissions = Counter(
            p + "allocation_readmissions",
            "Containers of Running pods served again from their recorded cards (Allocate after a node reboot)",
            registry=r,
        )
        self.preferred_fallbacks = Counter(
            p + "preferred_allocation_fallbacks",
            "GetPreferredAllocation answered without preference, by reason",
            ["reason"],
            registry=r,
        )
        self.register_patches = Counter(
            p + "node_register_patches", "Patches of the node registration annotation", registry=r
        )
        self.register_errors = Counter(
            p + "node_register_errors", "Failed node registration annotation updates", registry=r
        )

    def update_devices(self, state: DeviceState) -> None:
        """Refresh the per-card health gauges and the virtual device counts by health from `state`."""
        healthy = unhealthy = 0
        for c in state.cards():
            self.card_healthy.labels(uuid=c.uuid, index=str(c.index)).set(1 if c.healthy else 0)
            if c.healthy:
                healthy += state.split_count
            else:
                unhealthy += state.split_count
        self.devices.labels(health="Healthy").set(healthy)
        self.devices.labels(health="Unhealthy").set(unhealthy)

    def render(self) -> bytes:
        """The registry in Prometheus text format."""
        return generate_latest(self.registry)


def metrics_app(metrics: PluginMetrics, *, healthy: Callable[[], bool] = lambda: True) -> web.Application:
    """aiohttp app with ``GET /metrics`` and ``GET /healthz`` (200 ``ok`` / 503 ``not registered``)."""

    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def get_healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok") if healthy() else web.Response(status=503, text="not registered")

    app = web.Application()
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/healthz", get_healthz)
    return app
