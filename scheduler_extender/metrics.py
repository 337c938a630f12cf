"""Prometheus metrics of the extender: HAMi's scheduler families (so existing dashboards keep working) plus
our own latency and failure figures.

HAMi's families (hami-legacy-spec §5.1, names, label sets and units as HAMi's cmd/scheduler/metrics.go
emits them) are computed at scrape time from `ClusterState` by a custom collector, never kept as
gauges that could drift from the state: `hami_gpu_*`, `hami_node_gpu_*` (with
`hami_node_gpu_mig_instance_info`, one series of value 1 per MIG instance the device plugin realized on
a card in MIG mode, from the pods' ``hami.io/vgpu-mig-allocations``), `hami_vgpu_*` and
`hami_resource_quota_*`, each with the constant label ``zone="vGPU"``. Memory is in bytes
(MiB x 1048576), cores in percent. As in HAMi, per-pod figures use the collapsed usage (init and app
containers merged per card), so `container_index` is always ``0``.

One registry per application (not the process default) so tests and benchmarks can run several
extenders in one process and read exact values.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

from hami.cluster import ClusterState

MIB = 1024 * 1024
ZONE = "vGPU"

# Dense below 10 ms: a filter must answer within the scheduler's httpTimeout and our target is a
# p99 of a few milliseconds.
LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 2.5, 5.0)

FILTER_RESULTS = ("placed", "unschedulable", "passthrough", "error")
BIND_RESULTS = ("bound", "error")
PREEMPT_RESULTS = ("planned", "no_plan", "error")


class ClusterCollector(Collector):
    """HAMi's allocation families from `state` at scrape time (see module docstring)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state

    def describe(self) -> list:
        # Families vary with the cluster; an empty describe keeps registration from calling collect().
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        card = ["node", "device_uuid", "device_index", "device_type", "zone"]
        mem_limit = GaugeMetricFamily(
            "hami_gpu_memory_limit_bytes", "Device memory limit for a certain GPU", labels=card
        )
        core_limit = GaugeMetricFamily(
            "hami_gpu_core_limit_ratio", "Device core limit for a certain GPU", labels=card
        )
        mem_alloc = GaugeMetricFamily(
            "hami_gpu_memory_allocated_bytes",
            "Device memory allocated for a certain GPU",
            labels=["node", "device_uuid", "device_index", "device_cores", "device_type", "zone"],
        )
        shared = GaugeMetricFamily(
            "hami_gpu_shared_count", "Number of containers sharing this GPU", labels=card
        )
        core_alloc = GaugeMetricFamily(
            "hami_gpu_core_allocated_ratio", "Device core allocated for a certain GPU", labels=card
        )
        overview = GaugeMetricFamily(
            "hami_node_gpu_overview",
            "GPU overview on a certain node",
            labels=[
                "node",
                "device_uuid",
                "device_index",
                "device_cores",
                "device_memory_limit",
                "device_type",
                "zone",
            ],
        )
        mem_ratio = GaugeMetricFamily(
            "hami_node_gpu_memory_allocated_ratio",
            "GPU Memory Allocated Percentage on a certain GPU",
            labels=["node", "device_uuid", "device_index", "zone"],
        )
        for c in self.state.card_stats():
            idx = str(c.index)
            mem_limit.add_metric([c.node, c.uuid, idx, c.type, ZONE], c.devmem * MIB)
            core_limit.add_metric([c.node, c.uuid, idx, c.type, ZONE], c.devcore)
            mem_alloc.add_metric([c.node, c.uuid, idx, str(c.devcore), c.type, ZONE], c.usedmem * MIB)
            shared.add_metric([c.node, c.uuid, idx, c.type, ZONE], c.used)
            core_alloc.add_metric([c.node, c.uuid, idx, c.type, ZONE], c.usedcores)
            overview.add_metric(
                [c.node, c.uuid, idx, str(c.devcore), str(c.devmem), c.type, ZONE], c.usedmem * MIB
            )
            if c.devmem > 0:
                mem_ratio.add_metric([c.node, c.uuid, idx, ZONE], c.usedmem / c.devmem)
        yield from (mem_limit, core_limit, mem_alloc, shared, core_alloc, overview, mem_ratio)

        mig = GaugeMetricFamily(
            "hami_node_gpu_mig_instance_info",
            "Realized MIG instance identity and scheduler placement",
            labels=["node", "device_uuid", "device_index", "mig_uuid", "profile", "gpu_instance_id",
                    "compute_instance_id", "placement_start", "placement_size", "zone"],
        )  # fmt: skip
        for m in self.state.mig_instances():
            mig.add_metric(
                [m.node, m.uuid, str(m.index), m.mig_uuid, m.profile, str(m.gpu_instance_id),
                 str(m.compute_instance_id), str(m.placement.start), str(m.placement.size), ZONE],
                1,
            )  # fmt: skip
        yield mig

        pod_labels = ["namespace", "node", "pod", "container_index", "device_uuid", "zone"]
        vmem = GaugeMetricFamily(
            "hami_vgpu_memory_allocated_bytes", "vGPU memory allocated from a container", labels=pod_labels
        )
        vcore = GaugeMetricFamily(
            "hami_vgpu_core_allocated_ratio", "vGPU core allocated from a container", labels=pod_labels
        )
        for ns, name, node, grants in self.state.pod_grants():
            for g in grants:
                vmem.add_metric([ns, node, name, "0", g.uuid, ZONE], g.usedmem * MIB)
                vcore.add_metric([ns, node, name, "0", g.uuid, ZONE], g.usedcores)
        yield vmem
        yield vcore

        used = GaugeMetricFamily(
            "hami_resource_quota_used",
            "resourcequota usage for a certain device",
            labels=["namespace", "quota_name", "limit", "zone"],
        )
        limit = GaugeMetricFamily(
            "hami_resource_quota_limit",
            "resourcequota limit for a certain device",
            labels=["namespace", "quota_name", "zone"],
        )
        for ns, res, u, lim in self.state.quota_stats():
            used.add_metric([ns, res, str(lim), ZONE], u)
            limit.add_metric([ns, res, ZONE], lim)
        yield used
        yield limit
        yield CounterMetricFamily(
            "hami_scheduler_allocation_mismatch",
            "Pod events whose allocation annotations differ from what this extender decided for the pod "
            "(the decision is counted, not the annotations)",
            value=self.state.allocation_mismatches,
        )


