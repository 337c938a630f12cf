"""Prometheus metrics of the webhook, on a registry per application.

A registry per app (not the process-global default) lets tests and the benchmark start several apps
in one process and read exact counter values. Names follow Prometheus conventions: `_total` counters,
`_seconds` histograms; the latency buckets are dense below 10 ms because the API server's whole
mutating chain shares one timeout and our target is a p99 of a few milliseconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

RESULTS = ("allowed", "patched", "denied", "error")


class WebhookMetrics:
    """The webhook's collectors on their own `CollectorRegistry` (`.registry`).

    - `hami_webhook_reviews_total{result}`: result in allowed (no change), patched, denied, error
      (the body could not be answered: HTTP 400).
    - `hami_webhook_review_duration_seconds`: time from body read to reply built.
    - `hami_webhook_cert_reloads_total{result}`: certificate reload attempts, result ok / failed.
    - `hami_webhook_warnings_total`: admission warnings returned.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.reviews = Counter(
            "hami_webhook_reviews_total",
            "Admission reviews answered, by result",
            ["result"],
            registry=self.registry,
        )
        for result in RESULTS:
            self.reviews.labels(result)
        self.latency = Histogram(
            "hami_webhook_review_duration_seconds",
            "Time to answer one admission review",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.cert_reloads = Counter(
            "hami_webhook_cert_reloads_total",
            "TLS certificate reload attempts, by result",
            ["result"],
            registry=self.registry,
        )
        self.warnings = Counter(
            "hami_webhook_warnings_total", "Admission warnings returned to clients", registry=self.registry
        )
        self.up = Gauge("hami_webhook_up", "1 while the webhook serves", registry=self.registry)
        self.up.set(1)

    def cert_reloaded(self, ok: bool) -> None:
        """Callback for `ReloadingTLS(on_reload=...)`."""
        self.cert_reloads.labels("ok" if ok else "failed").inc()
