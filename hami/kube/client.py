"""`KubeClient`: the project's only door to the Kubernetes API server (the official `kubernetes` client).

Why one module: every server here (extender, device plugin, webhook) needs the same few calls, the
same retry policy and the same error mapping, and the client library has sharp edges that should be
handled once:

* Objects are plain dicts in the API's JSON form, never the generated model classes: every call uses
  ``_preload_content=False`` and orjson (much faster for thousands of pods, and it avoids the
  client's known failure to deserialise the ``Status`` a successful Binding returns as a ``V1Binding``,
  kubernetes-client/python#547).
* get / create / patch / Binding (the calls a scheduler makes per pod) go straight to the client's
  ``ApiClient.rest_client`` urllib3 pool with the same URL, headers and auth (`KubeClient._request`);
  the generated methods' argument validation, model sanitisation and per-call host/proxy/token
  look-ups were half of their CPU. List, watch, replace and delete still use the generated methods.
* Retries and error mapping are `hami.kube.retry`'s (429/5xx/transport retried, 409 only without a
  precondition; 404 -> `NotFound`, which getters turn into None).

Methods are synchronous and thread-safe. The hot calls also come as coroutines for asyncio servers
(``aget``, ``apatch``, ``acreate``, ``apatch_pod_metadata``, ``apatch_node_annotations``, ``abind_pod``,
``acreate_event``): the same requests, built by the same code here, sent from the event loop by
`hami.kube.aio.AsyncTransport` (no worker thread per call). Bodies are encoded and answers decoded
with orjson.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote

import orjson
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hami.errors import ApiError, Conflict, InvalidRequest, NotFound
from hami.kube.aio import AsyncTransport
from hami.kube.events import EventLog, arecord_event, record_event
from hami.kube.resources import RESOURCES, Res, meta_of, ref
from hami.kube.resources import resource as resource_of
from hami.kube.retry import (
    TRANSPORT_ERRORS,
    call_with_retries,
    classify,
    map_api_exception,
    transport_error,
)
from hami.kube.watch import WatchStream

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_PATCH_TYPES = {"merge": MERGE_PATCH, "strategic": STRATEGIC_MERGE_PATCH, "json": JSON_PATCH}

#: Seconds a bearer token read through the client's refresh hook is reused by the hot calls.
AUTH_REFRESH_S = 60.0


class _RateLimiter:
    """Token bucket like client-go's: `qps` tokens per second, at most `burst` saved up."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take one token; the seconds to wait before using it (0 when one was saved up)."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1
            return -self._tokens / self.qps if self._tokens < 0 else 0.0

    def acquire(self) -> None:
        wait = self.reserve()
        if wait > 0:
            time.sleep(wait)


class _Req(NamedTuple):
    """One hot-path request as `KubeClient` builds it, for either transport."""

    what: str
    method: str
    path: str
    body: Any = None
    content_type: str = "application/json"
    retry_conflict: bool = False


