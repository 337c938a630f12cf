"""An in-memory Kubernetes API server that the official `kubernetes` Python client talks to over HTTP.

Why it exists: no real kube-apiserver can run where this project is tested, yet the extender, the
device plugin and the webhook must be tested against the real client library and the real wire
behaviour (list + watch with resourceVersion, bookmarks, ``410 Gone``, optimistic concurrency, the
three patch formats, the Binding subresource). This server reproduces that behaviour for the
resources the project uses:

* core/v1: ``nodes`` (+``/status``), ``pods`` (+``/status``, ``/binding``), ``bindings``, ``events``,
  ``resourcequotas`` (+``/status``), ``namespaces`` (+``/status``);
* coordination.k8s.io/v1: ``leases``.

Faithful points (each is what kube-apiserver does): one global, increasing resourceVersion; list
answers carry ``metadata.resourceVersion`` and items without ``kind``/``apiVersion``; PUT or a patch
carrying a stale ``metadata.resourceVersion`` is ``409 Conflict``; a write that changes nothing is a
no-op (no new resourceVersion, no event); the main resource ignores ``status`` and ``/status``
ignores everything but ``status`` (pods, nodes, resourcequotas); pod create drops the request's
status (phase ``Pending``) and defaults ``schedulerName``; watch from a resourceVersion older than the
bounded event history answers an ``ERROR`` event with a ``410 Expired`` Status; watches with
selectors see ``DELETED``/``ADDED`` when an object leaves/enters the selection; every error body is a
``Status`` shaped like the real server's (message, reason, details, code).

Not implemented (not used by the project): protobuf/CBOR, server-side apply, authn/authz, admission
webhooks, garbage collection, managedFields, pagination consistency across pages.

Cost model: get/create/update/patch/delete are O(1) in the number of stored objects plus the object
size; a watch event costs O(watchers of that resource); a list scans one namespace (or the whole
resource), except ``spec.nodeName=<node>`` pod lists, which use an index. The event history is
bounded per resource.

Use in tests: `FakeApiServer` (background thread, ``.url``, ``.kubeconfig_path``, ``.store`` for
seeding and assertions, ``.faults`` for injected errors, ``.drop_watches()``, ``.compact()``); the
pytest fixtures are in ``tests/fakes/apiserver.py``. As a separate process (e.g. for benchmarks, so
the server does not share the GIL with the code under test):
``python -m hami.testing.apiserver --port 0 --kubeconfig-out /tmp/kubeconfig [--seed objects.json]``
prints its URL; the same hooks are then reachable over HTTP under ``/_fake/`` (see `_control`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import json
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hami.testing.selectors import (
    SelectorError,
    compile_matcher,
    parse_field_selector,
    parse_label_selector,
)
from hami.testing.store import (
    ABORT_WATCH,
    BY_GROUP,
    CLOSE_WATCH,
    JSON,
    RESOURCES,
    STALE,
    ApiStatusError,
    ResourceInfo,
    Store,
    Table,
    bad_request,
    conflict,
    method_not_allowed,
    not_found,
    object_meta,
    status_body,
    status_details,
    with_type,
)

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------------
# Fault injection


@dataclass
class Fault:
    """Make the next `times` matching requests fail or stall.

    Matching: `verb` is a Kubernetes verb (get, list, watch, create, update, patch, delete) or an HTTP
    method (GET, POST, ...); `resource` a plural (``pods``); `subresource` (``binding``, ``status``; None
    matches any, ``""`` only the main resource); `name`/`namespace`; `path` a regex searched in the URL
    path. Unset fields match anything.
    Effect: wait `delay_s` (with `status` None the request then proceeds normally), then answer
    `status` with a Status body (and ``Retry-After`` for 429), or stall for `hang_s` and answer 504.
    """

    verb: str | None = None
    resource: str | None = None
    subresource: str | None = None
    name: str | None = None
    namespace: str | None = None
    path: str | None = None
    status: int | None = 500
    message: str | None = None
    times: int = 1
    delay_s: float = 0.0
    hang_s: float | None = None
    retry_after_s: int = 1
    hits: int = 0

    def matches(
        self, verb: str, method: str, resource: str, subresource: str, name: str, namespace: str, path: str
    ) -> bool:
        if self.verb is not None and self.verb not in (verb, method):
            return False
        if self.resource is not None and self.resource != resource:
            return False
        if self.subresource is not None and self.subresource != subresource:
            return False
        if self.name is not None and self.name != name:
            return False
        if self.namespace is not None and self.namespace != namespace:
            return False
        return self.path is None or re.search(self.path, path) is not None


class FaultInjector:
    """The active faults; the first matching fault with uses left serves each request."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []

    def add(self, fault: Fault | None = None, /, **kwargs: Any) -> Fault:
        """Add a fault (a `Fault` or its fields as keywords); returns it (``.hits`` counts uses)."""
        f = fault if fault is not None else Fault(**kwargs)
        with self._lock:
            self._faults.append(f)
        return f

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()

    def take(self, *args: str) -> Fault | None:
        with self._lock:
            for f in self._faults:
                if f.times > 0 and f.matches(*args):
                    f.times -= 1
                    f.hits += 1
                    if f.times == 0:
                        self._faults.remove(f)
                    return f
        return None


