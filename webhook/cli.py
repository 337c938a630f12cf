"""`hami-webhook`: flags, logging, TLS and the server loop; no admission logic lives here.

    hami-webhook --tls-cert-file C --tls-private-key-file K --address 0.0.0.0 --port 8443 \
                 --scheduler-name hami-scheduler [--config device-config.yaml] \
                 [--takeover-schedulers default-scheduler] [--kubeconfig PATH | --in-cluster]

Precedence: a flag given on the command line wins over the device config file, which wins over the
built-in default (`--scheduler-name` falls back to the config's `scheduler.schedulerName`).
Without `--kubeconfig`/`--in-cluster` the webhook needs no API access at all; with it, namespace
quotas and namespace labels are watched into a cache for the quota pre-check.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import ssl
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from aiohttp import web

from hami.config import load_config_file
from hami.errors import HamiError
from hami.vendors import build_vendors
from webhook.app import make_app

if TYPE_CHECKING:
    from webhook.cache import Caches
from webhook.metrics import WebhookMetrics
from webhook.mutate import DEFAULT_SCHEDULER, Mutator, WebhookSettings
from webhook.tls import ReloadingTLS

log = logging.getLogger("webhook")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="hami-webhook", description="HAMi mutating admission webhook")
    p.add_argument("--tls-cert-file", required=True, help="PEM serving certificate (reloaded on change)")
    p.add_argument("--tls-private-key-file", required=True, help="PEM private key (reloaded on change)")
    p.add_argument("--address", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8443, help="listen port (default 8443; 0 = any free port)")
    p.add_argument("--scheduler-name", default=None, help="our scheduler (default: config or hami-scheduler)")
    p.add_argument("--config", default=None, help="device config YAML (HAMi device-config.yaml)")
    p.add_argument(
        "--takeover-schedulers",
        default=DEFAULT_SCHEDULER,
        help="comma list of schedulerName values replaced by ours; an absent name always is "
        f"(default {DEFAULT_SCHEDULER})",
    )
    p.add_argument("--kubeconfig", default=None, help="kubeconfig for the quota/namespace caches")
    p.add_argument("--in-cluster", action="store_true", help="watch quotas with the in-cluster config")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p.parse_args(argv)


def build_mutator(args: argparse.Namespace) -> tuple[Mutator, Caches | None]:
    """The Mutator for these flags, and the started caches when API access was asked for.

    Raises ConfigError for a bad device config, InvalidRequest for an unloadable kubeconfig.
    """
    config = load_config_file(args.config)
    takeover = frozenset({"", *(s.strip() for s in args.takeover_schedulers.split(",") if s.strip())})
    settings = WebhookSettings(
        scheduler_name=args.scheduler_name
        if args.scheduler_name is not None
        else config.scheduler.schedulerName,
        takeover_schedulers=takeover,
    )
    vendors = build_vendors(config)
    caches = None
    if args.kubeconfig or args.in_cluster:
        from webhook.cache import start_caches  # imports the kubernetes client only when asked for

        caches = start_caches(args.kubeconfig, vendors)
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


async def start(args: argparse.Namespace) -> Running:
    """Load certificates and config, bind, and start serving; returns once listening.

    Raises OSError / ssl.SSLError for unusable certificate files or a busy port, ConfigError for a bad
    device config.
    """
    metrics = WebhookMetrics()
    tls = ReloadingTLS(args.tls_cert_file, args.tls_private_key_file, on_reload=metrics.cert_reloaded)
    # Starting the watches blocks for the first lists (bounded), so it runs off the event loop.
    mutator, caches = await asyncio.to_thread(build_mutator, args)
    runner = web.AppRunner(make_app(mutator, metrics), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, args.address, args.port, ssl_context=tls.context, backlog=1024)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        if caches is not None:
            caches.stop()
        raise
    port = runner.addresses[0][1] if runner.addresses else args.port
    log.info("serving on https://%s:%s (/mutate, /webhook, /healthz, /metrics)", args.address, port)
    return Running(runner=runner, port=port, tls=tls, metrics=metrics, caches=caches)


async def serve(args: argparse.Namespace) -> None:
    """Serve until SIGTERM or SIGINT."""
    running = await start(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await running.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Console script entry point. Exit 2 on bad flags/config/certificates, 0 on a clean stop."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    try:
        asyncio.run(serve(args))
    except (HamiError, OSError, ssl.SSLError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    return 0
