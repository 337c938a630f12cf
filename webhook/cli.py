"""`hami-webhook`: flags -> `WebhookOptions` -> `main`; no admission logic lives here.

    hami-webhook --tls-cert-file C --tls-private-key-file K --address 0.0.0.0 --port 8443 \
                 --scheduler-name hami-scheduler [--config device-config.yaml] \
                 [--takeover-schedulers default-scheduler] [--kubeconfig PATH | --in-cluster]

Precedence, the rule of every server (`hami.settings`): command-line flag > environment variable
``HAMI_WEBHOOK_<FLAG_NAME>`` (``HAMI_WEBHOOK_PORT=8443``, ``HAMI_WEBHOOK_IN_CLUSTER=true``) > device config
file (`--scheduler-name`: ``scheduler.schedulerName``; HAMi's `--enable-ascend` / `--enable-iluvatar`:
``scheduler.enableAscend`` / ``enableIluvatar``) > built-in default.
Without `--kubeconfig`/`--in-cluster` the webhook needs no API access at all (so an ambient
``KUBECONFIG`` is not read); with it, namespace quotas and namespace labels are watched into a cache for
the quota pre-check.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import ssl
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from hami import settings
from hami.config import SCHEDULER_SWITCHES, load_config_file, with_switches
from hami.errors import HamiError
from webhook.app import Running, build_mutator, start
from webhook.mutate import DEFAULT_SCHEDULER
from webhook.options import WebhookOptions

__all__ = ["ENV_PREFIX", "Running", "build_mutator", "build_parser", "main", "parse_args", "serve", "start"]

log = logging.getLogger("webhook")

ENV_PREFIX = "HAMI_WEBHOOK_"
_REQUIRED = ("tls_cert_file", "tls_private_key_file")


def build_parser() -> argparse.ArgumentParser:
    """Every flag with its built-in default; `parse_args` layers the environment and config over it.

    ``--tls-cert-file`` and ``--tls-private-key-file`` are required, from the command line or the
    environment (so the parser itself does not insist on them).
    """
    p = argparse.ArgumentParser(prog="hami-webhook", description="HAMi mutating admission webhook")
    p.add_argument("--tls-cert-file", help="PEM serving certificate (reloaded on change; required)")
    p.add_argument("--tls-private-key-file", help="PEM private key (reloaded on change; required)")
    p.add_argument("--address", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8443, help="listen port (default 8443; 0 = any free port)")
    p.add_argument("--scheduler-name", default=None, help="our scheduler (default: config or hami-scheduler)")
    p.add_argument("--config", default=None, help="device config YAML (HAMi device-config.yaml)")
    settings.add_switches(p)
    p.add_argument(
        "--takeover-schedulers",
        default=DEFAULT_SCHEDULER,
        help="comma list of schedulerName values replaced by ours; an absent name always is "
        f"(default {DEFAULT_SCHEDULER})",
    )
    p.add_argument("--allocation-writers", default="",
                   help="comma list of usernames that may change a pod's allocation annotations after CREATE "
                   "(the scheduler's and device plugin's service accounts, system:serviceaccount:NS:NAME); "
                   "anyone else's UPDATE that changes one is denied")  # fmt: skip
    p.add_argument("--kubeconfig", default=None, help="kubeconfig for the quota/namespace caches")
    p.add_argument("--in-cluster", action="store_true", help="watch quotas with the in-cluster config")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> WebhookOptions:
    """Flags > ``HAMI_WEBHOOK_*`` environment > device config > defaults (see the module docstring).

    Exits 2 with the usage message for a bad or missing flag or environment value; raises ConfigError
    for a bad device config file.
    """
    env = os.environ if env is None else env
    parser = build_parser()
    loaded: dict[str, Any] = {}

    def config_layer(values: Mapping[str, Any]) -> dict[str, Any]:
        # The device config file supplies `--scheduler-name` (``scheduler.schedulerName``).
        for problem in settings.file_problems({"--config": values["config"]}):
            parser.error(problem)
        config = loaded["device_config"] = load_config_file(values["config"])
        return {"scheduler_name": config.scheduler.schedulerName, **settings.switches_of(config)}

    values = settings.resolve(parser, argv, env=env, prefix=ENV_PREFIX, config=config_layer)
    missing = [f"--{dest.replace('_', '-')}" for dest in _REQUIRED if not values[dest]]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    device_config = with_switches(loaded["device_config"], values)
    for dest in SCHEDULER_SWITCHES:  # carried by device_config.scheduler, where the vendors read them
        del values[dest]
    return WebhookOptions(device_config=device_config, **values)


async def serve(options: WebhookOptions) -> None:
    """Serve until SIGTERM or SIGINT."""
    running = await start(options)
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
    fmt = "%(asctime)s %(levelname)s %(name)s %(message)s"
    try:
        options = parse_args(argv)
    except HamiError as exc:  # a bad device config file: one line, no traceback
        logging.basicConfig(level="INFO", format=fmt, stream=sys.stderr)
        log.error("cannot start: %s", exc)
        return 2
    logging.basicConfig(level=options.log_level, format=fmt, stream=sys.stderr)
    tls = {"--tls-cert-file": options.tls_cert_file, "--tls-private-key-file": options.tls_private_key_file}
    for problem in settings.file_problems(tls):
        log.error("cannot start: %s", problem)
        return 2
    try:
        asyncio.run(serve(options))
    except ssl.SSLError as exc:  # both files open, but they are no PEM certificate and key pair
        log.error("cannot start: --tls-cert-file %r / --tls-private-key-file %r: %s",
                  options.tls_cert_file, options.tls_private_key_file, exc)  # fmt: skip
        return 2
    except (HamiError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 2
    return 0
