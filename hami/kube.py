"""The project's only door to the Kubernetes API server (the official `kubernetes` client).

Why one module: every server here (extender, device plugin, webhook) needs the same few calls, the
same retry policy and the same error mapping, and the client library has sharp edges that should be
handled once:

* Objects are plain dicts in the API's JSON form, never the generated model classes: every call uses
  ``_preload_content=False`` and ``json.loads`` (much faster for thousands of pods, and it avoids the
  client's known failure to deserialise the ``Status`` a successful Binding returns as a ``V1Binding``,
  kubernetes-client/python#547).
* get / create / patch / Binding (the calls a scheduler makes per pod) go straight to the client's
  ``ApiClient.rest_client`` urllib3 pool with the same URL, headers and auth (`KubeClient._request`);
  the generated methods' argument validation, model sanitisation and per-call host/proxy/token
  look-ups were half of their CPU. List, watch, replace and delete still use the generated methods.
* Retries (`tenacity`) on 429 (honouring ``Retry-After``), 5xx and transport errors; on 409 only where
  the call does not carry a precondition, so a re-read on the server side is what the caller wants.
  Never on 400/403/404/422: those are answers, not accidents.
* Errors map to `hami.errors`: 404 -> `NotFound` (getters return None instead), 409 -> `Conflict`,
  400/422 -> `InvalidRequest`, anything else that is left after the retries -> `ApiError`. Each
  carries ``status`` and ``reason`` attributes and the server's message.

Also here: `Reflector` (list + watch of one resource in a thread, relist on ``410 Gone``, reconnect with
backoff, bookmarks) and `LeaderElector` (a ``coordination.k8s.io/v1`` Lease, client-go semantics).

Methods are synchronous and thread-safe; asyncio servers call them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import tenacity
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hami.errors import Conflict, HamiError, InvalidRequest, NotFound

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_PATCH_TYPES = {"merge": MERGE_PATCH, "strategic": STRATEGIC_MERGE_PATCH, "json": JSON_PATCH}

# Seconds a bearer token read through the client's refresh hook is reused by the hot calls.
AUTH_REFRESH_S = 60.0

# Event messages longer than this are cut (events.k8s.io/v1 rejects notes over 1 KiB).
EVENT_MESSAGE_MAX = 1024


class ApiError(HamiError):
    """An API server error that is neither NotFound, Conflict nor InvalidRequest (5xx, 429, 403, ...)."""

    def __init__(self, message: str, *, status: int | None = None, reason: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class ResourceExpired(ApiError):
    """``410 Gone``/``Expired``: the resourceVersion is older than the server's history; relist."""


# ---------------------------------------------------------------------------------------------------
# Resources


@dataclass(frozen=True, slots=True)
class _Res:
    plural: str
    singular: str  # snake case, as in the client's method names
    namespaced: bool
    api: str  # "core" or "coordination"
    kind: str
    api_version: str


RESOURCES: dict[str, _Res] = {
    r.plural: r
    for r in (
        _Res("pods", "pod", True, "core", "Pod", "v1"),
        _Res("nodes", "node", False, "core", "Node", "v1"),
        _Res("events", "event", True, "core", "Event", "v1"),
        _Res("resourcequotas", "resource_quota", True, "core", "ResourceQuota", "v1"),
        _Res("namespaces", "namespace", False, "core", "Namespace", "v1"),
        _Res("leases", "lease", True, "coordination", "Lease", "coordination.k8s.io/v1"),
    )
}


def _res(resource: str) -> _Res:
    try:
        return RESOURCES[resource]
    except KeyError:
        raise InvalidRequest(f"resource {resource!r}: want one of {sorted(RESOURCES)}") from None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def now_micro() -> str:
    """The current time as a Kubernetes ``MicroTime`` (``2026-11-29T12:00:00.123456Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_rfc3339() -> str:
    """The current time as a Kubernetes ``Time`` (``2026-11-29T12:00:00Z``)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---------------------------------------------------------------------------------------------------
# Errors and retries


