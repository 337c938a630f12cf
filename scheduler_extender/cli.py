"""`hami-scheduler-extender`: flags -> `ExtenderOptions` -> `main`; no scheduling logic here.

    hami-scheduler-extender --kubeconfig FILE --address 127.0.0.1 --port 8888 --scheduler-name hami-scheduler
    hami-scheduler-extender --address 0.0.0.0 --tls-cert-file C --tls-private-key-file K --client-ca-file CA \
        --leader-elect-resource-namespace kube-system --config /device-config.yaml

Precedence, the rule of every server (`hami.settings`): command-line flag > environment variable
``HAMI_EXTENDER_<FLAG_NAME>`` (e.g. ``HAMI_EXTENDER_PORT=8888``, ``HAMI_EXTENDER_LEADER_ELECT=true``) >
device config file (`--scheduler-name`: ``scheduler.schedulerName``; HAMi's `--enable-ascend` /
`--enable-iluvatar`: ``scheduler.enableAscend`` / ``enableIluvatar``) > built-in default.
Aliases read after the ``HAMI_EXTENDER_`` name: ``KUBECONFIG`` (without any kubeconfig the in-cluster
service account is used), ``POD_NAME`` / ``POD_NAMESPACE`` (lease identity and namespace). Durations
accept seconds (``300``) or Go-style units (``5m``, ``30s``, ``1m30s``).
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
import uuid
from collections.abc import Mapping, Sequence

from hami import serving, settings
from hami.config import SCHEDULER_SWITCHES, with_switches
from scheduler_extender.app import Server
from scheduler_extender.events import EVENT_LEVELS
from scheduler_extender.gctune import GcFreezer
from scheduler_extender.options import ExtenderOptions, is_loopback, split_host_port
from scheduler_extender.wire import MAX_BODY_BYTES

__all__ = ["ENV_ALIASES", "ENV_PREFIX", "Server", "build_parser", "duration", "main", "parse_args"]

log = logging.getLogger("scheduler_extender")

ENV_PREFIX = "HAMI_EXTENDER_"
#: Flag dest -> variables read after ``HAMI_EXTENDER_<DEST>`` (the names Kubernetes tooling sets).
ENV_ALIASES: Mapping[str, tuple[str, ...]] = {
    "kubeconfig": ("KUBECONFIG",),
    "leader_elect_resource_namespace": ("POD_NAMESPACE",),
    "leader_elect_identity": ("POD_NAME",),
}

#: ``300`` / ``300s`` / ``5m`` / ``1m30s`` / ``500ms`` -> seconds; raises ArgumentTypeError naming the forms.
duration = settings.argtype(settings.duration)
boolean = settings.argtype(settings.boolean)


def build_parser() -> argparse.ArgumentParser:
    """Every flag, with its built-in default; `parse_args` layers the environment and config over it."""
    p = argparse.ArgumentParser(
        prog="hami-scheduler-extender",
        description="HAMi scheduler extender (filter + bind for kube-scheduler)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--address", default="127.0.0.1",
                   help="listen address of /filter /prioritize /bind (default 127.0.0.1: kube-scheduler runs in "
                   "the same pod); any other address needs --tls-cert-file, --tls-private-key-file and "
                   "--client-ca-file")  # fmt: skip
    p.add_argument("--port", type=int, default=8888, help="listen port (default 8888; 0 = any free port)")
    p.add_argument("--metrics-bind-address", default="",
                   help="[HOST]:PORT of a second listener serving only /healthz /readyz /metrics, e.g. :9395 "
                   "(HAMi's flag; default: none, health and metrics on the verbs listener only)")  # fmt: skip
    p.add_argument("--tls-cert-file", help="PEM certificate: serve HTTPS (with --tls-private-key-file)")
    p.add_argument("--tls-private-key-file", help="PEM private key for --tls-cert-file")
    p.add_argument("--client-ca-file",
                   help="PEM CA bundle: the verbs listener requires client certificates signed by it (needs "
                   "--tls-cert-file)")  # fmt: skip
    p.add_argument(
        "--scheduler-name",
        help="place only pods with this spec.schedulerName (default: config or hami-scheduler)",
    )
    p.add_argument("--config", help="device config YAML (HAMi device-config.yaml)")
    settings.add_switches(p)
    p.add_argument("--leader-elect", type=boolean, nargs="?", const=True, default=False,
                   help="campaign for a coordination.k8s.io/v1 Lease; only the leader serves (default false)")  # fmt: skip
    p.add_argument("--leader-elect-resource-name", default="hami-scheduler-extender", help="Lease name")
    p.add_argument("--leader-elect-resource-namespace", default=None,
                   help="Lease namespace (default: $POD_NAMESPACE, else kube-system)")  # fmt: skip
    p.add_argument(
        "--leader-elect-identity",
        default=None,
        help="this replica's identity (default: $POD_NAME, else hostname_random)",
    )
    p.add_argument("--leader-elect-lease-duration", type=duration, default=15.0, help="default 15s")
    p.add_argument("--leader-elect-renew-deadline", type=duration, default=10.0, help="default 10s")
    p.add_argument("--leader-elect-retry-period", type=duration, default=2.0, help="default 2s")
    p.add_argument("--node-lock-timeout", type=duration, default=300.0,
                   help="a node lock older than this is taken over (HAMi --node-lock-timeout, default 5m)")  # fmt: skip
    p.add_argument("--filter-mode", default="single", choices=["single", "all"],
                   help="single (HAMi): /filter returns the one node chosen here, cards reserved; all: /filter "
                   "returns every node that fits, /prioritize scores them by the node policy (configure "
                   "prioritizeVerb and a weight), the cards are chosen at /bind on kube-scheduler's pick")  # fmt: skip
    p.add_argument("--bind-lock-wait", "--node-lock-retry-timeout", dest="bind_lock_wait", type=duration,
                   default=25.0,
                   help="a bind that finds the node lock held waits up to this long for it, in a per-node "
                   "queue woken by the node watch, before failing (default 25s, below the chart's 30s "
                   "httpTimeout; 0 = fail at once like HAMi). --node-lock-retry-timeout is HAMi v2.10's name")  # fmt: skip
    p.add_argument("--register-interval", type=duration, default=15.0,
                   help="node liveness pass and handshake stamps (default 15s; 0 turns both off)")  # fmt: skip
    p.add_argument("--handshake-timeout", type=duration, default=60.0,
                   help="an unanswered Requesting handshake older than this makes a node without allocatable "
                   "devices unusable (HAMi: 60s)")  # fmt: skip
    p.add_argument("--reservation-ttl", type=duration, default=60.0,
                   help="drop a filter reservation no pod event confirmed within this (default 60s)")  # fmt: skip
    p.add_argument("--advertise-node-resources", type=boolean, nargs="?", const=True, default=False,
                   help="advertise each GPU node's card totals as its capacity of the memory and cores "
                   "resources (nvidia.com/gpumem, nvidia.com/gpucores), for kube-scheduler's preemption "
                   "when it counts them (ignoredByScheduler: false). Default false")  # fmt: skip
    p.add_argument(
        "--max-request-bytes", type=int, default=MAX_BODY_BYTES, help="request body limit (default 1 MiB)"
    )
    p.add_argument(
        "--kube-qps", type=float, default=0.0, help="client-side API rate limit (default 0 = none)"
    )
    p.add_argument("--kube-burst", type=int, default=100, help="client-side API burst (default 100)")
    p.add_argument(
        "--kube-timeout", type=duration, default=10.0, help="per API request timeout (default 10s)"
    )
    p.add_argument("--workers", type=int, default=32, help="threads for the steps that block (stale cache, lock contention, --async-record) and the API connection pool size (default 32)")
    p.add_argument(
        "--events",
        default="all",
        choices=list(EVENT_LEVELS),
        help="pod events: all (HAMi: FilteringSucceed/BindingSucceed too), failures (Warning only), none",
    )
    p.add_argument("--async-record", type=boolean, nargs="?", const=True, default=False,
                   help="answer /filter before the placement is written to the pod; /bind waits for the write "
                   "(lower filter latency; a failed write fails the bind instead of the filter). Default false")  # fmt: skip
    p.add_argument("--gc-freeze-interval", type=duration, default=10.0,
                   help="move long-lived objects out of the garbage collector's full passes this often "
                   "(default 10s; 0 = off; see scheduler_extender/gctune.py)")  # fmt: skip
    p.add_argument("--gc-full-interval", type=duration, default=3600.0,
                   help="with --gc-freeze-interval: one full collection this often (default 1h)")  # fmt: skip
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def parse_args(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> ExtenderOptions:
    """Flags > ``HAMI_EXTENDER_*`` environment > device config > defaults (see the module docstring).

    Exits 2 with the usage message for a bad flag or environment value; raises ConfigError for a bad
    device config file.
    """
    parser = build_parser()
    values, config = serving.resolve_with_device_config(
        parser, argv, env=env, prefix=ENV_PREFIX, aliases=ENV_ALIASES
    )
    values["kubeconfig"] = values["kubeconfig"] or None
    values["leader_elect_resource_namespace"] = values["leader_elect_resource_namespace"] or "kube-system"
    values["leader_elect_identity"] = (
        values["leader_elect_identity"] or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    )
    if values["gc_freeze_interval"] < 0 or (
        values["gc_freeze_interval"] and values["gc_full_interval"] < values["gc_freeze_interval"]
    ):
        parser.error(
            f"--gc-freeze-interval {values['gc_freeze_interval']:g}s / --gc-full-interval "
            f"{values['gc_full_interval']:g}s: want 0 (off) or an interval no longer than the "
            "full-collection interval"
        )
    if values["bind_lock_wait"] < 0:
        parser.error(f"--bind-lock-wait {values['bind_lock_wait']:g}s: want 0 (fail at once) or a positive duration")
    if bool(values["tls_cert_file"]) != bool(values["tls_private_key_file"]):
        parser.error("--tls-cert-file and --tls-private-key-file go together")
    values["client_ca_file"] = values["client_ca_file"] or None
    if values["client_ca_file"] and not values["tls_cert_file"]:
        parser.error("--client-ca-file needs --tls-cert-file and --tls-private-key-file (client certificates "
                     "are checked in the TLS handshake)")  # fmt: skip
    if not is_loopback(values["address"]) and not values["client_ca_file"]:
        # /filter and /bind decide which node and cards a pod gets: reachable from the pod network
        # (the chart's Service, any pod), anyone could bind pods.
        parser.error(
            f"--address {values['address']}: /filter, /prioritize and /bind would be reachable from other "
            "hosts without authentication; listen on 127.0.0.1 (kube-scheduler in the same pod) or give "
            "--tls-cert-file, --tls-private-key-file and --client-ca-file so that only holders of a client "
            "certificate can call them"
        )
    if values["metrics_bind_address"]:
        try:
            split_host_port(values["metrics_bind_address"])
        except ValueError as e:
            parser.error(f"--metrics-bind-address {e}")
    device_config = with_switches(config, values)
    for dest in SCHEDULER_SWITCHES:  # carried by device_config.scheduler, where the vendors read them
        del values[dest]
    return ExtenderOptions(device_config=device_config, **values)


class _Serving:
    """The started server and, process-wide, the garbage collector tuning (stopped first)."""

    def __init__(self, server: Server, freezer: GcFreezer | None) -> None:
        self.server = server
        self.freezer = freezer

    async def stop(self) -> None:
        if self.freezer is not None:
            self.freezer.stop()
        await self.server.stop()


async def serve(options: ExtenderOptions) -> None:
    """Run until SIGTERM/SIGINT."""

    async def start() -> _Serving:
        server = Server(options)
        await server.start()
        # Process-wide, so only here (tests build several Servers in one process).
        freezer = (
            GcFreezer(options.gc_freeze_interval, options.gc_full_interval).start()
            if options.gc_freeze_interval
            else None
        )
        return _Serving(server, freezer)

    await serving.serve_until_signalled(start)


#: Console entry point. Exit 2 on bad flags, config, kubeconfig or certificates; 0 on a clean stop.
main = serving.ServerMain(
    parse=parse_args,
    serve=serve,
    log_level=lambda o: o.log_level,
    say=serving.logged(log),
    files=lambda o: {
        "--tls-cert-file": o.tls_cert_file,
        "--tls-private-key-file": o.tls_private_key_file,
        "--client-ca-file": o.client_ca_file,
    },
    tls_files=lambda o: (o.tls_cert_file, o.tls_private_key_file),
)


if __name__ == "__main__":
    sys.exit(main())
