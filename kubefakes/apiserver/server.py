"""`FakeApiServer`: the in-memory API server on its own thread and event loop, and its command line."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import tempfile
import threading
import time
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from kubefakes.apiserver.admission import DEFAULT_TOKEN, Admission
from kubefakes.apiserver.faults import FaultInjector
from kubefakes.apiserver.routes import ApiRoutes
from kubefakes.apiserver.store import Store
from kubefakes.apiserver.watchers import ABORT_WATCH, CLOSE_WATCH


class FakeApiServer(ApiRoutes):
    """The in-memory API server running on its own thread and event loop.

    ``FakeApiServer().start()`` binds 127.0.0.1 (port 0 = any free port) and writes a kubeconfig;
    ``.url``, ``.kubeconfig_path``, ``.store`` (`Store`), ``.faults`` (`FaultInjector`);
    ``.drop_watches()`` ends every open watch; ``.compact()`` makes older resourceVersions expire;
    ``.stop()`` shuts it down. Also usable as a context manager.

    `bookmark_interval_s`: how often a watch with ``allowWatchBookmarks`` gets a BOOKMARK (the real
    server: about a minute; tests want less). `default_watch_timeout_s`: used when the client sends no
    ``timeoutSeconds`` (the real server picks 30-60 minutes).
    """

    def __init__(
        self,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        history_size: int = 10000,
        bookmark_interval_s: float = 1.0,
        default_watch_timeout_s: float = 1800.0,
        graceful_pod_deletion: bool = False,
        kubeconfig_path: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.store = Store(history_size=history_size, graceful_pod_deletion=graceful_pod_deletion)
        self.faults = FaultInjector()
        #: Bearer tokens -> users, and where admission webhooks' service references are reached.
        self.admission = Admission()
        self.bookmark_interval_s = bookmark_interval_s
        self.default_watch_timeout_s = default_watch_timeout_s
        self.kubeconfig_path = kubeconfig_path
        self.request_count = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> FakeApiServer:
        """Start serving in a daemon thread; returns self once the port is bound."""
        ready = threading.Event()
        error: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._start_async())
            except BaseException as e:  # noqa: BLE001 - reported to the starting thread
                error.append(e)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop_async())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-apiserver", daemon=True)
        self._thread.start()
        ready.wait()
        if error:
            raise error[0]
        if self.kubeconfig_path is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="fake-apiserver-")
            self.kubeconfig_path = os.path.join(self._tmpdir.name, "kubeconfig")
        write_kubeconfig(self.url, self.kubeconfig_path)
        return self

    async def _start_async(self) -> None:
        self.store._loop = asyncio.get_running_loop()
        self.store._loop_thread = threading.get_ident()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        sockets = site._server.sockets if site._server else []  # noqa: SLF001 - the bound port for port 0
        self.port = sockets[0].getsockname()[1]

    async def _stop_async(self) -> None:
        for w in self.store.all_watchers():
            w.queue.put_nowait(CLOSE_WATCH)
        for t in list(self._tasks):
            t.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        """Stop serving and join the thread (idempotent)."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
        self.store.detach_loop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> FakeApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- test hooks --------------------------------------------------------------------------------

    def drop_watches(self, *, abrupt: bool = False) -> int:
        """End every open watch: cleanly (end of stream) or `abrupt` (connection reset). Returns count."""
        watchers = self.store.all_watchers()
        if self._loop is not None:
            marker = ABORT_WATCH if abrupt else CLOSE_WATCH
            for w in watchers:
                self._loop.call_soon_threadsafe(w.queue.put_nowait, marker)
        return len(watchers)

    def compact(self) -> None:
        """Forget the event history (a watch from an older resourceVersion now gets 410 Expired)."""
        self.store.compact()

    def kubeconfig_for(self, user: dict[str, Any], path: str) -> str:
        """Write a kubeconfig at `path` whose token makes requests as `user` (a userInfo dict with
        ``username`` and ``groups``, see `kubefakes.apiserver.admission.service_account_user`);
        returns `path`."""
        token = f"token-{len(self.admission.tokens)}-{user.get('username', 'user')}"
        self.admission.add_user(token, user)
        return write_kubeconfig(self.url, path, token=token)

    def open_watch_count(self, resource: str | None = None) -> int:
        """Open watches, of one resource or all."""
        return len(
            [w for w in self.store.all_watchers() if resource is None or w.table.info.plural == resource]
        )

    # -- HTTP --------------------------------------------------------------------------------------


def write_kubeconfig(url: str, path: str, *, namespace: str = "default", token: str = DEFAULT_TOKEN) -> str:
    """Write a kubeconfig (YAML-compatible JSON) pointing at `url` with `token` (default: the admin's);
    returns `path`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": token}}],
        "contexts": [
            {"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}
        ],
        "current-context": "fake",
        "preferences": {},
    }
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    os.replace(tmp, path)
    return path


def _now(value: str | None) -> datetime:
    if not value:
        return datetime.now(UTC).replace(microsecond=0)
    t = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def main(argv: list[str] | None = None) -> int:
    """``python -m kubefakes.apiserver [--port 0] [--kubeconfig-out F] [--demo [--now T]]``: serve until
    interrupted; returns 0."""
    parser = argparse.ArgumentParser(
        prog="python -m kubefakes.apiserver",
        description="An in-memory Kubernetes API server (nodes, pods, events, quotas, namespaces, leases, configmaps).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument("--kubeconfig-out", help="write a kubeconfig for this server to this file")
    parser.add_argument("--history-size", type=int, default=10000, help="watch events kept per resource")
    parser.add_argument(
        "--bookmark-interval", type=float, default=1.0, help="seconds between watch bookmarks"
    )
    parser.add_argument(
        "--seed",
        action="append",
        default=[],
        help="JSON file with an object (with 'kind') or a list of objects to create at start; repeatable",
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="seed the demo GPU cluster of docs/operations.md (kubefakes/demo_cluster.py): seven nodes, "
        "their pods, a quota and the chart's device ConfigMap",
    )
    parser.add_argument(
        "--now",
        metavar="RFC3339",
        help="with --demo: the clock its lock ages and handshakes are relative to (default: now; the docs' "
        "examples use 2026-05-04T10:00:00Z)",
    )
    args = parser.parse_args(argv)
    if args.now and not args.demo:
        parser.error("--now: only with --demo")
    try:
        now = _now(args.now)
    except ValueError:
        parser.error(f"--now {args.now!r}: want an RFC 3339 time such as 2026-05-04T10:00:00Z")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = FakeApiServer(
        host=args.host,
        port=args.port,
        history_size=args.history_size,
        bookmark_interval_s=args.bookmark_interval,
        kubeconfig_path=args.kubeconfig_out,
    )
    if args.demo:
        from kubefakes.demo_cluster import demo_objects

        for obj in demo_objects(now):
            server.store.create_any(obj)
    for path in args.seed:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        for obj in data if isinstance(data, list) else [data]:
            server.store.create_any(obj)
    server.start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0
