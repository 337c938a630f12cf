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
import logging
from collections.abc import Mapping, Sequence

from hami import serving, settings
from hami.config import SCHEDULER_SWITCHES, with_switches
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
    parser = build_parser()
    values, config = serving.resolve_with_device_config(parser, argv, env=env, prefix=ENV_PREFIX)
    missing = [f"--{dest.replace('_', '-')}" for dest in _REQUIRED if not values[dest]]
    if missing:
        parser.error(f"the following arguments are required: {', '.join(missing)}")
    device_config = with_switches(config, values)
    for dest in SCHEDULER_SWITCHES:  # carried by device_config.scheduler, where the vendors read them
        del values[dest]
    return WebhookOptions(device_config=device_config, **values)


async def serve(options: WebhookOptions) -> None:
    """Serve until SIGTERM or SIGINT."""
    await serving.serve_until_signalled(lambda: start(options))


#: Console script entry point. Exit 2 on bad flags/config/certificates, 0 on a clean stop.
main = serving.ServerMain(
    parse=parse_args,
    serve=serve,
    log_level=lambda o: o.log_level,
    say=serving.logged(log),
    files=lambda o: {"--tls-cert-file": o.tls_cert_file, "--tls-private-key-file": o.tls_private_key_file},
    tls_files=lambda o: (o.tls_cert_file, o.tls_private_key_file),
)