class _Retryable(Exception):
    """Internal: a failure worth another try; `error` is what the caller gets if tries run out."""

    def __init__(self, error: HamiError, retry_after_s: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after_s = retry_after_s


def _status_of(exc: ApiException) -> tuple[str, str]:
    """(reason, message) from an ApiException's Status body, falling back to the HTTP reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (ValueError, TypeError):
        body = {}
    if not isinstance(body, dict):
        body = {}
    return str(body.get("reason") or exc.reason or ""), str(
        body.get("message") or exc.reason or f"HTTP {exc.status}"
    )


def _map_api_exception(exc: ApiException, what: str) -> HamiError:
    reason, message = _status_of(exc)
    status = exc.status
    text = f"{what}: {message}"
    err: HamiError
    if status == 404:
        err = NotFound(text)
    elif status == 409:
        err = Conflict(text)
    elif status in (400, 422):
        err = InvalidRequest(text)
    elif status == 410:
        err = ResourceExpired(text, status=status, reason=reason)
    else:
        err = ApiError(text, status=status, reason=reason)
    err.status = status  # type: ignore[attr-defined]
    err.reason = reason  # type: ignore[attr-defined]
    return err


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _classify(exc: ApiException, what: str, retry_conflict: bool) -> Exception:
    """The mapped error, wrapped in `_Retryable` for 429, 5xx and (when `retry_conflict`) 409."""
    err = _map_api_exception(exc, what)
    status = exc.status or 0
    if status == 429 or status >= 500 or (status == 409 and retry_conflict):
        return _Retryable(err, _retry_after(exc))
    return err


_TRANSPORT_ERRORS = (
    urllib3.exceptions.HTTPError,  # MaxRetryError, ProtocolError, ReadTimeoutError, NewConnectionError, ...
    ConnectionError,
    TimeoutError,
)


class _RateLimiter:
    """Token bucket like client-go's: `qps` tokens per second, at most `burst` saved up."""

    def __init__(self, qps: float, burst: int) -> None:
        self.qps = qps
        self.burst = max(1, burst)
        self._tokens = float(self.burst)
        self._last = time.monotonic()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.burst, self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1
            wait = -self._tokens / self.qps if self._tokens < 0 else 0.0
        if wait > 0:
            time.sleep(wait)


# ---------------------------------------------------------------------------------------------------
# Watch stream


class WatchStream:
    """One open watch: iterate ``(type, object)`` pairs; `close()` from any thread ends the iteration.

    Types are ``ADDED``, ``MODIFIED``, ``DELETED`` and ``BOOKMARK`` (object has only
    ``metadata.resourceVersion``). An ``ERROR`` event raises `ResourceExpired` (410) or `ApiError`.
    """

    def __init__(self, response: Any, what: str) -> None:
        self._resp = response
        self._what = what
        self._closed = False

    def __iter__(self) -> Iterator[tuple[str, dict[str, Any]]]:
        buffer = b""
        try:
            for chunk in self._resp.stream(amt=None, decode_content=False):
                if self._closed:
                    return
                buffer += chunk
                while True:
                    nl = buffer.find(b"\n")
                    if nl < 0:
                        break
                    line, buffer = buffer[:nl], buffer[nl + 1 :]
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    type_ = event.get("type")
                    obj = event.get("object") or {}
                    if type_ == "ERROR":
                        code = obj.get("code")
                        message = f"{self._what}: {obj.get('message', 'watch error')}"
                        if code == 410:
                            raise ResourceExpired(message, status=410, reason=obj.get("reason"))
                        raise ApiError(message, status=code, reason=obj.get("reason"))
                    yield type_, obj
        except _TRANSPORT_ERRORS:
            if not self._closed:
                raise
        finally:
            self._release()

    def close(self) -> None:
        """Stop the stream; safe from another thread while one is blocked reading it."""
        self._closed = True
        try:
            if hasattr(self._resp, "shutdown"):
                self._resp.shutdown()  # urllib3 >= 2.3: unblocks a reader stuck in recv
            else:
                sock = getattr(getattr(self._resp, "connection", None), "sock", None)
                if sock is not None:
                    import socket

                    sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _release(self) -> None:
        try:
            self._resp.close()
            self._resp.release_conn()
        except Exception:  # noqa: BLE001 - best effort on a dead connection
            pass


# ---------------------------------------------------------------------------------------------------
# The client


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
        self.timeout_s = timeout_s
        self.retries = retries
        self.retry_initial_wait_s = retry_initial_wait_s
        self.retry_max_wait_s = retry_max_wait_s
        self._limiter = _RateLimiter(qps, burst) if qps else None
        self.event_dedup_s = event_dedup_s
        self._events: OrderedDict[tuple[str, ...], tuple[str, str, int, float]] = OrderedDict()
        self._events_lock = threading.Lock()
        # Read once: the generated client recomputes the host (and scans the environment for proxies)
        # on every call; neither changes after construction.
        self._host = api_client.configuration.host.rstrip("/")
        self._timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
        self._auth_cache: tuple[float, dict[str, str]] | None = None

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
        cls._tune(cfg, pool_size)
        return cls(k8s.ApiClient(cfg), **options)

    @classmethod
    def in_cluster(cls, **options: Any) -> KubeClient:
        """Build from the pod's service account (``KUBERNETES_SERVICE_HOST`` and the mounted token)."""
        return cls.from_kubeconfig(None, **options)

    def close(self) -> None:
        """Close the connection pool."""
        try:
            self.api_client.close()
        except Exception:  # noqa: BLE001 - closing is best effort
            pass

    # -- low level ---------------------------------------------------------------------------------

    def _method(
        self, res: _Res, verb: str, *, all_namespaces: bool = False, sub: str = ""
    ) -> Callable[..., Any]:
        api = self.core if res.api == "core" else self.coordination
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
                raise _classify(e, what, retry_conflict) from None
            except _TRANSPORT_ERRORS as e:
                raise _Retryable(
                    ApiError(f"{what}: cannot reach the API server: {e}", reason="Transport")
                ) from None
            try:
                data = resp.data
            finally:
                resp.release_conn()
            return json.loads(data) if data else None

        return self._retrying(attempt)

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
        raw = None if body is None else json.dumps(body, separators=(",", ":")).encode()

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
            except _TRANSPORT_ERRORS as e:
                raise _Retryable(
                    ApiError(f"{what}: cannot reach the API server: {e}", reason="Transport")
                ) from None
            if not 200 <= resp.status < 300:
                if resp.status == 401:
                    self._auth_cache = None  # a rotated token: read it afresh next time
                exc = ApiException(
                    status=resp.status, reason=resp.reason, body=data.decode("utf-8", "replace")
                )
                exc.headers = resp.headers
                raise _classify(exc, what, retry_conflict)
            return json.loads(data) if data else None

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

    def _path(self, res: _Res, name: str = "", namespace: str | None = None, sub: str = "") -> str:
        base = "/api/v1" if res.api == "core" else "/apis/coordination.k8s.io/v1"
        if res.namespaced:
            base += f"/namespaces/{quote(namespace or 'default', safe='')}"
        path = f"{base}/{res.plural}"
        if name:
            path += "/" + quote(name, safe="")
        return path + (f"/{sub}" if sub else "")

    def _retrying(self, attempt: Callable[[], Any]) -> Any:
        # The first try runs bare: tenacity's bookkeeping is only paid when something failed.
        try:
            return attempt()
        except _Retryable as e:
            if self.retries < 1:
                raise e.error from None
            first = e

        def wait(state: tenacity.RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            return self._backoff(state.attempt_number + 1, exc)

        time.sleep(self._backoff(1, first))
        try:
            for tried in tenacity.Retrying(
                retry=tenacity.retry_if_exception_type(_Retryable),
                stop=tenacity.stop_after_attempt(self.retries),
                wait=wait,
                reraise=True,
            ):
                with tried:
                    return attempt()
        except _Retryable as e:
            raise e.error from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _backoff(self, failures: int, exc: BaseException | None) -> float:
        """Seconds to wait after the `failures`-th failed try: exponential with jitter, Retry-After honoured."""
        backoff = min(self.retry_max_wait_s, self.retry_initial_wait_s * (2 ** (failures - 1)))
        backoff *= 1 + random.random() * 0.5
        if isinstance(exc, _Retryable) and exc.retry_after_s is not None:
            backoff = max(backoff, exc.retry_after_s)
        return min(backoff, self.retry_max_wait_s)

    # -- generic operations ------------------------------------------------------------------------

    def get(self, resource: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        """GET one object; None when it does not exist (HTTP 404)."""
        res = _res(resource)
        try:
            return self._request(
                f"get {resource} {_ref(namespace, name, res)}", "GET", self._path(res, name, namespace)
            )
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
        res = _res(resource)
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

    def create(
        self, resource: str, obj: Mapping[str, Any], *, namespace: str | None = None
    ) -> dict[str, Any]:
        """POST a new object; raises Conflict when it already exists, InvalidRequest when invalid."""
        res = _res(resource)
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        ns = namespace or _meta(obj).get("namespace") or "default"
        what = (
            f"create {resource} {_ref(ns, _meta(obj).get('name') or _meta(obj).get('generateName', ''), res)}"
        )
        return self._request(what, "POST", self._path(res, namespace=ns), body)

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
        res = _res(resource)
        try:
            content_type = _PATCH_TYPES[patch_type]
        except KeyError:
            raise InvalidRequest(f"patch_type {patch_type!r}: want one of {sorted(_PATCH_TYPES)}") from None
        if retry_conflict is None:
            meta = (patch.get("metadata") or {}) if isinstance(patch, dict) else {}
            has_rv = bool(meta.get("resourceVersion") or meta.get("uid"))
            retry_conflict = patch_type != "json" and not has_rv
        what = f"patch {resource}{'/' + subresource if subresource else ''} {_ref(namespace, name, res)}"
        return self._request(
            what, "PATCH", self._path(res, name, namespace, subresource or ""), patch,
            content_type=content_type, retry_conflict=retry_conflict,
        )  # fmt: skip

    def replace(
        self, resource: str, obj: Mapping[str, Any], *, subresource: str | None = None
    ) -> dict[str, Any]:
        """PUT an object (its ``metadata.resourceVersion`` is the precondition); Conflict on a stale one."""
        res = _res(resource)
        meta = _meta(obj)
        name, ns = meta.get("name", ""), meta.get("namespace") or "default"
        body = {"apiVersion": res.api_version, "kind": res.kind, **obj}
        args = (name, ns, body) if res.namespaced else (name, body)
        fn = self._method(res, "replace", sub=subresource or "")
        return self._call(f"update {resource} {_ref(ns, name, res)}", fn, *args)

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
        res = _res(resource)
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions"}
        if grace_period_s is not None:
            body["gracePeriodSeconds"] = grace_period_s
        if uid:
            body["preconditions"] = {"uid": uid}
        args = (name, namespace or "default") if res.namespaced else (name,)
        try:
            self._call(
                f"delete {resource} {_ref(namespace, name, res)}",
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
        res = _res(resource)
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
            raise _map_api_exception(e, what) from None
        except _TRANSPORT_ERRORS as e:
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
        meta: dict[str, Any] = {"annotations": dict(annotations)}
        if resource_version:
            meta["resourceVersion"] = resource_version
        return self.patch("nodes", name, {"metadata": meta})

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
        meta: dict[str, Any] = {}
        if annotations:
            meta["annotations"] = dict(annotations)
        if labels:
            meta["labels"] = dict(labels)
        if resource_version:
            meta["resourceVersion"] = resource_version
        if uid:
            meta["uid"] = uid
        return self.patch(
            "pods",
            name,
            {"metadata": meta},
            namespace=namespace,
            retry_conflict=not (resource_version or uid),
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
        what = f"bind pod {namespace}/{name} to node {node}"
        res = RESOURCES["pods"]
        try:
            # A raw request: the server answers a Status that the generated client cannot deserialise
            # as V1Binding (kubernetes-client/python#547).
            self._request(what, "POST", self._path(res, name, namespace, "binding"), body)
        except Conflict:
            pod = self.get_pod(namespace, name)
            if (
                pod is not None
                and (pod.get("spec") or {}).get("nodeName") == node
                and (not uid or _meta(pod).get("uid") == uid)
            ):
                have = _meta(pod).get("annotations") or {}
                missing = {k: v for k, v in (annotations or {}).items() if k not in have}
                if missing:
                    self.patch_pod_metadata(namespace, name, annotations=missing, uid=uid)
                return
            raise

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
        if type not in ("Normal", "Warning"):
            raise InvalidRequest(f"event type {type!r}: want 'Normal' or 'Warning'")
        meta = _meta(involved)
        obj_ns = meta.get("namespace") or ""
        kind = kind or involved.get("kind") or ("Pod" if obj_ns else "Node")
        ns = namespace or obj_ns or "default"
        if len(message) > EVENT_MESSAGE_MAX:
            message = message[: EVENT_MESSAGE_MAX - 3] + "..."
        now = now_rfc3339()
        key = (ns, kind, obj_ns, meta.get("name", ""), meta.get("uid", ""), reason, message, type, component)
        try:
            with self._events_lock:
                seen = self._events.get(key)
                if seen is not None and time.monotonic() - seen[3] < self.event_dedup_s:
                    self._events[key] = (seen[0], seen[1], seen[2] + 1, time.monotonic())
                    self._events.move_to_end(key)
                    name, count = seen[0], seen[2] + 1
                else:
                    name, count = "", 1
            if name:
                return self.patch(
                    "events", name, {"count": count, "lastTimestamp": now}, namespace=ns, retry_conflict=True
                )
            event: dict[str, Any] = {
                "metadata": {"name": f"{meta.get('name', 'object')}.{time.time_ns():x}", "namespace": ns},
                "involvedObject": {
                    "kind": kind,
                    "apiVersion": involved.get("apiVersion") or "v1",
                    "name": meta.get("name", ""),
                    **({"namespace": obj_ns} if obj_ns else {}),
                    **({"uid": meta["uid"]} if meta.get("uid") else {}),
                    **({"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}),
                },
                "reason": reason,
                "message": message,
                "type": type,
                "source": {"component": component, **({"host": host} if host else {})},
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
                "reportingComponent": component,
                "reportingInstance": host or "",
            }
            if action:
                event["action"] = action
            created = self.create("events", event, namespace=ns)
            with self._events_lock:
                self._events[key] = (created["metadata"]["name"], ns, 1, time.monotonic())
                while len(self._events) > 4096:
                    self._events.popitem(last=False)
            return created
        except HamiError as e:
            log.warning("event %s on %s %s/%s not recorded: %s", reason, kind, obj_ns, meta.get("name"), e)
            with self._events_lock:
                self._events.pop(key, None)
            return None

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


def _ref(namespace: str | None, name: str, res: _Res) -> str:
    return f"{namespace or 'default'}/{name}" if res.namespaced else name


def object_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """``(namespace, name)``; namespace is "" for cluster-scoped objects."""
    meta = _meta(obj)
    return meta.get("namespace") or "", meta.get("name") or ""


# ---------------------------------------------------------------------------------------------------
# Reflector


class Reflector:
    """List, then watch, one resource in a background thread, and call back on every change.

    Callbacks run on the reflector's thread, in order, and must be quick (a lock and a dict update);
    an exception in one is logged and does not stop the reflector.

    * ``on_sync(items)`` after every (re)list with the complete current list: the receiver replaces
      its state (anything absent is gone). Without `on_sync`, a relist is delivered as the
      differences instead: ``on_add`` for new, ``on_update`` for changed, ``on_delete`` for vanished.
    * ``on_add(obj)``, ``on_update(old, new)``, ``on_delete(obj)`` for watch events (`old` is the last
      state this reflector saw).

    Relists on ``410 Gone``; reconnects after errors or a dropped connection with exponential
    backoff (`backoff_initial_s` .. `backoff_max_s`) from the last resourceVersion seen (including
    bookmarks), so a reconnect does not replay history. `items()`/`get()` read the reflector's cache.
    """

    def __init__(
        self,
        client: KubeClient,
        resource: str,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        on_add: Callable[[dict[str, Any]], None] | None = None,
        on_update: Callable[[dict[str, Any], dict[str, Any]], None] | None = None,
        on_delete: Callable[[dict[str, Any]], None] | None = None,
        on_sync: Callable[[list[dict[str, Any]]], None] | None = None,
        watch_timeout_s: float = 300.0,
        backoff_initial_s: float = 0.2,
        backoff_max_s: float = 10.0,
        name: str | None = None,
    ) -> None:
        _res(resource)
        self.client = client
        self.resource = resource
        self.namespace = namespace
        self.field_selector = field_selector
        self.label_selector = label_selector
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete
        self.on_sync = on_sync
        self.watch_timeout_s = watch_timeout_s
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = backoff_max_s
        self.name = name or f"reflector-{resource}"
        self.resource_version = ""
        self.list_count = 0
        self.watch_count = 0
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}
        self._cache_lock = threading.Lock()
        self._synced = threading.Event()
        self._stop = threading.Event()
        self._stream: WatchStream | None = None
        self._thread: threading.Thread | None = None
        self._force_relist = False

    # -- control -----------------------------------------------------------------------------------

    def start(self) -> Reflector:
        """Start the background thread (once); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop and join the thread; an open watch is closed at once."""
        self._stop.set()
        stream = self._stream
        if stream is not None:
            stream.close()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def resync(self) -> None:
        """Relist now (e.g. at the start of a leadership term): `synced` is False until it is delivered."""
        self._synced.clear()
        self._force_relist = True
        stream = self._stream
        if stream is not None:
            stream.close()

    @property
    def synced(self) -> bool:
        """True once the first list has been delivered."""
        return self._synced.is_set()

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        """Block until the first list has been delivered; False on timeout."""
        return self._synced.wait(timeout_s)

    def items(self) -> list[dict[str, Any]]:
        """The objects currently known (shared dicts; do not modify)."""
        with self._cache_lock:
            return list(self._cache.values())

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """One cached object, or None."""
        with self._cache_lock:
            return self._cache.get((namespace or "", name))

    # -- loop --------------------------------------------------------------------------------------

    def _call(self, fn: Callable[..., None] | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a receiver bug must not kill the reflector
            log.exception("%s: callback %s failed", self.name, getattr(fn, "__name__", fn))

    def _relist(self) -> None:
        items, rv = self.client.list_with_version(
            self.resource,
            namespace=self.namespace,
            field_selector=self.field_selector,
            label_selector=self.label_selector,
        )
        self.list_count += 1
        fresh = {object_key(o): o for o in items}
        with self._cache_lock:
            old = self._cache
            self._cache = fresh
        if self.on_sync is not None:
            self._call(self.on_sync, items)
        else:
            for key, obj in fresh.items():
                prev = old.get(key)
                if prev is None:
                    self._call(self.on_add, obj)
                elif _meta(prev).get("resourceVersion") != _meta(obj).get("resourceVersion"):
                    self._call(self.on_update, prev, obj)
            for key, obj in old.items():
                if key not in fresh:
                    self._call(self.on_delete, obj)
        self.resource_version = rv
        self._synced.set()

    def _apply(self, type_: str, obj: dict[str, Any]) -> None:
        rv = _meta(obj).get("resourceVersion")
        if type_ == "BOOKMARK":
            if rv:
                self.resource_version = rv
            return
        key = object_key(obj)
        if type_ in ("ADDED", "MODIFIED"):
            with self._cache_lock:
                prev = self._cache.get(key)
                self._cache[key] = obj
            if prev is None:
                self._call(self.on_add, obj)
            else:
                self._call(self.on_update, prev, obj)
        elif type_ == "DELETED":
            with self._cache_lock:
                prev = self._cache.pop(key, None)
            self._call(self.on_delete, obj if obj else prev)
        if rv:
            self.resource_version = rv

    def _run(self) -> None:
        backoff = self.backoff_initial_s
        need_list = True
        while not self._stop.is_set():
            try:
                if need_list or self._force_relist:
                    self._force_relist = False
                    self._relist()
                    need_list = False
                stream = self.client.watch(
                    self.resource,
                    resource_version=self.resource_version,
                    namespace=self.namespace,
                    field_selector=self.field_selector,
                    label_selector=self.label_selector,
                    timeout_s=self.watch_timeout_s,
                )
                self.watch_count += 1
                self._stream = stream
                # stop()/resync() set their flag before looking at _stream; checking after the
                # assignment means one of the two sides always closes this stream.
                if self._stop.is_set() or self._force_relist:
                    stream.close()
                for type_, obj in stream:
                    if self._stop.is_set():
                        break
                    self._apply(type_, obj)
                    backoff = self.backoff_initial_s
                self._stream = None
                # A watch that ends normally (server timeout, clean close) is resumed at once;
                # one closed by resync() leads to the relist at the top of the loop.
            except ResourceExpired as e:
                log.info("%s: %s; relisting", self.name, e)
                need_list = True
            except Exception as e:  # noqa: BLE001 - keep reflecting whatever went wrong
                self._stream = None
                if self._stop.is_set():
                    break
                log.warning("%s: %s; retrying in %.1fs", self.name, e, backoff)
                self._stop.wait(backoff * (1 + random.random() * 0.2))
                backoff = min(self.backoff_max_s, backoff * 2)


# ---------------------------------------------------------------------------------------------------
# Leader election


class LeaderElector:
    """Leader election over a ``coordination.k8s.io/v1`` Lease with client-go's rules.

    A candidate takes the Lease when it does not exist, is released (empty holder) or has not been
    renewed for ``leaseDurationSeconds`` as measured on *this* process's clock since it last saw the
    record change (so clock skew between replicas does not matter). The leader renews every
    `retry_period_s`; if it cannot renew for `renew_deadline_s`, or sees another holder, it stops
    leading (``on_stopped_leading``) and campaigns again. `stop()` releases the Lease when
    `release_on_stop` so a standby takes over at once.
    Callbacks run on the elector's thread and must return quickly.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        release_on_stop: bool = True,
    ) -> None:
        if not lease_duration_s > renew_deadline_s > retry_period_s > 0:
            raise InvalidRequest(
                "leader election: want lease_duration_s > renew_deadline_s > retry_period_s > 0, got "
                f"{lease_duration_s} / {renew_deadline_s} / {retry_period_s}"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.release_on_stop = release_on_stop
        self.leader_identity = ""
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def wait_for_leadership(self, timeout_s: float | None = None) -> bool:
        """Block until this candidate leads; False on timeout."""
        return self._leading.wait(timeout_s)

    def start(self) -> LeaderElector:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop campaigning; releases the Lease if leading and `release_on_stop`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _sleep(self, seconds: float) -> bool:
        """Wait with client-go's jitter (up to +20%); True when stopped meanwhile."""
        return self._stop.wait(seconds * (1 + random.random() * 0.2))

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_at = time.monotonic()
            holder = spec.get("holderIdentity") or ""
            if holder != self.leader_identity:
                self.leader_identity = holder
                if holder and self.on_new_leader is not None:
                    try:
                        self.on_new_leader(holder)
                    except Exception:  # noqa: BLE001
                        log.exception("leader election: on_new_leader failed")

    def try_acquire_or_renew(self) -> bool:
        """One round: take or renew the Lease; True when this candidate holds it afterwards."""
        now = now_micro()
        duration = int(round(self.lease_duration_s))
        try:
            lease = self.client.get_lease(self.namespace, self.name)
            if lease is None:
                spec = {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                }
                created = self.client.create_lease(self.namespace, self.name, spec)
                self._observe(created.get("spec") or spec)
                return True
            spec = dict(lease.get("spec") or {})
            self._observe(spec)
            holder = spec.get("holderIdentity") or ""
            held_for = float(spec.get("leaseDurationSeconds") or duration)
            if holder and holder != self.identity and time.monotonic() < self._observed_at + held_for:
                return False
            new_spec = dict(spec)
            if holder == self.identity:
                new_spec.update(renewTime=now, leaseDurationSeconds=duration)
            else:
                new_spec.update(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=duration,
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
                )
            updated = self.client.update_lease({**lease, "spec": new_spec})
            self._observe(updated.get("spec") or new_spec)
            return True
        except HamiError as e:
            log.info("leader election %s/%s: %s", self.namespace, self.name, e)
            return False

    def release(self) -> bool:
        """Give the Lease up if held (holder emptied, duration 1 s); True when released."""
        try:
            lease = self.client.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False
            now = now_micro()
            spec = {
                **(lease.get("spec") or {}),
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
            }
            self.client.update_lease({**lease, "spec": spec})
            return True
        except HamiError as e:
            log.warning("leader election: release of %s/%s failed: %s", self.namespace, self.name, e)
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.try_acquire_or_renew():
                if self._sleep(self.retry_period_s):
                    break
                continue
            log.info("leader election %s/%s: %s is the leader", self.namespace, self.name, self.identity)
            self._leading.set()
            self._callback(self.on_started_leading)
            last_renew = time.monotonic()
            while not self._stop.is_set():
                if self._sleep(self.retry_period_s):
                    break
                if self.try_acquire_or_renew():
                    last_renew = time.monotonic()
                    continue
                other = self.leader_identity and self.leader_identity != self.identity
                if other or time.monotonic() - last_renew > self.renew_deadline_s:
                    break
            self._leading.clear()
            if self._stop.is_set() and self.release_on_stop:
                self.release()
            log.info("leader election %s/%s: %s stopped leading", self.namespace, self.name, self.identity)
            self._callback(self.on_stopped_leading)

    @staticmethod
    def _callback(fn: Callable[[], None] | None) -> None:
        if fn is not None:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("leader election callback failed")


__all__ = [
    "ApiError",
    "KubeClient",
    "LeaderElector",
    "Reflector",
    "ResourceExpired",
    "WatchStream",
    "now_micro",
    "now_rfc3339",
    "object_key",
]
