"""`hami-scheduler-extender`: flags, environment, logging, TLS and the server loop; no scheduling logic here.

    hami-scheduler-extender --kubeconfig FILE --address 127.0.0.1 --port 8888 --scheduler-name hami-scheduler
    hami-scheduler-extender --tls-cert-file C --tls-private-key-file K --leader-elect \
        --leader-elect-resource-namespace kube-system --config /device-config.yaml

Precedence, one rule for every option: command-line flag > environment variable
``HAMI_EXTENDER_<FLAG_NAME>`` (e.g. ``HAMI_EXTENDER_PORT=8888``, ``HAMI_EXTENDER_LEADER_ELECT=true``) >
device config file (only `--scheduler-name`: ``scheduler.schedulerName``) > built-in default.
Also read: ``KUBECONFIG`` (when neither the flag nor ``HAMI_EXTENDER_KUBECONFIG`` is set; without any
kubeconfig the in-cluster service account is used), ``POD_NAME`` / ``POD_NAMESPACE`` (default lease
identity and namespace). Durations accept seconds (``300``) or Go-style units (``5m``, ``30s``, ``1m30s``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import socket
import ssl
import sys
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

import hami
from hami.cluster import ClusterState
from hami.config import load_config_file
from hami.errors import HamiError, InvalidRequest
from hami.kube import KubeClient
from scheduler_extender.app import make_app
from scheduler_extender.events import EVENT_LEVELS, EventSink
from scheduler_extender.gctune import GcFreezer
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.runtime import Runtime
from scheduler_extender.service import Extender, Settings
from scheduler_extender.sync import Inflight
from scheduler_extender.wire import MAX_BODY_BYTES

log = logging.getLogger("scheduler_extender")

ENV_PREFIX = "HAMI_EXTENDER_"
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")


def duration(value: str) -> float:
    """``300`` / ``300s`` / ``5m`` / ``1m30s`` / ``500ms`` -> seconds. Raises ArgumentTypeError."""
    text = str(value).strip()
    try:
        return float(text)
    except ValueError:
        pass
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        n, unit = float(m.group(1)), m.group(2)
        total += n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
        pos = m.end()
    if pos != len(text) or not text:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration; valid: 300, 300s, 5m, 1m30s, 500ms")
    return total


def boolean(value: str) -> bool:
    v = str(value).strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{value!r} is not a boolean; valid: true, false")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hami-scheduler-extender",
        description="HAMi scheduler extender (filter + bind for kube-scheduler)",
    )
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, else in-cluster)")
    p.add_argument("--address", default="0.0.0.0", help="listen address (default 0.0.0.0)")
    p.add_argument("--port", type=int, default=8888, help="listen port (default 8888; 0 = any free port)")
    p.add_argument("--tls-cert-file", help="PEM certificate: serve HTTPS (with --tls-private-key-file)")
    p.add_argument("--tls-private-key-file", help="PEM private key for --tls-cert-file")
    p.add_argument(
        "--scheduler-name",
        help="place only pods with this spec.schedulerName (default: config or hami-scheduler)",
    )
    p.add_argument("--config", help="device config YAML (HAMi device-config.yaml)")
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
    p.add_argument("--register-interval", type=duration, default=15.0,
                   help="node liveness pass and handshake stamps (default 15s; 0 disables stamping)")  # fmt: skip
    p.add_argument("--handshake-timeout", type=duration, default=60.0,
                   help="an unanswered Requesting handshake older than this makes a node without allocatable "
                   "devices unusable (HAMi: 60s)")  # fmt: skip
    p.add_argument("--reservation-ttl", type=duration, default=60.0,
                   help="drop a filter reservation no pod event confirmed within this (default 60s)")  # fmt: skip
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
    p.add_argument("--workers", type=int, default=32, help="threads for API calls and decisions (default 32)")
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


def parse_args(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> argparse.Namespace:
    """Flags over ``HAMI_EXTENDER_*`` environment over defaults (see the module docstring)."""
    env = dict(os.environ if env is None else env)
    parser = build_parser()
    for action in parser._actions:  # noqa: SLF001 - environment defaults for every flag
        if not action.option_strings or action.dest == "help":
            continue
        key = ENV_PREFIX + action.dest.upper()
        if key in env:
            raw = env[key]
            try:
                action.default = action.type(raw) if action.type else raw
            except (argparse.ArgumentTypeError, ValueError) as e:
                parser.error(f"{key}={raw!r}: {e}")
    args = parser.parse_args(argv)
    if args.kubeconfig is None:
        args.kubeconfig = env.get("KUBECONFIG") or None
    if args.leader_elect_resource_namespace is None:
        args.leader_elect_resource_namespace = env.get("POD_NAMESPACE") or "kube-system"
    if args.leader_elect_identity is None:
        args.leader_elect_identity = env.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    if args.gc_freeze_interval < 0 or (
        args.gc_freeze_interval and args.gc_full_interval < args.gc_freeze_interval
    ):
        parser.error(
            f"--gc-freeze-interval {args.gc_freeze_interval:g}s / --gc-full-interval {args.gc_full_interval:g}s: "
            "want 0 (off) or an interval no longer than the full-collection interval"
        )
    if bool(args.tls_cert_file) != bool(args.tls_private_key_file):
        parser.error("--tls-cert-file and --tls-private-key-file go together")
    return args


def tls_context(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """A server SSLContext for the pair, or None for plain HTTP. Raises OSError/ssl.SSLError."""
    if not cert:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    return ctx


class Server:
    """The assembled extender for parsed `args`: `await start()`, `port`, `await stop()`.

    Exposes its parts (`state`, `runtime`, `extender`, `metrics`, `client`) for tests and benchmarks.
    Raises ConfigError / InvalidRequest (bad config or kubeconfig), OSError / ssl.SSLError on start.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        config = load_config_file(args.config)
        name = args.scheduler_name if args.scheduler_name is not None else config.scheduler.schedulerName
        self.scheduler_name = name
        self.state = ClusterState(config, scheduler_name=name)
        self.client = KubeClient.from_kubeconfig(
            args.kubeconfig,
            pool_size=args.workers,
            qps=args.kube_qps or None,
            burst=args.kube_burst,
            timeout_s=args.kube_timeout,
        )
        self.metrics = ExtenderMetrics(self.state, version=getattr(hami, "__version__", ""))
        election = None
        if args.leader_elect:
            election = {
                "namespace": args.leader_elect_resource_namespace,
                "name": args.leader_elect_resource_name,
                "identity": args.leader_elect_identity,
                "lease_duration_s": args.leader_elect_lease_duration,
                "renew_deadline_s": args.leader_elect_renew_deadline,
                "retry_period_s": args.leader_elect_retry_period,
            }
        self.inflight = Inflight(args.reservation_ttl)
        self.runtime = Runtime(
            self.client,
            self.state,
            metrics=self.metrics,
            election=election,
            sync_options={
                "inflight": self.inflight,
                "register_interval_s": args.register_interval,
                "handshake_timeout_s": args.handshake_timeout,
                "reservation_ttl_s": args.reservation_ttl,
            },
        )
        self.events = EventSink(
            self.client.create_event,
            component=name or "hami-scheduler",
            on_drop=self.metrics.events_dropped.inc,
            level=args.events,
        )
        self.extender = Extender(
            self.state,
            self.client,
            settings=Settings(
                scheduler_name=name, node_lock_expiry_s=args.node_lock_timeout, async_record=args.async_record
            ),
            metrics=self.metrics,
            events=self.events,
            readiness=self.runtime.readiness,
            inflight=self.inflight,
            pod_lookup=self._cached_pod,
            node_lookup=self._cached_node,
        )
        self.app = make_app(self.extender, max_body_bytes=args.max_request_bytes)
        self.ssl_context = tls_context(args.tls_cert_file, args.tls_private_key_file)
        self.port = 0
        self._runner: web.AppRunner | None = None

    def _cached_pod(self, namespace: str, name: str) -> dict | None:
        sync = self.runtime.sync
        return sync.cached_pod(namespace, name) if sync is not None else None

    def _cached_node(self, name: str) -> dict | None:
        sync = self.runtime.sync
        return sync.nodes.get(name) if sync is not None else None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.args.address in ("0.0.0.0", "") else self.args.address
        return f"{'https' if self.ssl_context else 'http'}://{host}:{self.port}"

    async def start(self) -> None:
        """Listen, then start events and the runtime (leader election / the cluster sync)."""
        loop = asyncio.get_running_loop()
        loop.set_default_executor(
            ThreadPoolExecutor(max_workers=self.args.workers, thread_name_prefix="extender")
        )
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.args.address, self.args.port, ssl_context=self.ssl_context, backlog=1024
        )
        await site.start()
        server = site._server  # noqa: SLF001 - the bound port when --port 0
        self.port = server.sockets[0].getsockname()[1] if server and server.sockets else self.args.port
        log.info(
            "serving on %s (/filter /bind /healthz /readyz /metrics), scheduler %r, leader election %s",
            self.url,
            self.scheduler_name,
            "on" if self.args.leader_elect else "off",
        )
        self.events.start()
        await asyncio.to_thread(self.runtime.start)

    async def stop(self) -> None:
        """Stop campaigning (releasing the Lease), end the term, stop serving."""
        await asyncio.to_thread(self.runtime.stop)
        await self.events.stop()
        if self._runner is not None:
            await self._runner.cleanup()
        self.extender.close()
        self.client.close()


async def serve(args: argparse.Namespace) -> None:
    """Run until SIGTERM/SIGINT."""
    server = Server(args)
    await server.start()
    # Process-wide, so only here (tests build several Servers in one process).
    freezer = (
        GcFreezer(args.gc_freeze_interval, args.gc_full_interval).start() if args.gc_freeze_interval else None
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        if freezer is not None:
            freezer.stop()
        await server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point. Exit 2 on bad flags, config, kubeconfig or certificates; 0 on a clean stop."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )
    try:
        asyncio.run(serve(args))
    except (HamiError, InvalidRequest, OSError, ssl.SSLError) as e:
        log.error("cannot start: %s", e)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