class KubeClient:
    """Plain-dict access to the API server with retries and error mapping (see module docstring).

    `qps`/`burst`: client-side rate limit (None = unlimited). `timeout_s`: per request (connect and
    read). `retries`: attempts after the first for retryable failures; `retry_max_wait_s` caps one
    backoff step (``Retry-After`` is honoured up to that cap).
    """

    def __init__(
        self,
        api_client: k8s.ApiClient,
        *,
        qps: float | None = None,
        burst: int = 100,
        timeout_s: float = 10.0,
        retries: int = 5,
        retry_initial_wait_s: float = 0.05,
        retry_max_wait_s: float = 2.0,
        event_dedup_s: float = 600.0,
    ) -> None:
        self.api_client = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.coordination = k8s.CoordinationV1Api(api_client)
        self._apis = {
            "core": self.core,
            "coordination": self.coordination,
            "policy": k8s.PolicyV1Api(api_client),
        }
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_initial_wait_s = retry_initial_wait_s
        self.retry_max_wait_s = retry_max_wait_s
        self._limiter = _RateLimiter(qps, burst) if qps else None
        self.event_dedup_s = event_dedup_s
        self._event_log = EventLog(event_dedup_s)
        # Read once: the generated client recomputes the host (and scans the environment for proxies)
        # on every call; neither changes after construction.
        self._host = api_client.configuration.host.rstrip("/")
        self._timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
        self._auth_cache: tuple[float, dict[str, str]] | None = None
        cfg = api_client.configuration
        #: Whether the coroutine calls run on the event loop (aiohttp); False with a proxy configured,
        #: which aiohttp does not follow as urllib3 does: they then run the synchronous call in a thread.
        self.async_native = not getattr(cfg, "proxy", None)
        self._aio = AsyncTransport(self) if self.async_native else None

    # -- construction ------------------------------------------------------------------------------

    @staticmethod
    def _tune(cfg: k8s.Configuration, pool_size: int) -> None:
        cfg.connection_pool_maxsize = pool_size
        # Retries are ours (tenacity); urllib3's own would multiply them and hide 5xx answers.
        cfg.retries = urllib3.Retry(total=0, connect=0, read=0, redirect=0, status=0, raise_on_redirect=False)

    @classmethod
    def from_kubeconfig(
        cls, path: str | None, *, context: str | None = None, pool_size: int = 32, **options: Any
    ) -> KubeClient:
        """Build from a kubeconfig file, or from the in-cluster service account when `path` is None.

        Raises ConfigError-like `InvalidRequest` when the file cannot be loaded.
        """
        cfg = k8s.Configuration()
        try:
            if path is None:
                k8s_config.load_incluster_config(client_configuration=cfg)
            else:
                k8s_config.load_kube_config(
                    config_file=path, context=context, client_configuration=cfg, persist_config=False
                )
        except (k8s_config.ConfigException, OSError) as e:
            where = f"kubeconfig {path!r}" if path else "in-cluster config"
            raise InvalidRequest(f"{where}: {e}") from None
        except (yaml.YAMLError, TypeError, ValueError, KeyError, AttributeError) as e:
            # The kubernetes loader indexes the parsed YAML without checking its shape, so a file
            # that is not a kubeconfig (plain text, a list, broken YAML) surfaces as these.
            where = f"kubeconfig {path!r}" if path else "in-cluster config"
            raise InvalidRequest(f"{where}: not a kubeconfig ({type(e).__name__}: {e})") from None
        cls._tune(cfg, pool_size)
        return cls(k8s.ApiClient(cfg), **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> KubeClient:
        """Build from the pod's service account (``KUBERNETES_SERVICE_HOST`` and the mounted token)."""
        return cls.from_kubeconfig(None, **options)

    def close(self) -> None:
        """Close the connection pool (the event loop's session: `aclose`)."""
        try:
            self.api_client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    async def aclose(self) -> None:
        """Close the aiohttp session of the running loop, then the synchronous pool."""
        if self._aio is not None:
            await self._aio.close()
        self.close()

    # -- low level ---------------------------------------------------------------------------------

    def _method(
        self, res: Res, verb: str, *, all_namespaces: bool = False, sub: str = ""
    ) -> Callable[..., Any]:
        api = self._apis[res.api]
        if all_namespaces and res.namespaced:
            name = f"{verb}_{res.singular}_for_all_namespaces"
        elif res.namespaced:
            name = f"{verb}_namespaced_{res.singular}"
        else:
            name = f"{verb}_{res.singular}"
        if sub:
            name += f"_{sub}"
        return getattr(api, name)

    def _call(
        self, what: str, fn: Callable[..., Any], *args: Any, retry_conflict: bool = False, **kwargs: Any
    ) -> Any:
        """Run one API call with rate limiting and retries; returns the parsed JSON body (or None)."""
        kwargs.setdefault("_request_timeout", (self.timeout_s, self.timeout_s))

        def attempt() -> Any:
            if self._limiter is not None:
                self._limiter.acquire()
            try:
                resp = fn(*args, _preload_content=False, **kwargs)
            except ApiException as e:
                raise classify(e, what, retry_conflict) from None
            except TRANSPORT_ERRORS as e:
                raise transport_error(what, e) from None
            try:
                data = resp.data
            finally:
                resp.release_conn()
            return orjson.loads(data) if data else None

        return self._retrying(attempt)

    def _send(self, req: _Req) -> Any:
        return self._request(
            req.what, req.method, req.path, req.body, content_type=req.content_type,
            retry_conflict=req.retry_conflict,
        )  # fmt: skip

    async def _asend(self, req: _Req) -> Any:
        """`_send` from the event loop: the aiohttp transport, or the synchronous call in a thread."""
        if self._aio is None:
            return await asyncio.to_thread(self._send, req)
        return await self._aio.request(
            req.what, req.method, req.path, req.body, content_type=req.content_type,
            retry_conflict=req.retry_conflict,
        )  # fmt: skip

    def _request(
        self, what: str, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
        retry_conflict: bool = False,
    ) -> Any:  # fmt: skip
        """The hot calls (get, create, patch, Binding) straight through the client's urllib3 pool.

        Same wire request, auth, TLS, proxy, error mapping and retries as `_call`, without the
        generated method's per-call work (pydantic argument validation, model sanitisation, parameter
        serialisation, the host and proxy look-up): about half of the client CPU of a small call.
        `path` starts with ``/api`` or ``/apis``; returns the parsed JSON body (or None).
        """
        api = self.api_client
        raw = None if body is None else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)

        def attempt() -> Any:
            if self._limiter is not None:
                self._limiter.acquire()
            headers = {**self._auth_headers(), "Accept": "application/json"}
            if raw is not None:
                headers["Content-Type"] = content_type
            try:
                resp = api.rest_client.pool_manager.request(
                    method, self._host + path, body=raw, headers=headers, timeout=self._timeout,
                    preload_content=False,
                )  # fmt: skip
                try:
                    data = resp.data
                finally:
                    resp.release_conn()
            except TRANSPORT_ERRORS as e:
                raise transport_error(what, e) from None
            if not 200 <= resp.status < 300:
                if resp.status == 401:
                    self._auth_cache = None  # a rotated token: read it afresh next time
                exc = ApiException(
                    status=resp.status, reason=resp.reason, body=data.decode("utf-8", "replace")
                )
                exc.headers = resp.headers
                raise classify(exc, what, retry_conflict)
            return orjson.loads(data) if data else None

        return self._retrying(attempt)

    def _auth_headers(self) -> dict[str, str]:
        """Default headers plus the bearer token, rebuilt at most every `AUTH_REFRESH_S` seconds.

        The client's token hook re-reads the kubeconfig credentials and re-assigns the whole
        configuration (an environment proxy scan included) on every call; tokens rotate on a scale
        of minutes (client-go re-reads a token file every minute), so once a minute is enough.
        """
        now = time.monotonic()
        cached = self._auth_cache
        if cached is not None and now - cached[0] < AUTH_REFRESH_S:
            return cached[1]
        headers = dict(self.api_client.default_headers)
        self.api_client.update_params_for_auth(headers, [], ["BearerToken"], "", "GET", None)
        self._auth_cache = (now, headers)
        return headers

    def _path(self, res: Res, name: str = "", namespace: str | None = None, sub: str = "") -> str:
        base = "/api/v1" if res.api == "core" else f"/apis/{res.api_version}"
        if res.namespaced:
            base += f"/namespaces/{quote(namespace or 'default', safe='')}"
        path = f"{base}/{res.plural}"
        if name:
            path += "/" + quote(name, safe="")
        return path + (f"/{sub}" if sub else "")

    def _retrying(self, attempt: Callable[[], Any]) -> Any:
        # Read at call time: tests and the CLI tune these attributes after construction.
        return call_with_retries(
            attempt, retries=self.retries, initial_wait_s=self.retry_initial_wait_s,
            max_wait_s=self.retry_max_wait_s,
        )  # fmt: skip

    # -- generic operations ------------------------------------------------------------------------

    def _get_req(self, resource: str, name: str, namespace: str | None) -> _Req:
        res = resource_of(resource)
        return _Req(f"get {resource} {ref(namespace, name, res)}", "GET", self._path(res, name, namespace))

    def get(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """GET one object; None when it does not exist (HTTP 404)."""
        try:
            return self._send(self._get_req(resource, name, namespace))
        except NotFound:
            return None

    async def aget(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """`get` as a coroutine on the running loop."""
        try:
            return await self._asend(self._get_req(resource, name, namespace))
        except NotFound:
            return None

    def _list_method(
        self, res: Any, namespace: str | None, field_selector: str | None, label_selector: str | None
    ) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        """The client's list function for `res` (namespaced or all namespaces), its positional
        arguments and the selector keyword arguments; shared by list and watch."""
        kwargs: dict[str, Any] = {}
        if field_selector:
            kwargs["field_selector"] = field_selector
        if label_selector:
            kwargs["label_selector"] = label_selector
        if res.namespaced and namespace is not None:
            return self._method(res, "list"), (namespace,), kwargs
        return self._method(res, "list", all_namespaces=True), (), kwargs

    def list_with_version(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """LIST (all namespaces when `namespace` is None): ``(items, list resourceVersion)``.

        Items are as the server sends them: without ``kind``/``apiVersion``.
        """
        res = resource_of(resource)
        fn, args, kwargs = self._list_method(res, namespace, field_selector, label_selector)
        body = self._call(f"list {resource}", fn, *args, **kwargs) or {}
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion", ""))

    def list(
        self,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """LIST; see `list_with_version`."""
        items, _ = self.list_with_version(
            resource, namespace=namespace, field_selector=field_selector, label_selector=label_selector
        )
        return items

    def _create_req(self, resource: str, obj: Mapping[str, Any], namespace: str | None) -> _Req:
        res = resource_of(resource)
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        ns = namespace or meta_of(obj).get("namespace") or "default"
        what = f"create {resource} {ref(ns, meta_of(obj).get('name') or meta_of(obj).get('generateName', ''), res)}"
        return _Req(what, "POST", self._path(res, namespace=ns), body)

    def create(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object; raises Conflict when it already exists, InvalidRequest when invalid."""
        return self._send(self._create_req(resource, obj, namespace))

    async def acreate(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """`create` as a coroutine on the running loop."""
        return await self._asend(self._create_req(resource, obj, namespace))

    def patch(
        self,
        resource: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
        retry_conflict: bool | None = None,
    ) -> dict[str, Any]:
        """PATCH an object: `patch_type` "merge" (RFC 7386), "strategic" or "json" (RFC 6902 list).

        A 409 is retried unless the patch names ``metadata.resourceVersion`` or ``metadata.uid`` (then
        it is the caller's precondition and raises Conflict) or is a JSON patch (its ``test`` ops are).
        Raises NotFound, InvalidRequest, ApiError.
        """
        return self._send(
            self._patch_req(resource, name, patch, namespace, patch_type, subresource, retry_conflict)
        )

    async def apatch(
        self,
        resource: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
        retry_conflict: bool | None = None,
    ) -> dict[str, Any]:
        """`patch` as a coroutine on the running loop."""
        return await self._asend(
            self._patch_req(resource, name, patch, namespace, patch_type, subresource, retry_conflict)
        )

    def _patch_req(
        self, resource: str, name: str, patch: Any, namespace: str | None, patch_type: str,
        subresource: str | None, retry_conflict: bool | None,
    ) -> _Req:  # fmt: skip
        res = resource_of(resource)
        try:
            content_type = _PATCH_TYPES[patch_type]
        except KeyError:
            raise InvalidRequest(f"patch_type {patch_type!r}: want one of {sorted(_PATCH_TYPES)}") from None
        if retry_conflict is None:
            meta = (patch.get("metadata") or {}) if isinstance(patch, dict) else {}
            has_rv = bool(meta.get("resourceVersion") or meta.get("uid"))
            retry_conflict = patch_type != "json" and not has_rv
        what = f"patch {resource}{'/' + subresource if subresource else ''} {ref(namespace, name, res)}"
        return _Req(
            what, "PATCH", self._path(res, name, namespace, subresource or ""), patch, content_type, retry_conflict
        )

    def replace(
        self, resource: str, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        """PUT an object (its ``metadata.resourceVersion`` is the precondition); Conflict on a stale one."""
        res = resource_of(resource)
        meta = meta_of(obj)
        name, ns = meta.get("name", ""), meta.get("namespace") or "default"
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        args = (name, ns, body) if res.namespaced else (name, body)
        fn = self._method(res, "replace", sub=subresource or "")
        return self._call(f"update {resource} {ref(ns, name, res)}", fn, *args)

    def delete(
        self,
        resource: str,
        name: str,
        *,
        namespace: str | None = None,
        grace_period_s: int | None = None,
        uid: str | None = None,
    ) -> bool:
        """DELETE an object; False when it was already gone. `uid`: only delete this incarnation."""
        res = resource_of(resource)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        if uid:
            body["preconditions"] = {"uid": uid}
        args = (name, namespace or "default") if res.namespaced else (name,)
        try:
            self._call(
                f"delete {resource} {ref(namespace, name, res)}",
                self._method(res, "delete"),
                *args,
                body=body,
            )
        except NotFound:
            return False
        return True

    def watch(
        self,
        resource: str,
        *,
        resource_version: str,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        timeout_s: float = 300.0,
        bookmarks: bool = True,
    ) -> WatchStream:
        """Open a watch from `resource_version` (server-side timeout `timeout_s`). One attempt, no retry.

        Raises ResourceExpired (410), ApiError or the mapped error of the opening request.
        """
        res = resource_of(resource)
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": resource_version,
            "timeout_seconds": max(1, int(timeout_s)),
            "allow_watch_bookmarks": bookmarks,
            "_preload_content": False,
            # The read timeout must outlast the server's own timeout plus a bookmark's delay.
            "_request_timeout": (self.timeout_s, timeout_s + 30.0),
        }
        fn, args, selectors = self._list_method(res, namespace, field_selector, label_selector)
        kwargs.update(selectors)
        what = f"watch {resource}"
        if self._limiter is not None:
            self._limiter.acquire()
        try:
            resp = fn(*args, **kwargs)
        except ApiException as e:
            raise map_api_exception(e, what) from None
        except TRANSPORT_ERRORS as e:
            raise ApiError(f"{what}: cannot reach the API server: {e}", reason="Transport") from None
        return WatchStream(resp, what)

    # -- nodes -------------------------------------------------------------------------------------

    def get_node(self, name: str) -> dict[str, Any] | None:
        """The Node, or None when it does not exist (HTTP 404)."""
        return self.get("nodes", name)

    def list_nodes(
        self, *, label_selector: str | None = None, field_selector: str | None = None
    ) -> list[dict[str, Any]]:
        """All Nodes matching the selectors."""
        return self.list("nodes", label_selector=label_selector, field_selector=field_selector)

    def patch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """Merge-patch node annotations (None removes a key); returns the patched Node.

        With `resource_version` the patch applies only to that version of the node: a newer one raises
        Conflict (no retry; the caller re-reads). Raises NotFound when the node is gone.
        """
        return self.patch("nodes", name, _node_annotations_patch(annotations, resource_version))

    async def apatch_node_annotations(
        self, name: str, annotations: Mapping[str, str | None], *, resource_version: str | None = None
    ) -> dict[str, Any]:
        """`patch_node_annotations` as a coroutine on the running loop."""
        return await self.apatch("nodes", name, _node_annotations_patch(annotations, resource_version))

    def patch_node_labels(self, name: str, labels: Mapping[str, str | None]) -> dict[str, Any]:
        """Merge-patch node labels (None removes a key); returns the patched Node."""
        return self.patch("nodes", name, {"metadata": {"labels": dict(labels)}})

    # -- pods --------------------------------------------------------------------------------------

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod, or None when it does not exist (HTTP 404)."""
        return self.get("pods", name, namespace=namespace)

    def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Pods of one namespace or all; e.g. ``field_selector="spec.nodeName=node1"``."""
        return self.list(
            "pods", namespace=namespace, field_selector=field_selector, label_selector=label_selector
        )

    def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
    ) -> dict[str, Any]:
        """Merge-patch pod annotations and labels (None removes a key); returns the patched Pod.

        `resource_version` makes it conditional (Conflict when stale); `uid` makes it apply only to
        that incarnation of the pod (Conflict when the pod was re-created). Raises NotFound.
        """
        patch = _pod_metadata_patch(annotations, labels, resource_version, uid)
        return self.patch("pods", name, patch, namespace=namespace, retry_conflict=not (resource_version or uid))

    async def apatch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        annotations: Mapping[str, str | None] | None = None,
        labels: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
        uid: str | None = None,
    ) -> dict[str, Any]:
        """`patch_pod_metadata` as a coroutine on the running loop."""
        patch = _pod_metadata_patch(annotations, labels, resource_version, uid)
        return await self.apatch(
            "pods", name, patch, namespace=namespace, retry_conflict=not (resource_version or uid)
        )

    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        """Merge-patch ``status`` through the status subresource (the only way to change it)."""
        return self.patch("pods", name, {"status": dict(status)}, namespace=namespace, subresource="status")

    def create_pod(self, pod: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Create a Pod; returns it as stored (Conflict when the name is taken)."""
        return self.create("pods", pod, namespace=namespace)

    def delete_pod(
        self, namespace: str, name: str, *, grace_period_s: int | None = None, uid: str | None = None
    ) -> bool:
        """Delete a Pod; False when it was already gone."""
        return self.delete("pods", name, namespace=namespace, grace_period_s=grace_period_s, uid=uid)

    def bind_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """Create the pod's Binding to `node` (what kube-scheduler's default binder does).

        `annotations` ride in the Binding's ``metadata.annotations``: the API server copies them onto
        the pod in the same write that sets ``spec.nodeName`` (k8s pkg/registry/core/pod/storage
        ``setPodHostAndAnnotations``), so the pod is never seen bound without them, nor with them
        but unbound, and one API call is saved.

        Idempotent: if the pod is already bound to `node` (e.g. our earlier try timed out after the
        server applied it) this succeeds, and any of `annotations` the pod lacks are then patched on.
        Raises NotFound (pod gone), Conflict (bound elsewhere, being deleted, or a different pod
        `uid`), ApiError.
        """
        try:
            # A raw request: the server answers a Status that the generated client cannot deserialise
            # as V1Binding (kubernetes-client/python#547).
            self._send(self._binding_req(namespace, name, uid, node, annotations))
        except Conflict:
            missing = _bound_already(self.get_pod(namespace, name), node, uid, annotations)
            if missing is None:
                raise
            if missing:
                self.patch_pod_metadata(namespace, name, annotations=missing, uid=uid)

    async def abind_pod(
        self,
        namespace: str,
        name: str,
        *,
        uid: str | None,
        node: str,
        annotations: Mapping[str, str] | None = None,
    ) -> None:
        """`bind_pod` as a coroutine on the running loop (same idempotence and errors)."""
        try:
            await self._asend(self._binding_req(namespace, name, uid, node, annotations))
        except Conflict:
            pod = await self.aget("pods", name, namespace=namespace)
            missing = _bound_already(pod, node, uid, annotations)
            if missing is None:
                raise
            if missing:
                await self.apatch_pod_metadata(namespace, name, annotations=missing, uid=uid)

    def _binding_req(
        self, namespace: str, name: str, uid: str | None, node: str, annotations: Mapping[str, str] | None
    ) -> _Req:
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        if annotations:
            meta["annotations"] = dict(annotations)
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        path = self._path(RESOURCES["pods"], name, namespace, "binding")
        return _Req(f"bind pod {namespace}/{name} to node {node}", "POST", path, body)

    # -- events ------------------------------------------------------------------------------------

    def create_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        kind: str | None = None,
        component: str = "hami-scheduler",
        host: str | None = None,
        action: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any] | None:
        """Record a core/v1 Event about `involved` (a Pod or Node dict, as read from the API).

        `reason` is a CamelCase word (``BindingFailed``); `message` says what happened and what to do,
        cut to 1024 characters. `type` is "Normal" or "Warning". `kind` defaults to the object's kind,
        else Pod for namespaced and Node for cluster-scoped objects. The same (object, reason, message)
        within `event_dedup_s` bumps ``count`` on the existing Event, as client-go's correlator does.
        Events are best effort: returns None instead of raising when the API refuses them.
        """
        return record_event(
            self, self._event_log, involved, reason=reason, message=message, type=type, kind=kind,
            component=component, host=host, action=action, namespace=namespace,
        )  # fmt: skip

    async def acreate_event(
        self,
        involved: Mapping[str, Any],
        *,
        reason: str,
        message: str,
        type: str = "Normal",
        kind: str | None = None,
        component: str = "hami-scheduler",
        host: str | None = None,
        action: str | None = None,
        namespace: str | None = None,
    ) -> dict[str, Any] | None:
        """`create_event` as a coroutine on the running loop (same repeat counting, same log)."""
        return await arecord_event(
            self, self._event_log, involved, reason=reason, message=message, type=type, kind=kind,
            component=component, host=host, action=action, namespace=namespace,
        )  # fmt: skip

    # -- quotas, namespaces ------------------------------------------------------------------------

    def list_resource_quotas(self, *, namespace: str | None = None) -> list[dict[str, Any]]:
        """ResourceQuotas of one namespace or all."""
        return self.list("resourcequotas", namespace=namespace)

    # -- leases ------------------------------------------------------------------------------------

    def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Lease, or None when it does not exist (HTTP 404)."""
        return self.get("leases", name, namespace=namespace)

    def create_lease(self, namespace: str, name: str, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Create a Lease; raises Conflict when another replica created it first."""
        return self.create("leases", {"metadata": {"name": name, "namespace": namespace}, "spec": dict(spec)})

    def update_lease(self, lease: Mapping[str, Any]) -> dict[str, Any]:
        """PUT a Lease read earlier (its resourceVersion is the precondition); Conflict when stale."""
        return self.replace("leases", lease)


def _node_annotations_patch(annotations: Mapping[str, str | None], resource_version: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"annotations": dict(annotations)}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def _pod_metadata_patch(
    annotations: Mapping[str, str | None] | None,
    labels: Mapping[str, str | None] | None,
    resource_version: str | None,
    uid: str | None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if annotations:
        meta["annotations"] = dict(annotations)
    if labels:
        meta["labels"] = dict(labels)
    if resource_version:
        meta["resourceVersion"] = resource_version
    if uid:
        meta["uid"] = uid
    return {"metadata": meta}


def _bound_already(
    pod: Mapping[str, Any] | None, node: str, uid: str | None, annotations: Mapping[str, str] | None
) -> dict[str, str] | None:
    """After a Binding's 409: None when `pod` is not bound to `node` (the conflict stands), else the
    `annotations` it still lacks (our earlier try was applied; {} when nothing is missing)."""
    if pod is None or (pod.get("spec") or {}).get("nodeName") != node or (uid and meta_of(pod).get("uid") != uid):
        return None
    have = meta_of(pod).get("annotations") or {}
    return {k: v for k, v in (annotations or {}).items() if k not in have}