def _fault_status(f: Fault, info: ResourceInfo | None, name: str) -> ApiStatusError:
    code = f.status or 500
    if code == 409 and info is not None:
        err = conflict(info, name, f.message or STALE)
        return err
    if code == 404 and info is not None:
        return not_found(info, name)
    if code == 429:
        return ApiStatusError(
            429,
            status_body(
                429,
                f.message or "Too many requests, please try again later.",
                details={"retryAfterSeconds": f.retry_after_s},
            ),
            {"Retry-After": str(f.retry_after_s)},
        )
    if code == 500:
        msg = f.message or "injected fault"
        return ApiStatusError(
            500, status_body(500, f"Internal error occurred: {msg}", details={"causes": [{"message": msg}]})
        )
    if code == 410:
        return ApiStatusError(
            410, status_body(410, f.message or "too old resource version", reason="Expired")
        )
    return ApiStatusError(code, status_body(code, f.message or f"injected {code}"))


# ---------------------------------------------------------------------------------------------------
# HTTP layer


@dataclass
class _Route:
    info: ResourceInfo | None
    namespace: str | None  # None: all namespaces / cluster scope
    name: str
    subresource: str
    watch_prefix: bool = False


def _parse_path(path: str) -> _Route | None:
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api" and parts[1] == "v1":
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    resources = BY_GROUP.get((group, version))
    if resources is None or not rest:
        return None
    watch_prefix = False
    if rest[0] == "watch":
        watch_prefix, rest = True, rest[1:]
    if (
        len(rest) >= 3
        and rest[0] == "namespaces"
        and (rest[2] in resources or (group == "" and rest[2] == "bindings"))
    ):
        ns, rest = rest[1], rest[2:]
        if rest[0] == "bindings" and len(rest) == 1:
            return _Route(None, ns, "", "bindings")
        info = resources[rest[0]]
        if not info.namespaced or len(rest) > 3:
            return None
        return _Route(
            info, ns, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", watch_prefix
        )
    info = resources.get(rest[0])
    if info is None or len(rest) > 3:
        return None
    if info.namespaced and len(rest) > 1:
        return None
    return _Route(
        info, None, rest[1] if len(rest) > 1 else "", rest[2] if len(rest) > 2 else "", watch_prefix
    )


