"""Writes the Grafana dashboards in this directory: ``python dashboards/generate.py``.

Why generated: the panels are a list of PromQL expressions with a title and a unit; writing the
Grafana JSON around them by hand repeats the same 40 lines per panel. Every expression uses only
metric names and labels the code registers (the scheduler extender's allocation and latency families,
the node monitor's per-container and per-card families); `tests/unit/test_monitor_dashboards.py`
checks that, and that the committed JSON is what this script writes.

Import the JSON files in Grafana (Dashboards -> New -> Import) or ship them in a ConfigMap that the
Grafana sidecar picks up; each asks for a Prometheus data source (variable ``datasource``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Every scheduler replica (scheduler.replicas > 1) exports the same allocation and quota gauges from its
# own cache, and each is scraped: those are combined with max over the replicas (the per-card ones by
# node and card; per pod or quota, max by all of the family's own labels first), never summed.
DS = {"type": "prometheus", "uid": "${datasource}"}


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (expr, legendFormat)
    unit: str = "short"
    kind: str = "timeseries"  # timeseries | table | stat
    description: str = ""
    width: int = 12
    height: int = 8
    max: float | None = None
    extra: dict = field(default_factory=dict)


def _panel(p: Panel, pid: int, x: int, y: int) -> dict:
    targets = []
    for i, (expr, legend) in enumerate(p.targets):
        t = {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": chr(ord("A") + i)}
        if p.kind == "table":
            t.update(instant=True, format="table")
        targets.append(t)
    defaults: dict = {"unit": p.unit}
    if p.max is not None:
        defaults["max"] = p.max
        defaults["min"] = 0
    out = {
        "id": pid,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": DS,
        "gridPos": {"h": p.height, "w": p.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True}}
        if p.kind == "timeseries"
        else {},
        "targets": targets,
    }
    if p.kind == "table":
        out["transformations"] = [{"id": "merge", "options": {}}]
    out.update(p.extra)
    return out


def _variable(name: str, query: str, *, label: str, multi: bool = True) -> dict:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DS,
        "query": {"query": query, "refId": f"{name}-var"},
        "definition": query,
        "refresh": 2,
        "includeAll": multi,
        "multi": multi,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def dashboard(uid: str, title: str, description: str, variables: list[dict], rows: list[list[Panel]]) -> dict:
    panels = []
    y = 0
    pid = 1
    for row in rows:
        x = 0
        for p in row:
            panels.append(_panel(p, pid, x, y))
            pid += 1
            x += p.width
        y += max(p.height for p in row)
    datasource = {
        "name": "datasource",
        "label": "Prometheus",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["hami", "gpu"],
        "timezone": "browser",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [datasource, *variables]},
        "annotations": {"list": []},
        "panels": panels,
    }


# ---- cluster: allocation against use, quotas, the scheduler -------------------------------------------

NODE = 'node=~"$node"'


def cluster() -> dict:
    rows = [
        [
            Panel(
                "Memory allocated vs card size, per card",
                [
                    (
                        f"max by (node, device_uuid) (hami_gpu_memory_allocated_bytes{{{NODE}}})",
                        "{{node}} {{device_uuid}} allocated",
                    ),
                    (
                        f"max by (node, device_uuid) (hami_gpu_memory_limit_bytes{{{NODE}}})",
                        "{{node}} {{device_uuid}} size",
                    ),
                ],
                unit="bytes",
                description="What the scheduler has handed out on each card (hami_gpu_memory_allocated_bytes) "
                "against the card's registered memory (hami_gpu_memory_limit_bytes).",
            ),
            Panel(
                "Memory allocated vs used, per card",
                [
                    (
                        f"max by (node, device_uuid) (hami_gpu_memory_allocated_bytes{{{NODE}}})",
                        "{{node}} {{device_uuid}} allocated",
                    ),
                    (
                        f"sum by (node, device_uuid) (hami_host_gpu_memory_used_bytes{{{NODE}}})",
                        "{{node}} {{device_uuid}} used (NVML)",
                    ),
                ],
                unit="bytes",
                description="Allocation from the scheduler against what the card really holds, from the node monitor.",
            ),
        ],
        [
            Panel(
                "Cards allocated but idle (utilisation below 5 %)",
                [
                    (
                        f"max by (node, device_uuid) (hami_gpu_shared_count{{{NODE}}}) > 0 "
                        f"and on (node, device_uuid) max by (node, device_uuid) (hami_host_gpu_utilization_ratio{{{NODE}}}) < 5",
                        "{{node}} {{device_uuid}}",
                    )
                ],
                kind="table",
                description="Containers sharing the card (hami_gpu_shared_count > 0) while NVML reports under 5 % "
                "utilisation on it.",
            ),
            Panel(
                "Compute allocated per card",
                [
                    (
                        f"max by (node, device_uuid) (hami_gpu_core_allocated_ratio{{{NODE}}})",
                        "{{node}} {{device_uuid}} allocated",
                    ),
                    (
                        f"sum by (node, device_uuid) (hami_host_gpu_utilization_ratio{{{NODE}}})",
                        "{{node}} {{device_uuid}} used (NVML)",
                    ),
                ],
                unit="percent",
                description="gpucores handed out per card (percent of the card) against NVML's utilisation.",
            ),
        ],
        [
            Panel(
                "Containers per card",
                [
                    (
                        f"max by (node, device_uuid) (hami_gpu_shared_count{{{NODE}}})",
                        "{{node}} {{device_uuid}}",
                    )
                ],
                description="Slots in use per card (hami_gpu_shared_count).",
            ),
            Panel(
                "Allocated memory share per card",
                [
                    (
                        f"max by (node, device_uuid) (hami_node_gpu_memory_allocated_ratio{{{NODE}}})",
                        "{{node}} {{device_uuid}}",
                    )
                ],
                unit="percentunit",
                max=1,
            ),
        ],
        [
            Panel(
                "Namespace quota: used vs limit",
                [
                    (
                        "sum by (namespace, quota_name) (max by (namespace, quota_name, limit) (hami_resource_quota_used))",
                        "{{namespace}} {{quota_name}} used",
                    ),
                    (
                        "sum by (namespace, quota_name) (max by (namespace, quota_name) (hami_resource_quota_limit))",
                        "{{namespace}} {{quota_name}} limit",
                    ),
                ],
                description="Device quotas of ResourceQuota objects (MiB for memory, percent for cores).",
            ),
            Panel(
                "Namespaces above 90 % of a quota",
                [
                    (
                        "sum by (namespace, quota_name) (max by (namespace, quota_name, limit) (hami_resource_quota_used)) "
                        "/ on (namespace, quota_name) sum by (namespace, quota_name) (max by (namespace, quota_name) (hami_resource_quota_limit)) > 0.9",
                        "{{namespace}} {{quota_name}}",
                    )
                ],
                kind="table",
                unit="percentunit",
            ),
        ],
        [
            Panel(
                "Scheduler filter and bind latency (p50 / p99)",
                [
                    (
                        "histogram_quantile(0.99, sum by (le) (rate(hami_scheduler_filter_duration_seconds_bucket[5m])))",
                        "filter p99",
                    ),
                    (
                        "histogram_quantile(0.5, sum by (le) (rate(hami_scheduler_filter_duration_seconds_bucket[5m])))",
                        "filter p50",
                    ),
                    (
                        "histogram_quantile(0.99, sum by (le) (rate(hami_scheduler_bind_duration_seconds_bucket[5m])))",
                        "bind p99",
                    ),
                ],
                unit="s",
            ),
            Panel(
                "Scheduler failures by reason",
                [
                    ("sum by (reason) (rate(hami_scheduler_filter_failures_total[5m]))", "filter {{reason}}"),
                    ("sum by (reason) (rate(hami_scheduler_bind_failures_total[5m]))", "bind {{reason}}"),
                ],
                unit="ops",
            ),
        ],
        [
            Panel(
                "Filter results",
                [("sum by (result) (rate(hami_scheduler_filter_total[5m]))", "{{result}}")],
                unit="ops",
            ),
            Panel(
                "Active scheduler replica and cache",
                [
                    ("max(hami_scheduler_is_leader)", "leader"),
                    ("max(hami_scheduler_cache_synced)", "cache synced"),
                ],
                kind="stat",
            ),
        ],
    ]
    variables = [_variable("node", "label_values(hami_gpu_memory_limit_bytes, node)", label="Node")]
    return dashboard(
        "hami-vgpu-cluster",
        "HAMi vGPU: cluster allocation",
        "Allocation from the scheduler extender against use from the node monitors; quotas; scheduler latency.",
        variables,
        rows,
    )


# ---- containers: memory against limit, utilisation ----------------------------------------------------

SEL = 'namespace=~"$namespace", pod=~"$pod"'


def containers() -> dict:
    rows = [
        [
            Panel(
                "Memory used vs limit, per container",
                [
                    (
                        f"sum by (namespace, pod, container, device_uuid) (hami_vgpu_memory_used_bytes{{{SEL}}})",
                        "{{namespace}}/{{pod}} {{container}} used",
                    ),
                    (
                        f"sum by (namespace, pod, container, device_uuid) (hami_vgpu_memory_limit_bytes{{{SEL}}})",
                        "{{namespace}}/{{pod}} {{container}} limit",
                    ),
                ],
                unit="bytes",
                width=24,
            ),
        ],
        [
            Panel(
                "Containers near their memory limit (above 90 %)",
                [
                    (
                        f"hami_vgpu_memory_used_bytes{{{SEL}}} / hami_vgpu_memory_limit_bytes{{{SEL}}} > 0.9",
                        "{{namespace}}/{{pod}} {{container}} {{device_uuid}}",
                    ),
                ],
                kind="table",
                unit="percentunit",
                description="Used over limit per container and card; the same labels on both sides, so the "
                "division pairs each container with its own limit.",
            ),
            Panel(
                "Allocated (scheduler) vs used (node), per pod",
                [
                    (
                        f"sum by (namespace, pod) (max by (namespace, node, pod, container_index, device_uuid) (hami_vgpu_memory_allocated_bytes{{{SEL}}}))",
                        "{{namespace}}/{{pod}} allocated",
                    ),
                    (
                        f"sum by (namespace, pod) (hami_vgpu_memory_used_bytes{{{SEL}}})",
                        "{{namespace}}/{{pod}} used",
                    ),
                ],
                unit="bytes",
            ),
        ],
        [
            Panel(
                "Memory by kind",
                [
                    (
                        f"sum by (namespace, pod, container) (hami_vgpu_memory_buffer_bytes{{{SEL}}})",
                        "{{pod}} {{container}} allocations",
                    ),
                    (
                        f"sum by (namespace, pod, container) (hami_vgpu_memory_context_bytes{{{SEL}}})",
                        "{{pod}} {{container}} contexts",
                    ),
                    (
                        f"sum by (namespace, pod, container) (hami_vgpu_memory_module_bytes{{{SEL}}})",
                        "{{pod}} {{container}} modules",
                    ),
                ],
                unit="bytes",
            ),
            Panel(
                "SM utilisation per container",
                [
                    (
                        f"hami_container_device_utilization_ratio{{{SEL}}}",
                        "{{namespace}}/{{pod}} {{container}} {{vdevice_index}}",
                    )
                ],
                unit="percent",
                description="Measured by libvgpu on devices with a compute limit (gpucores below 100); "
                "HAMi-core containers report their own figure.",
            ),
        ],
        [
            Panel(
                "Seconds since the last kernel",
                [
                    (
                        f"hami_container_last_kernel_elapsed_seconds{{{SEL}}}",
                        "{{namespace}}/{{pod}} {{container}}",
                    )
                ],
                unit="s",
            ),
            Panel(
                "Card utilisation and memory (NVML)",
                [
                    ("hami_host_gpu_utilization_ratio", "{{node}} {{device_index}} SM"),
                    (
                        "hami_host_gpu_memory_controller_utilization_ratio",
                        "{{device_uuid}} memory controller",
                    ),
                ],
                unit="percent",
            ),
        ],
        [
            Panel(
                "Monitor: unreadable region files by reason",
                [("sum by (reason) (rate(hami_monitor_cache_errors_total[5m]))", "{{reason}}")],
                unit="ops",
            ),
            Panel(
                "Monitor: scan duration p99",
                [
                    (
                        "histogram_quantile(0.99, sum by (le) (rate(hami_monitor_scan_duration_seconds_bucket[5m])))",
                        "p99",
                    )
                ],
                unit="s",
            ),
        ],
    ]
    variables = [
        _variable("namespace", "label_values(hami_vgpu_memory_used_bytes, namespace)", label="Namespace"),
        _variable(
            "pod", 'label_values(hami_vgpu_memory_used_bytes{namespace=~"$namespace"}, pod)', label="Pod"
        ),
    ]
    return dashboard(
        "hami-vgpu-containers",
        "HAMi vGPU: containers",
        "Per-container device memory against its limit, utilisation and last kernel, from the node monitor.",
        variables,
        rows,
    )


DASHBOARDS = {"hami-vgpu-cluster.json": cluster, "hami-vgpu-containers.json": containers}


def render(build) -> str:
    return json.dumps(build(), indent=2, sort_keys=False) + "\n"


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else HERE
    for name, build in DASHBOARDS.items():
        (out / name).write_text(render(build))
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
