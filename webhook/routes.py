"""The webhook's protocol handlers: /mutate (and HAMi's /webhook), /healthz, /metrics.

The API server needs an HTTP 200 with an AdmissionReview for every review it can get one for; anything
else counts as a failed call and falls under `failurePolicy`. So every answerable body gets a 200 (a
denial when the pod is wrong or our own code failed), and only a body that is not an AdmissionReview
of a known version gets a 400 with a JSON error. Nothing a client sends can stop the server or show
it a stack trace.
"""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook.metrics import WebhookMetrics
from webhook.mutate import Mutator
from webhook.review import Decision, ReviewError, decode_review, deny, encode_response

log = logging.getLogger(__name__)

#: Largest body accepted: a pod is at most about 1.5 MiB (etcd's object limit) plus the review envelope.
MAX_BODY = 4 * 1024 * 1024
MUTATOR_KEY = web.AppKey("mutator", Mutator)
METRICS_KEY = web.AppKey("metrics", WebhookMetrics)


def _json(obj: object, *, status: int = 200) -> web.Response:
    return web.Response(
        body=json.dumps(obj, separators=(",", ":")).encode(), status=status, content_type="application/json"
    )


def review_body(mutator: Mutator, body: bytes) -> tuple[int, dict, Decision | None]:
    """Answer one request body: (HTTP status, reply JSON, decision or None on a 400).

    Pure apart from logging, so the benchmark and tests can call it without a server.
    """
    try:
        request = decode_review(body)
    except ReviewError as exc:
        return 400, {"error": str(exc)}, None
    try:
        decision = mutator.review(request)
    except Exception:
        # A bug of ours must not take pod creation hostage nor leak internals: deny with a short text,
        # log the trace for the operator.
        log.exception("review %s of %s/%s failed", request.uid, request.namespace, request.name)
        decision = deny(
            "internal error in the HAMi webhook while reviewing this pod; see the webhook logs",
            code=500,
            reason="InternalError",
        )
    if not decision.allowed:
        log.info(
            "denied pod %s/%s (review %s): %s",
            request.namespace,
            request.name or "<generateName>",
            request.uid,
            decision.message,
        )
    return 200, encode_response(request.api_version, request.uid, decision), decision


async def handle_mutate(request: web.Request) -> web.Response:
    """POST /mutate and /webhook: an AdmissionReview in, the reply in the same version out."""
    metrics = request.app[METRICS_KEY]
    started = time.perf_counter()
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        metrics.reviews.labels("error").inc()
        return _json({"error": f"body larger than {MAX_BODY} bytes"}, status=413)
    except (RequestPayloadError, HttpProcessingError) as exc:
        # A body that cannot be read (bad Content-Encoding, truncated chunks): the client's fault, not a
        # 500 with aiohttp's text.
        metrics.reviews.labels("error").inc()
        return _json({"error": "body could not be read: " + " ".join(str(exc).split())}, status=400)
    status, reply, decision = review_body(request.app[MUTATOR_KEY], body)
    metrics.latency.observe(time.perf_counter() - started)
    metrics.reviews.labels(decision.result if decision else "error").inc()
    if decision and decision.warnings:
        metrics.warnings.inc(len(decision.warnings))
    return _json(reply, status=status)


async def handle_healthz(_request: web.Request) -> web.Response:
    """GET /healthz: 200 ``ok`` while the event loop answers."""
    return web.Response(text="ok")


async def handle_metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format of this app's registry."""
    body = generate_latest(request.app[METRICS_KEY].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def make_app(mutator: Mutator, metrics: WebhookMetrics | None = None) -> web.Application:
    """The aiohttp application; serve it over TLS (`webhook.tls.ReloadingTLS`) in production."""
    app = web.Application(client_max_size=MAX_BODY)
    app[MUTATOR_KEY] = mutator
    app[METRICS_KEY] = metrics or WebhookMetrics()
    app.router.add_post("/mutate", handle_mutate)
    app.router.add_post("/webhook", handle_mutate)
    app.router.add_get("/healthz", handle_healthz)
    app.router.add_get("/metrics", handle_metrics)
    return app