def _json_response(body: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(body=json.dumps(body).encode(), status=status, content_type=JSON, headers=headers)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1")


class FakeApiServer:
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

    def open_watch_count(self, resource: str | None = None) -> int:
        """Open watches, of one resource or all."""
        return len(
            [w for w in self.store.all_watchers() if resource is None or w.table.info.plural == resource]
        )

    # -- HTTP --------------------------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.request_count += 1
        try:
            return await self._dispatch(request)
        except ApiStatusError as e:
            return _json_response(e.body, e.code, e.headers)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a fake server bug must answer 500, not hang the client
            log.exception("fake apiserver: %s %s failed", request.method, request.path)
            return _json_response(status_body(500, f"Internal error occurred: {e}"), 500)

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path.startswith("/_fake/"):
            return await self._control(request)
        if path == "/version":
            return _json_response(
                {"major": "1", "minor": "33", "gitVersion": "v1.33.0-hami-fake", "platform": "linux/amd64"}
            )
        if path == "/api":
            return _json_response(
                {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
            )
        if path == "/apis":
            return _json_response(
                {
                    "kind": "APIGroupList",
                    "apiVersion": "v1",
                    "groups": [
                        {
                            "name": g,
                            "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                            "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                        }
                        for (g, v) in BY_GROUP
                        if g
                    ],
                }
            )
        route = _parse_path(path)
        if route is None:
            return self._discovery(path) or _json_response(
                status_body(404, "the server could not find the requested resource", details={}), 404
            )
        q = request.query
        method = request.method
        watch = route.watch_prefix or _truthy(q.get("watch"))
        verb = {
            "GET": "watch" if watch else ("get" if route.name else "list"),
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if route.name else "deletecollection",
        }.get(method, method.lower())
        info = route.info
        fault = self.faults.take(
            verb,
            method,
            info.plural if info else "bindings",
            route.subresource,
            route.name,
            route.namespace or "",
            path,
        )
        if fault is not None:
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.hang_s is not None:
                await asyncio.sleep(fault.hang_s)
                raise ApiStatusError(
                    504, status_body(504, "Timeout: request did not complete within requested timeout")
                )
            if fault.status is not None:
                raise _fault_status(fault, info, route.name)
        dry_run = q.get("dryRun") == "All"
        if info is None:  # POST /api/v1/namespaces/{ns}/bindings
            if method != "POST":
                raise method_not_allowed()
            body = await self._body(request)
            name = ((body or {}).get("metadata") or {}).get("name", "") if isinstance(body, dict) else ""
            self.store.do_bind(route.namespace or "default", name, body, dry_run)
            return _json_response(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
            )
        table = self.store._tables[info.plural]
        ns = (route.namespace or "default") if info.namespaced else ""
        sub = route.subresource
        if (
            sub
            and not (sub == "status" and info.status_subresource)
            and not (sub == "binding" and info.plural == "pods")
        ):
            raise ApiStatusError(
                404, status_body(404, "the server could not find the requested resource", details={})
            )
        if not route.name:
            if method == "GET":
                if watch:
                    return await self._watch(request, table, route.namespace if info.namespaced else None)
                return self._list(table, route.namespace if info.namespaced else None, q)
            if method == "POST":
                if info.namespaced and route.namespace is None:
                    raise method_not_allowed()
                return _json_response(
                    self.store.do_create(table, ns, await self._body(request), dry_run=dry_run), 201
                )
            raise method_not_allowed()
        if sub == "binding":
            if method != "POST":
                raise method_not_allowed()
            self.store.do_bind(ns, route.name, await self._body(request), dry_run)
            return _json_response(
                {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, 201
            )
        if method == "GET":
            return _json_response(with_type(info, self.store.get_object(table, ns, route.name)))
        if method == "PUT":
            body = await self._body(request)
            return _json_response(self.store.do_update(table, ns, route.name, body, sub or None, dry_run))
        if method == "PATCH":
            ctype = request.content_type
            body = await self._body(request)
            return _json_response(
                self.store.do_patch(table, ns, route.name, body, ctype, sub or None, dry_run)
            )
        if method == "DELETE":
            options = await self._body(request, optional=True)
            if "gracePeriodSeconds" in q:
                options = {**(options or {}), "gracePeriodSeconds": int(q["gracePeriodSeconds"])}
            obj = self.store.do_delete(table, ns, route.name, options, dry_run)
            if info.plural in ("pods", "namespaces"):
                return _json_response(obj)
            details = status_details(info, route.name, uid=object_meta(obj).get("uid"))
            return _json_response(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": details,
                }
            )
        raise method_not_allowed()

    async def _control(self, request: web.Request) -> web.Response:
        """Test hooks over HTTP, for a server running in another process (not part of the Kubernetes API).

        ``POST /_fake/objects`` (an object with ``kind``, or a list: created as-is, status kept),
        ``POST /_fake/faults`` (`Fault` fields as JSON), ``DELETE /_fake/faults``,
        ``POST /_fake/drop-watches[?abrupt=true]``, ``POST /_fake/compact``.
        """
        path, method = request.path, request.method
        if path == "/_fake/objects" and method == "POST":
            body = await self._body(request)
            try:
                created = [self.store.create_any(o) for o in (body if isinstance(body, list) else [body])]
            except (ValueError, AttributeError) as e:
                raise bad_request(f"objects: {e}") from None
            return _json_response({"created": len(created)}, 201)
        if path == "/_fake/faults" and method == "POST":
            body = await self._body(request)
            try:
                fault = Fault(**{k: v for k, v in body.items() if k != "hits"})
            except TypeError as e:
                raise bad_request(f"fault: {e}") from None
            self.faults.add(fault)
            return _json_response({"added": 1}, 201)
        if path == "/_fake/faults" and method == "DELETE":
            self.faults.clear()
            return _json_response({"cleared": True})
        if path == "/_fake/drop-watches" and method == "POST":
            watchers = self.store.all_watchers()
            marker = ABORT_WATCH if _truthy(request.query.get("abrupt")) else CLOSE_WATCH
            for w in watchers:
                w.queue.put_nowait(marker)
            return _json_response({"dropped": len(watchers)})
        if path == "/_fake/compact" and method == "POST":
            self.compact()
            return _json_response({"compacted": True})
        raise ApiStatusError(404, status_body(404, f"no fake control endpoint {method} {path}", details={}))

    @staticmethod
    async def _body(request: web.Request, *, optional: bool = False) -> Any:
        raw = await request.read()
        if not raw:
            if optional:
                return None
            raise bad_request("the body of the request is empty")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise bad_request(f"error decoding request body: {e}") from None

    @staticmethod
    def _discovery(path: str) -> web.Response | None:
        parts = [p for p in path.split("/") if p]
        if parts == ["api", "v1"]:
            group, version = "", "v1"
        elif len(parts) == 3 and parts[0] == "apis":
            group, version = parts[1], parts[2]
        else:
            return None
        resources = BY_GROUP.get((group, version))
        if resources is None:
            return None
        return _json_response(
            {
                "kind": "APIResourceList",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": [
                    {
                        "name": r.plural,
                        "singularName": r.kind.lower(),
                        "namespaced": r.namespaced,
                        "kind": r.kind,
                        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"],
                    }
                    for r in resources.values()
                ],
            }
        )

    def _list(self, table: Table, namespace: str | None, q: Mapping[str, str]) -> web.Response:
        info = table.info
        try:
            items, rv = self.store.list_objects(
                info.plural,
                namespace=namespace,
                label_selector=q.get("labelSelector"),
                field_selector=q.get("fieldSelector"),
            )
        except SelectorError as e:
            raise bad_request(str(e)) from None
        wanted = q.get("resourceVersion")
        if wanted not in (None, "", "0"):
            try:
                wanted_rv = int(wanted)
            except ValueError:
                raise bad_request(f'invalid resource version "{wanted}"') from None
            if wanted_rv > rv:
                raise ApiStatusError(
                    504,
                    status_body(
                        504,
                        f"Too large resource version: {wanted_rv}, current: {rv}",
                        reason="Timeout",
                        details={
                            "causes": [
                                {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                            ],
                            "retryAfterSeconds": 1,
                        },
                    ),
                )
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        limit = int(q.get("limit") or 0)
        cont = q.get("continue")
        if cont:
            try:
                token = json.loads(base64.b64decode(cont))
                after = (token["ns"], token["name"])
                meta["resourceVersion"] = str(token["rv"])
            except (ValueError, KeyError, TypeError):
                raise bad_request(f"invalid continue token: {cont!r}") from None
            keys = [(object_meta(o).get("namespace", ""), object_meta(o).get("name", "")) for o in items]
            items = items[bisect.bisect_right(keys, after) :]
        if limit and len(items) > limit:
            items = items[:limit]
            last = object_meta(items[-1])
            token = {
                "rv": int(meta["resourceVersion"]),
                "ns": last.get("namespace", ""),
                "name": last.get("name", ""),
            }
            meta["continue"] = base64.b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = 0  # not tracked precisely
        body = {"kind": f"{info.kind}List", "apiVersion": info.api_version, "metadata": meta, "items": items}
        return _json_response(body)

    async def _watch(self, request: web.Request, table: Table, namespace: str | None) -> web.StreamResponse:
        q = request.query
        info = table.info
        try:
            matcher = compile_matcher(
                parse_label_selector(q.get("labelSelector")),
                parse_field_selector(q.get("fieldSelector"), info.field_labels),
            )
        except SelectorError as e:
            raise bad_request(str(e)) from None
        timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout_s)
        bookmarks = _truthy(q.get("allowWatchBookmarks"))
        send_initial = _truthy(q.get("sendInitialEvents"))
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        try:
            watcher, lines = self.store.open_watch(
                table, namespace, matcher, q.get("resourceVersion"), send_initial
            )
        except ApiStatusError as e:
            if e.code != 410:
                raise
            # The real server answers 200 and sends the expiry as an ERROR event on the stream.
            await resp.prepare(request)
            await resp.write(json.dumps({"type": "ERROR", "object": e.body}).encode() + b"\n")
            await resp.write_eof()
            return resp
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            await resp.prepare(request)
            if lines:
                await resp.write(b"".join(lines))
            if send_initial and bookmarks:
                mark = {
                    "kind": info.kind,
                    "apiVersion": info.api_version,
                    "metadata": {
                        "resourceVersion": str(watcher.start_rv),
                        "annotations": {"k8s.io/initial-events-end": "true"},
                    },
                }
                await resp.write(json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            next_bookmark = loop.time() + self.bookmark_interval_s
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        rv = self.store.bookmark_rv(table)
                        if rv is not None and watcher.queue.empty():
                            mark = {
                                "kind": info.kind,
                                "apiVersion": info.api_version,
                                "metadata": {"resourceVersion": str(rv)},
                            }
                            await resp.write(
                                json.dumps({"type": "BOOKMARK", "object": mark}).encode() + b"\n"
                            )
                        next_bookmark = loop.time() + self.bookmark_interval_s
                    continue
                # Send everything queued up to a close marker in one write; what follows a marker
                # is not sent (the connection ends there, as a real drop would).
                payload: list[bytes] = []
                marker = None
                while True:
                    if isinstance(item, bytes):
                        payload.append(item)
                    else:
                        marker = item
                        break
                    if watcher.queue.empty():
                        break
                    item = watcher.queue.get_nowait()
                if payload:
                    await resp.write(b"".join(payload))
                if marker is ABORT_WATCH:
                    if request.transport is not None:
                        request.transport.abort()
                    return resp
                if marker is CLOSE_WATCH:
                    break
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass
        finally:
            self.store.close_watch(watcher)
            if task is not None:
                self._tasks.discard(task)
        return resp


def write_kubeconfig(url: str, path: str, *, namespace: str = "default") -> str:
    """Write a kubeconfig (YAML-compatible JSON) pointing at `url` with a dummy token; returns `path`."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {"token": "fake-token"}}],
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


def main(argv: list[str] | None = None) -> int:
    """``python -m hami.testing.apiserver --port 0 --kubeconfig-out F``: serve until interrupted."""
    parser = argparse.ArgumentParser(
        prog="python -m hami.testing.apiserver", description=__doc__.split("\n")[0]
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
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = FakeApiServer(
        host=args.host,
        port=args.port,
        history_size=args.history_size,
        bookmark_interval_s=args.bookmark_interval,
        kubeconfig_path=args.kubeconfig_out,
    )
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


if __name__ == "__main__":
    raise SystemExit(main())

__all__ = [
    "ApiStatusError",
    "Fault",
    "FaultInjector",
    "FakeApiServer",
    "RESOURCES",
    "ResourceInfo",
    "Store",
    "status_body",
    "write_kubeconfig",
    "main",
]
