"""The assembled webhook: options -> vendors, caches, Mutator, TLS and the HTTP app, started.

`start` is what the console script runs and what the integration tests start in process. The HTTP
handlers are in `webhook.routes`, the flags in `webhook.cli`.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from hami.vendors import build_vendors
from webhook.metrics import WebhookMetrics
from webhook.mutate import Mutator, WebhookSettings
from webhook.options import WebhookOptions
from webhook.routes import make_app, review_body
from webhook.tls import ReloadingTLS

if TYPE_CHECKING:
    from webhook.cache import Caches

__all__ = ["Running", "build_mutator", "make_app", "review_body", "start"]

log = logging.getLogger("webhook")


def build_mutator(options: WebhookOptions) -> tuple[Mutator, Caches | None]:
    """The Mutator for these options, and the started caches when API access was asked for.

    Raises InvalidRequest for an unloadable kubeconfig.
    """
    settings = WebhookSettings(
        scheduler_name=options.scheduler_name,
        takeover_schedulers=options.takeover,
        allocation_writers=options.writers,
    )
    vendors = build_vendors(options.device_config)
    caches = None
    if options.kubeconfig or options.in_cluster:
        from webhook.cache import start_caches  # imports the kubernetes client only when asked for

        caches = start_caches(options.kubeconfig, vendors)
    mutator = Mutator(
        list(vendors.values()),
        settings,
        quota=caches.quota if caches else None,
        namespaces=caches.namespaces if caches else None,
    )
    return mutator, caches


@dataclass
class Running:
    """A started server: its runner (call `await runner.cleanup()` to stop), bound port, TLS and metrics."""

    runner: web.AppRunner
    port: int
    tls: ReloadingTLS
    metrics: WebhookMetrics
    caches: Caches | None = None

    async def stop(self) -> None:
        """Stop serving and end the watches."""
        await self.runner.cleanup()
        if self.caches is not None:
            await asyncio.to_thread(self.caches.stop)


async def start(options: WebhookOptions) -> Running:
    """Load certificates and config, bind, and start serving; returns once listening.

    Raises OSError / ssl.SSLError for unusable certificate files or a busy port.
    """
    metrics = WebhookMetrics()
    tls = ReloadingTLS(options.tls_cert_file, options.tls_private_key_file, on_reload=metrics.cert_reloaded)
    # Starting the watches blocks for the first lists (bounded), so it runs off the event loop.
    mutator, caches = await asyncio.to_thread(build_mutator, options)
    runner = web.AppRunner(make_app(mutator, metrics), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, options.address, options.port, ssl_context=tls.context, backlog=1024)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        if caches is not None:
            caches.stop()
        raise
    port = runner.addresses[0][1] if runner.addresses else options.port
    log.info("serving on https://%s:%s (/mutate, /webhook, /healthz, /metrics)", options.address, port)
    return Running(runner=runner, port=port, tls=tls, metrics=metrics, caches=caches)
