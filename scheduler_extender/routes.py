"""The extender's protocol handlers: POST /filter, POST /prioritize, POST /bind, POST /preempt, GET /healthz,
GET /readyz, GET /metrics.

kube-scheduler treats any status other than 200 as a transport error, so /filter and /bind answer 200
with the protocol's ``Error`` field for every problem, including bodies that are not JSON or exceed
the size limit (read here chunk by chunk, so an oversized body is refused without being buffered).
/readyz is what a Service or load balancer uses to send scheduler traffic only to the active replica.
Keep-alive stays on (k8s-protocols §1.8.16): connection setup would eat into the 5 s httpTimeout.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from scheduler_extender.service import Extender
from scheduler_extender.wire import MAX_BODY_BYTES, bind_result, filter_result

EXTENDER_KEY: web.AppKey[Extender] = web.AppKey("extender", Extender)


class BodyTooLarge(Exception):
    pass


async def read_body(request: web.Request, limit: int) -> bytes:
    """The request body, at most `limit` bytes. Raises BodyTooLarge beyond that (without buffering it)."""
    if request.content_length is not None and request.content_length > limit:
        raise BodyTooLarge()
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = await request.content.read(65536)
        if not chunk:
            break
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge()
        chunks.append(chunk)
    return b"".join(chunks)


def _json(obj: Any) -> web.Response:  # a dict, or the HostPriorityList array of /prioritize
    # orjson: the filter reply names every candidate (485 reasons on a 1213-node cluster).
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def _too_large(what: str, limit: int) -> str:
    return (
        f"{what}: request body larger than {limit} bytes; use nodeCacheCapable: true (names instead of "
        "full Node objects) or raise --max-request-bytes"
    )


def make_app(
    extender: Extender,
    *,
    max_body_bytes: int = MAX_BODY_BYTES,
    health: Callable[[], str | None] = lambda: None,
) -> web.Application:
    """The aiohttp application. `health()` returns None while the process is healthy, else why not."""
    app = web.Application(client_max_size=max_body_bytes + 1)
    app[EXTENDER_KEY] = extender

    def verb(
        handler: Callable[[bytes], Awaitable[Any]],
        what: str,
        error: Callable[[str], Any],
        count_refusal: Callable[[], None],
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            try:
                body = await read_body(request, max_body_bytes)
            except BodyTooLarge:
                count_refusal()
                # Closing is the only safe way to skip an unread body on a keep-alive connection.
                resp = _json(error(_too_large(what, max_body_bytes)))
                resp.force_close()
                return resp
            return _json(await handler(body))

        return handle

    m = extender.metrics
    app.router.add_post(
        "/filter",
        verb(extender.filter, "ExtenderArgs", lambda e: filter_result(None, error=e), lambda: m.filter_failed("bad_request")),
    )
    # kube-scheduler ignores a failed prioritize (every node gets 0 from us): an empty list says the same.
    app.router.add_post("/prioritize", verb(extender.prioritize, "ExtenderArgs", lambda _e: [], lambda: None))
    app.router.add_post(
        "/bind", verb(extender.bind, "ExtenderBindingArgs", bind_result, lambda: m.bind_failed("bad_request"))
    )

    async def preempt(request: web.Request) -> web.Response:
        # ExtenderPreemptionResult has no error field: problems are non-200 answers (see preempting.py).
        try:
            body = await read_body(request, max_body_bytes)
        except BodyTooLarge:
            m.preempt_calls.labels("error").inc()
            resp = web.Response(text=_too_large("ExtenderPreemptionArgs", max_body_bytes) + "\n", status=413)
            resp.force_close()
            return resp
        status, result = await extender.preempt(body)
        if status != 200:
            return web.Response(text=f"{result}\n", status=status)
        return _json(result)

    app.router.add_post("/preempt", preempt)
    _add_health_routes(app, extender, health)
    return app


def make_health_app(
    extender: Extender, *, health: Callable[[], str | None] = lambda: None
) -> web.Application:
    """/healthz, /readyz and /metrics alone: the listener on the pod IP (``--metrics-bind-address``).

    It carries no verb, so reaching it (a Service, a probe, Prometheus) cannot place or bind a pod.
    """
    app = web.Application(client_max_size=1024)
    _add_health_routes(app, extender, health)
    return app


def _add_health_routes(app: web.Application, extender: Extender, health: Callable[[], str | None]) -> None:
    async def healthz(_request: web.Request) -> web.Response:
        why = health()
        if why is None:
            return web.Response(text="ok\n")
        return web.Response(text=f"unhealthy: {why}\n", status=500)

    async def readyz(_request: web.Request) -> web.Response:
        why = extender.readiness()
        if why is None:
            return web.Response(text="ok\n")
        return web.Response(text=f"not ready: {why}\n", status=503)

    async def metrics(_request: web.Request) -> web.Response:
        data = generate_latest(extender.metrics.registry)
        return web.Response(body=data, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
