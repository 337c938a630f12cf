"""HTTP in/out of the monitor: ``/metrics`` (Prometheus text 0.0.4), ``/healthz``, ``/readyz``."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from device_plugin.monitor.metrics import MonitorMetrics


def make_routes(
    metrics: MonitorMetrics, snapshot_text: Callable[[], bytes], ready: Callable[[], str | None]
) -> web.Application:
    """The aiohttp app. `snapshot_text()` is the pre-rendered per-container/per-card text of the last
    scan; `ready()` returns None when ready or the reason it is not (answered as 503)."""

    async def metrics_view(_request: web.Request) -> web.Response:
        # The monitor's own families first, then the last scan's; both are complete families, so
        # concatenation is a valid exposition.
        body = generate_latest(metrics.registry) + snapshot_text()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(_request: web.Request) -> web.Response:
        why = ready()
        if why is None:
            return web.Response(text="ok\n")
        return web.Response(status=503, text=why + "\n")

    app = web.Application()
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
