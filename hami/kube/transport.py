"""`ApiTransport`: how `hami.kube.client.KubeClient`'s requests reach the API server.

The client's verbs build requests (`ApiRequest`: what, method, path, body); this base class sends them:
synchronously through the official client's urllib3 pool (`_send`; the generated methods for list,
watch, replace and delete, `_call`), or from the running event loop (`_asend`, through
`hami.kube.aio.AsyncTransport`), with the same URL, headers, bearer token (re-read once a minute and
after a 401), TLS, client-side rate limit, error mapping and retries (`hami.kube.retry`). It also
builds the client from a kubeconfig or the in-cluster service account.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Self
from urllib.parse import quote

import orjson
import urllib3
import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from hami.errors import InvalidRequest
from hami.kube.aio import AsyncTransport
from hami.kube.resources import Res
from hami.kube.retry import TRANSPORT_ERRORS, call_with_retries, classify, transport_error

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


class ApiRequest(NamedTuple):
    """One hot-path request as `KubeClient` builds it, for either transport."""

    what: str
    method: str
    path: str
    body: Any = None
    content_type: str = "application/json"
    retry_conflict: bool = False


class ApiTransport:
    """Sends `ApiRequest`s (see module docstring); `KubeClient` is its one subclass.

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
    ) -> Self:
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
    def in_cluster(cls, **options: Any) -> Self:
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

    def _send(self, req: ApiRequest) -> Any:
        return self._request(
            req.what, req.method, req.path, req.body, content_type=req.content_type,
            retry_conflict=req.retry_conflict,
        )  # fmt: skip

    async def _asend(self, req: ApiRequest) -> Any:
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
