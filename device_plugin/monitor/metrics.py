"""The monitor's metric families: HAMi's vGPU monitor names and labels, plus the monitor's own health.

Names and label sets are HAMi's (its ``cmd/vGPUmonitor``), each with the constant label
``zone="vGPU"``, so existing dashboards and alerts work unchanged:

* per container and device (labels `CONTAINER_LABELS`): ``hami_vgpu_memory_used_bytes``,
  ``hami_vgpu_memory_limit_bytes`` (absent when the container has no limit),
  ``hami_container_device_memory_bytes`` (same value as used), ``hami_container_device_utilization_ratio``
  (percent 0-100 despite the name, as HAMi; absent when not measured),
  ``hami_container_last_kernel_elapsed_seconds`` (absent before the first measured kernel),
  ``hami_vgpu_memory_context_bytes`` / ``_module_bytes`` / ``_buffer_bytes`` (the breakdown of used);
* per card: ``hami_host_gpu_memory_used_bytes``, ``hami_host_gpu_utilization_ratio`` (labels
  `HOST_LABELS`), ``hami_host_gpu_memory_controller_utilization_ratio`` (no ``node`` label, as HAMi);
* per MIG instance of a container (from the pod's ``hami.io/vgpu-mig-allocations`` once the device
  plugin recorded it): ``hami_mig_device_info`` = 1 (labels `MIG_LABELS`);
* with ``--legacy-metrics`` also HAMi's old names (`LEGACY_*`, ``MigInfo``), without ``zone``.

The snapshot families are rendered to exposition text once per scan (`render_snapshot`), on the scan
thread, so a scrape only concatenates bytes: its cost does not grow with the number of containers.
The monitor's own counters (`MonitorMetrics`) are live and rendered per scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import InfoMetricFamily
from prometheus_client.registry import Collector

from device_plugin.monitor.pods import PodRef
from device_plugin.monitor.regions import REASONS
from device_plugin.monitor.scanner import DeviceSample, Snapshot

ZONE = "vGPU"
CONTAINER_LABELS = ("namespace", "pod", "container", "vdevice_index", "device_uuid", "zone")
HOST_LABELS = ("node", "device_index", "device_uuid", "device_type", "zone")
HOST_MEMCTL_LABELS = ("device_index", "device_uuid", "device_type", "zone")
LEGACY_CONTAINER_LABELS = ("podnamespace", "podname", "ctrname", "vdeviceid", "deviceuuid")
LEGACY_MEMORY_DESC_LABELS = (*LEGACY_CONTAINER_LABELS, "context", "module", "data", "offset")
LEGACY_HOST_LABELS = ("nodeid", "deviceidx", "deviceuuid", "devicetype")
MIG_LABELS = (
    "namespace", "pod", "container", "vdevice_index", "device_uuid", "mig_uuid", "profile", "gpu_instance_id",
    "compute_instance_id", "zone",
)  # fmt: skip
LEGACY_MIG_LABELS = (*LEGACY_CONTAINER_LABELS, "instanceid")

# Scans take milliseconds per hundred containers; the top buckets catch a stalled /proc or disk.
SCAN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class _Spec:
    name: str
    help: str
    value: Callable[[DeviceSample], float | None]


CONTAINER_FAMILIES = (
    _Spec(
        "hami_vgpu_memory_used_bytes", "vGPU device memory used by a container, bytes", lambda d: d.used_bytes
    ),
    _Spec(
        "hami_vgpu_memory_limit_bytes",
        "vGPU device memory limit of a container, bytes",
        lambda d: d.limit_bytes,
    ),
    _Spec(
        "hami_container_device_memory_bytes",
        "Device memory used by a container, bytes",
        lambda d: d.used_bytes,
    ),
    _Spec(
        "hami_container_device_utilization_ratio",
        "SM utilisation of a container on a device, percent (0-100)",
        lambda d: d.utilization_percent,
    ),
    _Spec(
        "hami_container_last_kernel_elapsed_seconds",
        "Seconds since the container's last measured kernel on a device",
        lambda d: d.last_kernel_elapsed_s,
    ),
    _Spec(
        "hami_vgpu_memory_context_bytes", "Device memory held by contexts, bytes", lambda d: d.context_bytes
    ),
    _Spec(
        "hami_vgpu_memory_module_bytes",
        "Device memory held by module images, bytes",
        lambda d: d.module_bytes,
    ),
    _Spec(
        "hami_vgpu_memory_buffer_bytes", "Device memory held by allocations, bytes", lambda d: d.buffer_bytes
    ),
)
LEGACY_CONTAINER_FAMILIES = (
    _Spec("vGPU_device_memory_usage_in_bytes", "vGPU device usage", lambda d: d.used_bytes),
    _Spec("vGPU_device_memory_limit_in_bytes", "vGPU device limit", lambda d: d.limit_bytes),
    _Spec(
        "Device_utilization_desc_of_container",
        "Container device utilization",
        lambda d: d.utilization_percent,
    ),
    _Spec(
        "Device_last_kernel_of_container",
        "Container device last kernel time",
        lambda d: d.last_kernel_elapsed_s,
    ),
)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _esc(value: str) -> str:
    # The text format's label value escapes: backslash, double quote, line feed.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(names: tuple[str, ...], values: list[str]) -> str:
    return "{" + ",".join(f'{n}="{_esc(v)}"' for n, v in zip(names, values, strict=True)) + "}"


class _Family:
    """One gauge family being rendered: header lines, then ``name{labels} value`` lines."""

    __slots__ = ("name", "lines")

    def __init__(self, name: str, help_: str) -> None:
        self.name = name
        self.lines = [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]

    def add(self, labels: str, value: float) -> None:
        self.lines.append(f"{self.name}{labels} {_num(value)}")


def render_snapshot(
    snap: Snapshot, *, node: str, legacy: bool = False, pods: Mapping[str, PodRef] | None = None
) -> bytes:
    """Exposition text (Prometheus text format 0.0.4) of the per-container and per-card families, and
    of the MIG instances of `pods` (UID -> `PodRef`).

    Written directly rather than through prometheus_client's collectors: with 1000 containers this is
    8000 samples per scan, and building each label string once per device (not once per family) makes
    the render about ten times cheaper. The families and their label sets are the module's tables.
    """
    fams = [_Family(f.name, f.help) for f in CONTAINER_FAMILIES]
    old = [_Family(f.name, f.help) for f in LEGACY_CONTAINER_FAMILIES]
    mem_desc = _Family("Device_memory_desc_of_container", "Container device memory description")
    for c in snap.containers:
        for d in c.devices:
            idx = str(d.index)
            labels = _labels(CONTAINER_LABELS, [c.pod.namespace, c.pod.name, c.container, idx, d.uuid, ZONE])
            for spec, fam in zip(CONTAINER_FAMILIES, fams, strict=True):
                v = spec.value(d)
                if v is not None:
                    fam.add(labels, v)
            if legacy:
                old_values = [c.pod.namespace, c.pod.name, c.container, idx, d.uuid]
                old_labels = _labels(LEGACY_CONTAINER_LABELS, old_values)
                for spec, fam in zip(LEGACY_CONTAINER_FAMILIES, old, strict=True):
                    v = spec.value(d)
                    if v is not None:
                        fam.add(old_labels, v)
                desc = [*old_values, _num(d.context_bytes), _num(d.module_bytes), _num(d.buffer_bytes), "0"]
                mem_desc.add(_labels(LEGACY_MEMORY_DESC_LABELS, desc), d.used_bytes)

    host_mem = _Family("hami_host_gpu_memory_used_bytes", "GPU device memory used on the host, bytes")
    host_util = _Family("hami_host_gpu_utilization_ratio", "GPU utilisation on the host, percent (0-100)")
    host_memctl = _Family(
        "hami_host_gpu_memory_controller_utilization_ratio",
        "GPU memory controller utilisation on the host, percent (0-100)",
    )
    old_host_mem = _Family("HostGPUMemoryUsage", "GPU device memory usage")
    old_host_util = _Family("HostCoreUtilization", "GPU core utilization")
    for g in snap.host:
        idx = str(g.index)
        full = _labels(HOST_LABELS, [node, idx, g.uuid, g.device_type, ZONE])
        host_mem.add(full, g.memory_used_bytes)
        host_util.add(full, g.utilization_percent)
        host_memctl.add(
            _labels(HOST_MEMCTL_LABELS, [idx, g.uuid, g.device_type, ZONE]), g.memory_utilization_percent
        )
        if legacy:
            old_lbl = _labels(LEGACY_HOST_LABELS, [node, idx, g.uuid, g.device_type])
            old_host_mem.add(old_lbl, g.memory_used_bytes)
            old_host_util.add(old_lbl, g.utilization_percent)

    mig = _Family("hami_mig_device_info", "MIG runtime identity for a container allocation")
    old_mig = _Family("MigInfo", "Mig device information for container")
    for ref in sorted((pods or {}).values(), key=lambda r: (r.namespace, r.name)):
        for m in ref.mig:
            values = [ref.namespace, ref.name, m.container, str(m.vdevice_index), m.device_uuid]
            mig.add(
                _labels(MIG_LABELS, [*values, m.mig_uuid, m.profile, str(m.gpu_instance_id),
                                     str(m.compute_instance_id), ZONE]),
                1,
            )  # fmt: skip
            if legacy:
                old_mig.add(_labels(LEGACY_MIG_LABELS, [*values, str(m.gpu_instance_id)]), 1)

    out = [*fams, host_mem, host_util, host_memctl, mig]
    if legacy:
        out += [*old, mem_desc, old_host_mem, old_host_util, old_mig]
    return ("\n".join(line for fam in out for line in fam.lines) + "\n").encode()


class _Static(Collector):
    def __init__(self, families: list) -> None:
        self.families = families

    def collect(self) -> Iterator:
        yield from self.families


class MonitorMetrics:
    """The monitor's own families on its `registry` (rendered per scrape):

    - ``hami_monitor_cache_errors_total{reason}``: region files that became unreadable, by reason
      (`device_plugin.monitor.regions.REASONS`; every reason is present from the start at 0);
    - ``hami_monitor_scan_duration_seconds``: histogram of one scan (all directories + host figures);
    - ``hami_monitor_last_scan_timestamp_seconds``: unix time at which the last published scan started;
    - ``hami_monitor_containers{state}``: cache directories whose pod is known and whose region was
      read (``exported``), and directories with no known pod (``unmatched``);
    - ``hami_monitor_cache_dirs_removed_total``: stale directories deleted after the grace period;
    - ``hami_monitor_pods_synced``: 1 once the pod watch has delivered its first list;
    - ``hami_build_info{version,implementation}``.
    """

    def __init__(self, *, version: str = "") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.cache_errors = Counter(
            "hami_monitor_cache_errors", "Shared region files skipped, by reason", ["reason"], registry=r
        )
        for reason in REASONS:
            self.cache_errors.labels(reason)
        self.scan_duration = Histogram(
            "hami_monitor_scan_duration_seconds", "Time of one scan of the cache directories", buckets=SCAN_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.last_scan = Gauge(
            "hami_monitor_last_scan_timestamp_seconds",
            "Unix time at which the last published scan started",
            registry=r,
        )
        self.containers = Gauge(
            "hami_monitor_containers", "Cache directories by state", ["state"], registry=r
        )
        self.removed = Counter(
            "hami_monitor_cache_dirs_removed",
            "Stale cache directories removed after the grace period",
            registry=r,
        )
        self.pods_synced = Gauge("hami_monitor_pods_synced", "1 once the pod watch has synced", registry=r)
        build = InfoMetricFamily("hami_build", "Build information")
        build.add_metric([], {"version": version or "unknown", "implementation": "python"})
        r.register(_Static([build]))

    def error(self, reason: str) -> None:
        self.cache_errors.labels(reason).inc()

    def observe(self, snap: Snapshot) -> None:
        """Record one finished scan."""
        self.scan_duration.observe(snap.scan_s)
        self.last_scan.set(snap.taken_at)
        self.containers.labels("exported").set(len(snap.containers))
        self.containers.labels("unmatched").set(snap.unmatched_dirs)
