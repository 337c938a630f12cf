"""Assembly of the monitor: pod watch -> `PodIndex`; scan thread -> `Snapshot` -> rendered text; HTTP server.

`MonitorApp` is what the console script runs and what tests start, so tests exercise the production
assembly (only the host backend, the directories and the API server differ).

Threads: the reflector's (pod events), the scan thread (reads files and /proc, renders the snapshot
families every `scan_interval_s`), and the asyncio loop serving HTTP, which never does file I/O.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from aiohttp import web

import hami
from device_plugin.monitor.host import HostBackend
from device_plugin.monitor.metrics import MonitorMetrics, render_snapshot
from device_plugin.monitor.options import MonitorOptions
from device_plugin.monitor.pods import PodIndex
from device_plugin.monitor.routes import make_routes
from device_plugin.monitor.scanner import Scanner, Snapshot
from hami.kube import KubeClient, Reflector

log = logging.getLogger(__name__)


class MonitorApp:
    """One running monitor; `start()` / `stop()` from the asyncio loop. `port` is the bound port."""

    def __init__(self, options: MonitorOptions, host: HostBackend, kube: KubeClient) -> None:
        self.options = options
        self.host = host
        self.kube = kube
        self.metrics = MonitorMetrics(version=getattr(hami, "__version__", ""))
        self.pods = PodIndex()
        self.reflector = Reflector(
            kube,
            "pods",
            field_selector=f"spec.nodeName={options.node_name}",
            on_sync=self._on_sync,
            on_add=self.pods.on_add,
            on_update=self.pods.on_update,
            on_delete=self.pods.on_delete,
            name="monitor-pods",
        )
        self.scanner = Scanner(
            options.containers_dir,
            self.pods,
            host=host,
            grace_s=options.grace_period_s,
            proc=options.proc,
            on_error=self.metrics.error,
            on_removed=lambda _path: self.metrics.removed.inc(),
            confirm_gone=self._confirm_gone,
        )
        self.snapshot = Snapshot()
        self._text = b""
        self._scans = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    # -- pod watch ------------------------------------------------------------------------------------

    def _on_sync(self, items: list[dict[str, Any]]) -> None:
        self.pods.on_sync(items)
        self.metrics.pods_synced.set(1)

    def _confirm_gone(self, uids: set[str]) -> set[str]:
        """The UIDs of `uids` that no pod on this node has, by one fresh list (raises on API errors)."""
        live = self.kube.list("pods", field_selector=f"spec.nodeName={self.options.node_name}")
        existing = {(p.get("metadata") or {}).get("uid") for p in live}
        return uids - existing

    # -- scanning -------------------------------------------------------------------------------------

    def scan_once(self) -> Snapshot:
        """One scan, rendered and published (the scan thread's body; tests may call it directly)."""
        snap = self.scanner.scan()
        text = render_snapshot(
            snap, node=self.options.node_name, legacy=self.options.legacy_metrics, pods=self.pods.snapshot()
        )
        self.snapshot, self._text = snap, text  # one reference swap each: a scrape sees a whole scan
        self.metrics.observe(snap)
        self._scans += 1
        return snap

    def _run(self) -> None:
        # The first scan waits for the pod list (or one interval): a scan before it would name nothing.
        self.pods.wait_synced(self.options.scan_interval_s)
        while not self._stop.is_set():
            try:
                self.scan_once()
            except Exception:  # noqa: BLE001 - one bad scan must not end the monitor
                log.exception("scan failed")
            self._stop.wait(self.options.scan_interval_s)

    def ready(self) -> str | None:
        if not self.pods.synced:
            return "pod list not synced yet"
        if self._scans == 0:
            return "no scan finished yet"
        return None

    # -- lifecycle ------------------------------------------------------------------------------------

    async def start(self) -> None:
        self.reflector.start()
        self._thread = threading.Thread(target=self._run, name="monitor-scan", daemon=True)
        self._thread.start()
        app = make_routes(self.metrics, lambda: self._text, self.ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.options.address, self.options.port)
        await site.start()
        server = site._server  # noqa: SLF001 - the bound port when asked for port 0
        self.port = server.sockets[0].getsockname()[1] if server and server.sockets else self.options.port
        log.info(
            "hami-vgpu-monitor on %s:%s for node %s, reading %s every %.1fs",
            self.options.address, self.port, self.options.node_name, self.options.containers_dir,
            self.options.scan_interval_s,
        )  # fmt: skip

    async def stop(self) -> None:
        self._stop.set()
        if self._runner is not None:
            await self._runner.cleanup()
        self.reflector.stop()
        if self._thread is not None:
            self._thread.join(5.0)
        self.host.close()
