"""The HTTP layer: URL parsing, discovery, and the verbs mapped onto the store.

A mixin of `FakeApiServer` (which holds the store, the faults and the watch settings).
"""

from __future__ import annotations

import asyncio
import base64
import bisect
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from kubefakes.apiserver.admission import Webhook, validate_policies
from kubefakes.apiserver.faults import Fault, fault_status
from kubefakes.apiserver.patches import deep_copy
from kubefakes.apiserver.resources import (
    BY_GROUP,
    JSON,
    ResourceInfo,
    object_meta,
    with_type,
)
from kubefakes.apiserver.selectors import (
    SelectorError,
)
from kubefakes.apiserver.status import (
    ApiStatusError,
    bad_request,
    method_not_allowed,
    status_body,
    status_details,
)
from kubefakes.apiserver.table import Table
from kubefakes.apiserver.watchers import ABORT_WATCH, CLOSE_WATCH, serve_watch, truthy

if TYPE_CHECKING:
    from kubefakes.apiserver.admission import Admission
    from kubefakes.apiserver.faults import FaultInjector
    from kubefakes.apiserver.store import Store

log = logging.getLogger(__name__)


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


class ApiRoutes:
    """Request handlers of `FakeApiServer`; the attributes below are set by its ``__init__``."""

    store: Store
    faults: FaultInjector
    admission: Admission
    bookmark_interval_s: float
    default_watch_timeout_s: float
    request_count: int
    _tasks: set[asyncio.Task[Any]]

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
        user = self.admission.user_of(request.headers.get("Authorization"))
        q = request.query
        method = request.method
        watch = route.watch_prefix or truthy(q.get("watch"))
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
            while fault.gate is not None and not fault.gate.is_set():
                await asyncio.sleep(0.01)
            if fault.delay_s:
                await asyncio.sleep(fault.delay_s)
            if fault.hang_s is not None:
                await asyncio.sleep(fault.hang_s)
                raise ApiStatusError(
                    504, status_body(504, "Timeout: request did not complete within requested timeout")
                )
            if fault.status is not None:
                raise fault_status(fault, info, route.name)
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
                    return await serve_watch(
                        request,
                        self.store,
                        table,
                        route.namespace if info.namespaced else None,
                        default_timeout_s=self.default_watch_timeout_s,
                        bookmark_interval_s=self.bookmark_interval_s,
                        tasks=self._tasks,
                    )
                return self._list(table, route.namespace if info.namespaced else None, q)
            if method == "POST":
                if info.namespaced and route.namespace is None:
                    raise method_not_allowed()
                body = await self._body(request)
                hooks = self._webhooks()
                if hooks or self._has_policies():
                    body = await self._admit_create(hooks, table, ns, body, user, dry_run)
                return _json_response(self.store.do_create(table, ns, body, dry_run=dry_run), 201)
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
        if method in ("PUT", "PATCH"):
            ctype = request.content_type
            body = await self._body(request)
            hooks = self._webhooks()
            if hooks or self._has_policies():
                return _json_response(
                    await self._admit_update(
                        hooks,
                        table,
                        ns,
                        route.name,
                        body,
                        ctype if method == "PATCH" else None,
                        sub,
                        user,
                        dry_run,
                    )
                )
            if method == "PUT":
                return _json_response(self.store.do_update(table, ns, route.name, body, sub or None, dry_run))
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

    # -- admission ----------------------------------------------------------------------------------

    def _webhooks(self) -> list[Webhook]:
        configs, _ = self.store.list_objects("mutatingwebhookconfigurations")
        return self.admission.webhooks(configs) if configs else []

    def _has_policies(self) -> bool:
        return self.store.count("validatingadmissionpolicybindings") > 0

    def _validate(
        self,
        operation: str,
        info: ResourceInfo,
        ns: str,
        name: str,
        obj: dict,
        old: dict | None,
        user: dict,
        sub: str = "",
    ) -> None:
        if not self._has_policies():
            return
        policies, _ = self.store.list_objects("validatingadmissionpolicies")
        bindings, _ = self.store.list_objects("validatingadmissionpolicybindings")
        validate_policies(
            policies, bindings, operation=operation, info=info, namespace=ns, name=name, obj=obj, old=old,
            user=user, sub=sub,
        )  # fmt: skip

    def _namespace_labels(self, ns: str) -> dict[str, str]:
        stored = self.store.get("namespaces", ns) if ns else None
        if stored is None:
            return {"kubernetes.io/metadata.name": ns}
        return dict(object_meta(stored).get("labels") or {})

    async def _admit_create(
        self, hooks: list[Webhook], table: Table, ns: str, body: Any, user: dict, dry_run: bool
    ) -> Any:
        """The object to create after the mutating webhooks (defaulted first, as the API server does)."""
        info = table.info
        preview = self.store.do_create(table, ns, deep_copy(body), dry_run=True)
        preview.pop("kind", None)
        preview.pop("apiVersion", None)
        for k in ("uid", "creationTimestamp", "resourceVersion"):
            preview["metadata"].pop(k, None)
        matched = self.admission.matching(
            hooks, operation="CREATE", info=info, sub="", namespace_labels=self._namespace_labels(ns),
            obj=preview, old=None,
        )  # fmt: skip
        name = object_meta(preview).get("name", "") if not object_meta(body).get("generateName") else ""
        out = body
        if matched:
            out = await self.admission.admit(
                matched, operation="CREATE", info=info, namespace=ns if info.namespaced else "", name=name,
                obj=preview, old=None, user=user, dry_run=dry_run,
            )  # fmt: skip
        self._validate("CREATE", info, ns, name, out if matched else preview, None, user)
        return out

    async def _admit_update(
        self,
        hooks: list[Webhook],
        table: Table,
        ns: str,
        name: str,
        body: Any,
        ctype: str | None,
        sub: str,
        user: dict,
        dry_run: bool,
    ) -> dict[str, Any]:
        """PUT or PATCH through the mutating webhooks (operation UPDATE, object and oldObject), then
        written with the old resourceVersion as precondition; a write in between runs admission again
        (kube-apiserver's GuaranteedUpdate), unless the client named a resourceVersion (409 then).
        `ctype`: the patch's content type, None for a PUT."""
        info = table.info
        given_rv = isinstance(body, dict) and bool((body.get("metadata") or {}).get("resourceVersion"))
        for _ in range(20):
            old = deep_copy(self.store.get_object(table, ns, name))
            if ctype is not None:
                new = self.store.do_patch(table, ns, name, body, ctype, sub or None, dry_run=True)
            else:
                new = self.store.do_update(table, ns, name, deep_copy(body), sub or None, dry_run=True)
            new = deep_copy(new)
            new.pop("kind", None)
            new.pop("apiVersion", None)
            matched = self.admission.matching(
                hooks, operation="UPDATE", info=info, sub=sub, namespace_labels=self._namespace_labels(ns),
                obj=new, old=old,
            )  # fmt: skip
            if matched:
                new = await self.admission.admit(
                    matched, operation="UPDATE", info=info, namespace=ns if info.namespaced else "", name=name,
                    obj=new, old=old, user=user, dry_run=dry_run, sub=sub,
                )  # fmt: skip
            self._validate("UPDATE", info, ns, name, new, old, user, sub)
            new.setdefault("metadata", {})["resourceVersion"] = object_meta(old).get("resourceVersion")
            try:
                return self.store.do_update(table, ns, name, new, sub or None, dry_run)
            except ApiStatusError as e:
                if e.code != 409 or given_rv:
                    raise
        raise ApiStatusError(409, status_body(409, f"{info.plural} {name!r}: the object kept changing"))

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
                fault = Fault(**{k: v for k, v in body.items() if k not in ("hits", "gate")})
            except TypeError as e:
                raise bad_request(f"fault: {e}") from None
            self.faults.add(fault)
            return _json_response({"added": 1}, 201)
        if path == "/_fake/faults" and method == "DELETE":
            self.faults.clear()
            return _json_response({"cleared": True})
        if path == "/_fake/drop-watches" and method == "POST":
            watchers = self.store.all_watchers()
            marker = ABORT_WATCH if truthy(request.query.get("abrupt")) else CLOSE_WATCH
            for w in watchers:
                w.queue.put_nowait(marker)
            return _json_response({"dropped": len(watchers)})
        if path == "/_fake/compact" and method == "POST":
            self.store.compact()
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
