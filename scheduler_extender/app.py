"""The assembled extender: options -> state, API client, runtime, events, service and HTTP app.

`Server` is what the console script runs and what the integration tests and the benchmark start in
process, so they exercise the production assembly. The HTTP handlers are in `scheduler_extender.routes`,
the flags in `scheduler_extender.cli`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

import hami
from hami.cluster import ClusterState
from hami.kube import KubeClient
from hami.tls import ReloadingTLS
from scheduler_extender.events import INVALID_REGISTRATION, EventSink
from scheduler_extender.lockwait import LockQueues
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.options import ExtenderOptions
from scheduler_extender.routes import make_app, make_health_app
from scheduler_extender.runtime import Runtime
from scheduler_extender.service import Extender, Settings
from scheduler_extender.sync import Inflight

__all__ = ["Server", "make_app", "make_health_app", "tls_context"]

log = logging.getLogger("scheduler_extender")


def tls_context(cert: str | None, key: str | None, client_ca: str | None = None) -> ssl.SSLContext | None:
    """A server SSLContext for the pair that follows certificate rotation (`hami.tls.ReloadingTLS`, the
    webhook's mechanism: the files are re-read on the next handshake after they change), or None for
    plain HTTP. With `client_ca` every client must present a certificate signed by it. Raises
    OSError/ssl.SSLError when the initial pair (or the CA file) does not load."""
    if not cert or not key:
        return None
    return ReloadingTLS(cert, key, client_ca_file=client_ca).context


class Server:
    """The assembled extender for `options`: `await start()`, `port`, `await stop()`.

    Exposes its parts (`state`, `runtime`, `extender`, `metrics`, `client`) for tests and benchmarks.
    Raises InvalidRequest (unloadable kubeconfig), OSError / ssl.SSLError on start.
    """

    def __init__(self, options: ExtenderOptions) -> None:
        self.options = options
        name = options.scheduler_name
        self.scheduler_name = name
        # spec_floor: a pod placed before this process started counts at least what its spec asks.
        self.state = ClusterState(options.device_config, scheduler_name=name, spec_floor=True)
        self.client = KubeClient.from_kubeconfig(
            options.kubeconfig,
            pool_size=options.workers,
            qps=options.kube_qps or None,
            burst=options.kube_burst,
            timeout_s=options.kube_timeout,
        )
        self.metrics = ExtenderMetrics(self.state, version=getattr(hami, "__version__", ""))
        self._invalid_nodes: set[str] = set()  # nodes labelled in hami_node_registration_invalid
        self.inflight = Inflight(options.reservation_ttl)
        self.lock_queues = LockQueues()
        self.runtime = Runtime(
            self.client,
            self.state,
            metrics=self.metrics,
            election=options.election,
            sync=options.sync,
            inflight=self.inflight,
            lock_queues=self.lock_queues,
            on_invalid_registration=self._invalid_registration,
        )
        self.events = EventSink(
            self.client.acreate_event,
            component=name or "hami-scheduler",
            on_drop=self.metrics.events_dropped.inc,
            level=options.events,
        )
        self.extender = Extender(
            self.state,
            self.client,
            settings=Settings(
                scheduler_name=name,
                node_lock_expiry_s=options.node_lock_timeout,
                async_record=options.async_record,
                bind_lock_wait_s=options.bind_lock_wait,
                filter_mode=options.filter_mode,
            ),
            metrics=self.metrics,
            events=self.events,
            readiness=self.runtime.readiness,
            inflight=self.inflight,
            pod_lookup=self._cached_pod,
            node_lookup=self._cached_node,
            lock_queues=self.lock_queues,
            term_guard=self.runtime.guard,
        )
        self.app = make_app(self.extender, max_body_bytes=options.max_request_bytes)
        self.ssl_context = tls_context(
            options.tls_cert_file, options.tls_private_key_file, options.client_ca_file
        )
        self.port = 0
        self.metrics_port = 0
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None

    def _invalid_registration(self, node: dict, reason: str | None) -> None:
        """A node's registration became unreadable (`reason`) or readable again (None): the metric, and
        a Warning event on the Node naming the annotation and the problem."""
        meta = node.get("metadata") or {}
        name = meta.get("name", "")
        if reason is None:
            if name in self._invalid_nodes:
                self._invalid_nodes.discard(name)
                self.metrics.registration_invalid.remove(name)
            return
        self._invalid_nodes.add(name)
        self.metrics.registration_invalid.labels(name).set(1)
        self.events.emit(
            {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name, "uid": meta.get("uid", "")}},
            reason=INVALID_REGISTRATION,
            message=f"node left out of scheduling: its device registration cannot be read: {reason}",
            warning=True,
        )

    def _cached_pod(self, namespace: str, name: str) -> dict | None:
        sync = self.runtime.sync
        return sync.cached_pod(namespace, name) if sync is not None else None

    def _cached_node(self, name: str) -> dict | None:
        sync = self.runtime.sync
        return sync.nodes.get(name) if sync is not None else None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.options.address in ("0.0.0.0", "") else self.options.address
        return f"{'https' if self.ssl_context else 'http'}://{host}:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        """``http://HOST:PORT`` of the health and metrics listener, None without one."""
        listener = self.options.metrics_listener
        if listener is None:
            return None
        host = "127.0.0.1" if listener[0] in ("0.0.0.0", "::") else listener[0]
        return f"http://{host}:{self.metrics_port}"

    async def start(self) -> None:
        """Listen, then start events and the runtime (leader election / the cluster sync)."""
        o = self.options
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=o.workers, thread_name_prefix="extender"))
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, o.address, o.port, ssl_context=self.ssl_context, backlog=1024)
        await site.start()
        server = site._server  # noqa: SLF001 - the bound port when --port 0
        self.port = server.sockets[0].getsockname()[1] if server and server.sockets else o.port
        listener = o.metrics_listener
        if listener is not None:
            # Probes and Prometheus reach the pod IP; the verbs stay on their own (loopback) listener.
            self._metrics_runner = web.AppRunner(
                make_health_app(self.extender), access_log=None, handle_signals=False
            )
            await self._metrics_runner.setup()
            msite = web.TCPSite(self._metrics_runner, listener[0], listener[1])
            await msite.start()
            mserver = msite._server  # noqa: SLF001 - the bound port when the port is 0
            self.metrics_port = (
                mserver.sockets[0].getsockname()[1] if mserver and mserver.sockets else listener[1]
            )
            log.info("health and metrics also on %s (/healthz /readyz /metrics)", self.metrics_url)
        log.info(
            "serving on %s (/filter /prioritize /bind /healthz /readyz /metrics), filter mode %s, scheduler %r, "
            "leader election %s",
            self.url,
            o.filter_mode,
            self.scheduler_name,
            "on" if o.leader_elect else "off",
        )
        self.events.start()
        await asyncio.to_thread(self.runtime.start)

    async def stop(self) -> None:
        """Stop campaigning (releasing the Lease), end the term, stop serving."""
        await asyncio.to_thread(self.runtime.stop)
        await self.events.stop()
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
        if self._runner is not None:
            await self._runner.cleanup()
        self.extender.close()
        await self.client.aclose()
