"""`AsyncTransport`: `KubeClient`'s hot calls on the caller's event loop (aiohttp), no worker thread.

Why: an asyncio server (the scheduler extender) that reaches the API server through the synchronous
client pays a thread hand-off per call (``asyncio.to_thread``: a queue, a wake-up, the GIL passed
twice) on top of urllib3's request building. On the extender's filter+bind path that was the largest
cost per pod. This transport sends the same wire request as `KubeClient._request` (URL, headers,
bearer token, TLS, body) from the event loop and maps the answer through the same
`hami.kube.retry.classify`, retried with the same policy (`acall_with_retries`). It is not a second
client: `KubeClient` owns it and builds every request (`KubeClient.aget`, `apatch`, `acreate`,
`abind_pod`, `acreate_event`); only the sending differs.

One session per event loop: the first call on a loop opens it; a call from another loop (a test that
starts a new loop) opens a new one. Close it with `KubeClient.aclose` on its loop. Where aiohttp
cannot follow the configuration (a proxy), `KubeClient` sends the async calls through its synchronous
path in a thread instead (`KubeClient.async_native` is False).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Protocol

import aiohttp
import orjson
from kubernetes.client.exceptions import ApiException
from yarl import URL

from hami.kube.retry import acall_with_retries, classify, transport_error

#: Transport failures of aiohttp worth another try (the request may not have reached the server).
ASYNC_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, ConnectionError, TimeoutError)


def ssl_context(cfg: Any) -> ssl.SSLContext | None:
    """The client TLS context of a kubernetes ``Configuration`` (CA, client certificate, verification),
    as its urllib3 pool uses them; None for plain HTTP."""
    if not str(cfg.host).startswith("https"):
        return None
    if cfg.verify_ssl:
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.assert_hostname is False:
            ctx.check_hostname = False
    else:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file or None)
    return ctx


class _Owner(Protocol):
    """What the transport reads of its owner (`hami.kube.transport.ApiTransport`, which imports this
    module: named by what it asks, not by its class)."""

    api_client: Any
    timeout_s: float
    retries: int
    retry_initial_wait_s: float
    retry_max_wait_s: float
    _host: str
    _limiter: Any
    _auth_cache: Any

    def _auth_headers(self) -> dict[str, str]: ...


class AsyncTransport:
    """Sends `KubeClient`'s requests with aiohttp on the running loop (see module docstring)."""

    def __init__(self, client: _Owner) -> None:
        self._client = client
        cfg = client.api_client.configuration
        self._ssl = ssl_context(cfg)
        self._server_hostname = cfg.tls_server_name or None
        self._pool_size = int(cfg.connection_pool_maxsize or 32)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Per (auth headers object, content type): the request headers, rebuilt when the token is.
        self._headers: dict[tuple[int, str | None], tuple[dict[str, str], dict[str, str]]] = {}

    def _open(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self._pool_size, ssl=self._ssl if self._ssl else False)
            timeout = self._client.timeout_s
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, connect=timeout, sock_connect=timeout, sock_read=timeout),
                # The API server's JSON is decoded by orjson below; no cookie jar, no auto-decompress.
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("User-Agent",),
            )
            self._loop = loop
        return self._session

    async def request(
        self, what: str, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
        retry_conflict: bool = False,
    ) -> Any:  # fmt: skip
        """`KubeClient._request` on the event loop: the parsed JSON answer (or None); raises the mapped
        `hami.errors` type after the retries."""
        client = self._client
        raw = None if body is None else orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
        # `path` is quoted already (`KubeClient._path`): no second pass over it.
        url = URL(client._host + path, encoded=True)  # noqa: SLF001 - the owner's resolved host
        ctype = content_type if raw is not None else None

        async def attempt() -> Any:
            session = self._open()
            limiter = client._limiter  # noqa: SLF001
            if limiter is not None:
                wait = limiter.reserve()
                if wait > 0:
                    await asyncio.sleep(wait)
            headers = self._request_headers(client._auth_headers(), ctype)  # noqa: SLF001
            extra: dict[str, Any] = {}
            if self._server_hostname:
                extra["server_hostname"] = self._server_hostname
            try:
                async with session.request(method, url, data=raw, headers=headers, **extra) as resp:
                    data = await resp.read()
                    status, reason, resp_headers = resp.status, resp.reason, resp.headers
            except ASYNC_TRANSPORT_ERRORS as e:
                raise transport_error(what, e) from None
            if not 200 <= status < 300:
                if status == 401:
                    client._auth_cache = None  # noqa: SLF001 - a rotated token: read it afresh next time
                exc = ApiException(status=status, reason=reason, body=data.decode("utf-8", "replace"))
                exc.headers = resp_headers
                raise classify(exc, what, retry_conflict)
            return orjson.loads(data) if data else None

        return await acall_with_retries(
            attempt, retries=client.retries, initial_wait_s=client.retry_initial_wait_s,
            max_wait_s=client.retry_max_wait_s,
        )  # fmt: skip

    def _request_headers(self, auth: dict[str, str], content_type: str | None) -> dict[str, str]:
        key = (id(auth), content_type)
        hit = self._headers.get(key)
        if hit is not None and hit[0] is auth:
            return hit[1]
        headers = {**auth, "Accept": "application/json"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        if len(self._headers) > 16:
            self._headers.clear()  # old tokens' entries
        self._headers[key] = (auth, headers)
        return headers

    async def close(self) -> None:
        """Close the session of the running loop (a session of another, finished loop is dropped)."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return
            if self._loop is loop:
                await session.close()
