"""The webhook's typed options: what `webhook.cli` reads from flags, ``HAMI_WEBHOOK_*`` environment and
the device config (`hami.settings`: flag > environment > config file > default) and `webhook.app` takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hami.config import DeviceConfig
from webhook.mutate import DEFAULT_SCHEDULER


@dataclass(frozen=True)
class WebhookOptions:
    """Every ``hami-webhook`` option, resolved; field names are the flags' (``--port`` -> `port`)."""

    tls_cert_file: str
    """``--tls-cert-file``: PEM serving certificate, reloaded when it changes; required."""
    tls_private_key_file: str
    """``--tls-private-key-file``: PEM private key of `tls_cert_file`; required."""
    address: str = "0.0.0.0"
    """``--address``: listen address."""
    port: int = 8443
    """``--port``: listen port; 0 = any free port."""
    scheduler_name: str = "hami-scheduler"
    """``--scheduler-name``: the scheduler device pods are sent to (default: the device config's
    ``scheduler.schedulerName``, ``hami-scheduler``); "" turns the takeover off."""
    config: str | None = None
    """``--config``: the device config YAML (HAMi device-config.yaml); None = built-in defaults."""
    takeover_schedulers: str = DEFAULT_SCHEDULER
    """``--takeover-schedulers``: comma list of ``schedulerName`` values replaced by ours (an absent
    name always is); default ``default-scheduler``."""
    allocation_writers: str = ""
    """``--allocation-writers``: comma list of usernames (``system:serviceaccount:<ns>:<name>``) that may
    change a pod's allocation annotations after CREATE: the scheduler's and the device plugin's
    service accounts (the chart passes both). Anyone else's UPDATE that changes one is denied."""
    kubeconfig: str | None = None
    """``--kubeconfig``: watch quotas and namespaces with this kubeconfig; None = no API access."""
    in_cluster: bool = False
    """``--in-cluster``: watch quotas and namespaces with the in-cluster service account."""
    log_level: str = "INFO"
    """``--log-level``: DEBUG, INFO, WARNING or ERROR."""
    device_config: DeviceConfig = field(default_factory=DeviceConfig, compare=False, repr=False)
    """The parsed `config` file (read once by the CLI)."""

    @property
    def writers(self) -> frozenset[str]:
        """`allocation_writers` as a set."""
        return frozenset(s.strip() for s in self.allocation_writers.split(",") if s.strip())

    @property
    def takeover(self) -> frozenset[str]:
        """`takeover_schedulers` as a set, always with "" (a pod that names no scheduler)."""
        return frozenset({"", *(s.strip() for s in self.takeover_schedulers.split(",") if s.strip())})