class ExtenderMetrics:
    """The extender's collectors on their own `CollectorRegistry` (`.registry`).

    - `hami_scheduler_filter_duration_seconds` / `hami_scheduler_bind_duration_seconds`: time from
      body read to reply built (includes the pod patch, unless --async-record / the lock and Binding calls).
    - `hami_scheduler_filter_total{result}`: placed, unschedulable, passthrough (no managed device),
      error (the reply's `Error` was set).
    - `hami_scheduler_bind_total{result}`: bound, error.
    - `hami_scheduler_preempt_total{result}`: preempt calls: planned (victims on at least one node),
      no_plan (no candidate node has room to free), error (a non-200 answer).
    - `hami_scheduler_filter_failures_total{reason}` / `hami_scheduler_bind_failures_total{reason}`:
      failures by reason (bad_request, not_ready, wrong_scheduler, invalid_pod, no_fit, patch,
      pod_gone, node_gone, no_reservation, lock, record, bind, ...).
    - `hami_scheduler_is_leader`, `hami_scheduler_cache_synced`: 0/1.
    - `hami_scheduler_events_dropped_total`: events not sent because the queue was full.
    - `hami_build_info`.
    Plus `ClusterCollector` when a state is given.
    """

    def __init__(self, state: ClusterState | None = None, *, version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.filter_latency = Histogram(
            "hami_scheduler_filter_duration_seconds",
            "Time to answer one extender filter call",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.bind_latency = Histogram(
            "hami_scheduler_bind_duration_seconds",
            "Time to answer one extender bind call",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.filters = Counter(
            "hami_scheduler_filter_total",
            "Filter calls answered, by result",
            ["result"],
            registry=self.registry,
        )
        for r in FILTER_RESULTS:
            self.filters.labels(r)
        self.binds = Counter(
            "hami_scheduler_bind_total", "Bind calls answered, by result", ["result"], registry=self.registry
        )
        for r in BIND_RESULTS:
            self.binds.labels(r)
        self.preempt_calls = Counter(
            "hami_scheduler_preempt_total",
            "Preempt calls answered, by result",
            ["result"],
            registry=self.registry,
        )
        for r in PREEMPT_RESULTS:
            self.preempt_calls.labels(r)
        self.filter_failures = Counter(
            "hami_scheduler_filter_failures_total",
            "Filter calls that placed nothing, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.bind_failures = Counter(
            "hami_scheduler_bind_failures_total",
            "Failed bind calls, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.is_leader = Gauge(
            "hami_scheduler_is_leader", "1 while this replica is the active one", registry=self.registry
        )
        self.synced = Gauge(
            "hami_scheduler_cache_synced",
            "1 while the caches are synced in the current leadership term",
            registry=self.registry,
        )
        self.registration_invalid = Gauge(
            "hami_node_registration_invalid",
            "1 for each node whose device registration cannot be read (the node is left out alone)",
            ["node"],
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "hami_scheduler_events_dropped_total",
            "Events not recorded because the event queue was full",
            registry=self.registry,
        )
        build = InfoMetricFamily("hami_build", "Build information")
        build.add_metric([], {"version": version or "unknown", "implementation": "python"})
        self.registry.register(_Static([build]))
        if state is not None:
            self.registry.register(ClusterCollector(state))

    def filter_failed(self, reason: str) -> None:
        self.filter_failures.labels(reason).inc()

    def bind_failed(self, reason: str) -> None:
        self.bind_failures.labels(reason).inc()


class _Static(Collector):
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> Iterator:
        yield from self.families
