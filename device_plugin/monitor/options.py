"""`MonitorOptions`: every setting of the monitor as one typed value (built by `cli.parse_args`)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CONTAINERS_DIR = "/usr/local/vgpu/containers"  # HAMi chart: HOOK_PATH=/usr/local/vgpu + /containers
DEFAULT_PORT = 9394  # HAMi's vGPU monitor port (Service port name monitorport)


@dataclass(frozen=True)
class MonitorOptions:
    """Units: seconds. `port` 0 = any free port (tests). `backend` is the host-metrics source."""

    node_name: str
    containers_dir: str = DEFAULT_CONTAINERS_DIR
    kubeconfig: str | None = None  # None = in-cluster service account
    address: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    backend: str = "nvidia"  # nvidia | fake
    fake_config: str | None = None  # cards file of the fake backend
    scan_interval_s: float = 5.0
    grace_period_s: float = 300.0
    legacy_metrics: bool = False
    proc: str = "/proc"  # the host's /proc (the monitor runs with hostPID)
    log_level: str = "INFO"
