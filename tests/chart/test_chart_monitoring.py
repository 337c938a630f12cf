"""The chart's ServiceMonitors keep the labels the exporters put on their series.

The Prometheus Operator adds the scraped target's `namespace`, `pod`, `container`, `service` and
`endpoint` to every series; where a series already has one of them, Prometheus renames the series'
label `exported_<name>` unless the endpoint sets `honorLabels: true`. The node monitor's and the
extender's per-container families carry the GPU pod's `namespace`, `pod` and `container`: without
honorLabels, the dashboards' and docs' queries (`{namespace=~"$namespace", pod=~"$pod"}`) would select
hami-system and the monitor's own pod instead.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from device_plugin.monitor.host import HostGpu
from device_plugin.monitor.metrics import render_snapshot
from device_plugin.monitor.pods import PodRef
from device_plugin.monitor.scanner import ContainerSample, DeviceSample, Snapshot
from tests.chart.conftest import rendered

# prometheus-operator's target labels for a ServiceMonitor endpoint.
OPERATOR_TARGET_LABELS = {"namespace", "pod", "container", "service", "endpoint"}


def monitor_labels() -> set[str]:
    dev = DeviceSample(0, "GPU-a", 1 << 30, 1 << 20, 1, 1, 1, 50.0, 3.0)
    snap = Snapshot(
        taken_at=1.0,
        containers=(ContainerSample(PodRef("team-a", "train-0", "u"), "main", "libvgpu-2", (dev,), 1),),
        host=(HostGpu(0, "GPU-a", "NVIDIA-H200", 1 << 20, 10.0, 5.0),),
    )
    labels: set[str] = set()
    for fam in text_string_to_metric_families(render_snapshot(snap, node="node1").decode()):
        for s in fam.samples:
            labels |= set(s.labels)
    return labels


def test_exported_pod_labels_collide_with_the_operators_target_labels() -> None:
    # The premise: if the monitor stopped exporting these, honorLabels would no longer be needed.
    assert {"namespace", "pod", "container"} <= monitor_labels() & OPERATOR_TARGET_LABELS


def test_service_monitors_honor_the_exported_labels() -> None:
    monitors = rendered("servicemonitor").find("ServiceMonitor")
    assert {m["metadata"]["name"] for m in monitors} == {"hami-scheduler", "hami-device-plugin-monitor"}
    for m in monitors:
        [ep] = m["spec"]["endpoints"]
        assert ep.get("honorLabels") is True, m["metadata"]["name"]
