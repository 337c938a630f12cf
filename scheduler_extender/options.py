"""The extender's typed options: what `scheduler_extender.cli` reads from flags, environment and the
device config (`hami.settings`: flag > environment > config file > default) and what the assembly
(`scheduler_extender.app.Server`) and the runtime take. Frozen: nothing changes them after start.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from hami.config import DeviceConfig
from hami.handshake import HANDSHAKE_TIMEOUT_S
from hami.nodelock import NODE_LOCK_EXPIRY_S
from scheduler_extender.wire import MAX_BODY_BYTES


@dataclass(frozen=True)
class LeaderElection:
    """`--leader-elect-*`: the Lease this replica campaigns for (`hami.kube.LeaderElector` keywords)."""

    namespace: str
    """Lease namespace (default ``$POD_NAMESPACE``, else ``kube-system``)."""
    name: str
    """Lease name (default ``hami-scheduler-extender``)."""
    identity: str
    """This replica's holder identity (default ``$POD_NAME``, else ``<hostname>_<random>``)."""
    lease_duration_s: float = 15.0
    """Seconds a Lease not renewed stays another replica's (client-go default 15 s)."""
    renew_deadline_s: float = 10.0
    """Seconds the leader keeps trying to renew before it stops leading (default 10 s)."""
    retry_period_s: float = 2.0
    """Seconds between campaign / renew attempts (default 2 s)."""


@dataclass(frozen=True)
class SyncOptions:
    """What every leadership term's `scheduler_extender.sync.ClusterSync` is started with."""

    register_interval_s: float = 15.0
    """Seconds between node liveness passes and handshake stamps (HAMi 15 s); 0 turns both off."""
    handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S
    """Seconds an unanswered ``Requesting`` handshake may stand before a node advertising no devices
    is unusable (HAMi 60 s)."""
    reservation_ttl_s: float = 60.0
    """Seconds a filter reservation waits for the pod event that confirms it (default 60 s)."""
    advertise_node_resources: bool = False
    """Keep every GPU node's capacity of the memory and cores resources at its cards' totals
    (`scheduler_extender.advertise`)."""
    freeze_after_rebuild: bool = False
    """``gc.freeze()`` the state a relist rebuilt (on with ``--gc-freeze-interval``: the freezer would
    freeze it at its next tick; before that, a young collection would walk all of it)."""


@dataclass(frozen=True)
class ExtenderOptions:
    """Every ``hami-scheduler-extender`` option, resolved; field names are the flags' (``--port`` -> `port`).

    Durations are seconds (flags accept ``300``, ``30s``, ``5m``, ``1m30s``, ``500ms``).
    """

    kubeconfig: str | None = None
    """``--kubeconfig`` (``HAMI_EXTENDER_KUBECONFIG``, ``KUBECONFIG``); None = in-cluster service account."""
    address: str = "127.0.0.1"
    """``--address``: listen address of the verbs (/filter, /prioritize, /bind; /healthz, /readyz and
    /metrics too). Loopback by default: kube-scheduler runs beside the extender in one pod. Any other
    address needs TLS with client certificates (`client_ca_file`)."""
    port: int = 8888
    """``--port``: listen port; 0 = any free port."""
    metrics_bind_address: str = ""
    """``--metrics-bind-address`` (HAMi's flag): ``[HOST]:PORT`` of a second listener that serves only
    /healthz, /readyz and /metrics (probes and Prometheus on the pod IP); "" = none. The chart sets
    ``:9395``."""
    tls_cert_file: str | None = None
    """``--tls-cert-file``: PEM certificate; set with `tls_private_key_file` to serve HTTPS."""
    tls_private_key_file: str | None = None
    """``--tls-private-key-file``: PEM private key of `tls_cert_file`."""
    client_ca_file: str | None = None
    """``--client-ca-file``: PEM CA bundle; the verbs listener then requires a client certificate signed
    by it (kube-scheduler's extender ``tlsConfig.certFile``/``keyFile``). Needs `tls_cert_file`."""
    scheduler_name: str = "hami-scheduler"
    """``--scheduler-name``: place only pods with this ``spec.schedulerName`` (default: the device
    config's ``scheduler.schedulerName``, ``hami-scheduler``); "" accepts any."""
    config: str | None = None
    """``--config``: the device config YAML (HAMi device-config.yaml); None = built-in defaults."""
    leader_elect: bool = False
    """``--leader-elect``: campaign for a Lease; only the leader serves."""
    leader_elect_resource_name: str = "hami-scheduler-extender"
    """``--leader-elect-resource-name``: the Lease's name."""
    leader_elect_resource_namespace: str = "kube-system"
    """``--leader-elect-resource-namespace`` (alias ``POD_NAMESPACE``): the Lease's namespace."""
    leader_elect_identity: str = ""
    """``--leader-elect-identity`` (alias ``POD_NAME``; default ``<hostname>_<random>``)."""
    leader_elect_lease_duration: float = 15.0
    """``--leader-elect-lease-duration``, seconds (default 15 s)."""
    leader_elect_renew_deadline: float = 10.0
    """``--leader-elect-renew-deadline``, seconds (default 10 s)."""
    leader_elect_retry_period: float = 2.0
    """``--leader-elect-retry-period``, seconds (default 2 s)."""
    node_lock_timeout: float = NODE_LOCK_EXPIRY_S
    """``--node-lock-timeout``, seconds: an older node lock is taken over (HAMi default 5 min)."""
    filter_mode: str = "single"
    """``--filter-mode``: ``single`` (HAMi: /filter returns the one node this extender chose, cards
    reserved) or ``all`` (/filter returns every node that fits, /prioritize gives our policy's
    scores, the cards are chosen at /bind for the node kube-scheduler picked)."""
    bind_lock_wait: float = 25.0
    """``--bind-lock-wait`` (alias ``--node-lock-retry-timeout``, HAMi v2.10), seconds: a bind that finds
    the node lock held waits this long for it (woken by the node watch) before failing; 0 fails at
    once (HAMi before v2.10). Keep it below kube-scheduler's extender ``httpTimeout`` (chart: 30 s)."""
    register_interval: float = 15.0
    """``--register-interval``, seconds: node liveness pass and handshake stamps; 0 turns both off."""
    handshake_timeout: float = HANDSHAKE_TIMEOUT_S
    """``--handshake-timeout``, seconds (HAMi 60 s)."""
    reservation_ttl: float = 60.0
    """``--reservation-ttl``, seconds: unconfirmed filter reservations are dropped after this."""
    advertise_node_resources: bool = False
    """``--advertise-node-resources``: advertise each GPU node's card totals as its capacity of
    ``nvidia.com/gpumem`` and ``nvidia.com/gpucores``, so that kube-scheduler, told to count those two
    (``ignoredByScheduler: false``), finds preemption victims (docs/scheduler-extender.md)."""
    max_request_bytes: int = MAX_BODY_BYTES
    """``--max-request-bytes``: /filter and /bind body limit in bytes (default 1 MiB)."""
    kube_qps: float = 0.0
    """``--kube-qps``: client-side API requests per second; 0 = no limit."""
    kube_burst: int = 100
    """``--kube-burst``: client-side API burst (default 100)."""
    kube_timeout: float = 10.0
    """``--kube-timeout``, seconds per API request (default 10 s)."""
    workers: int = 32
    """``--workers``: threads for the steps that block, and the API connection pool size (default 32)."""
    events: str = "all"
    """``--events``: pod events ``all`` (HAMi), ``failures`` (Warning only) or ``none``."""
    async_record: bool = False
    """``--async-record``: answer /filter before the placement is written; /bind waits for the write."""
    gc_freeze_interval: float = 10.0
    """``--gc-freeze-interval``, seconds between GC freezes of long-lived objects; 0 = off."""
    gc_full_interval: float = 3600.0
    """``--gc-full-interval``, seconds between full collections when freezing (default 1 h)."""
    log_level: str = "INFO"
    """``--log-level``: DEBUG, INFO, WARNING or ERROR."""
    device_config: DeviceConfig = field(default_factory=DeviceConfig, compare=False, repr=False)
    """The parsed `config` file (read once by the CLI; defaults when `config` is None)."""

    @property
    def metrics_listener(self) -> tuple[str, int] | None:
        """(host, port) of the health and metrics listener, None when `metrics_bind_address` is ""."""
        return split_host_port(self.metrics_bind_address) if self.metrics_bind_address else None

    @property
    def election(self) -> LeaderElection | None:
        """The Lease to campaign for, or None without ``--leader-elect``."""
        if not self.leader_elect:
            return None
        return LeaderElection(
            namespace=self.leader_elect_resource_namespace,
            name=self.leader_elect_resource_name,
            identity=self.leader_elect_identity,
            lease_duration_s=self.leader_elect_lease_duration,
            renew_deadline_s=self.leader_elect_renew_deadline,
            retry_period_s=self.leader_elect_retry_period,
        )

    @property
    def sync(self) -> SyncOptions:
        """The per-term sync options."""
        return SyncOptions(
            register_interval_s=self.register_interval,
            handshake_timeout_s=self.handshake_timeout,
            reservation_ttl_s=self.reservation_ttl,
            advertise_node_resources=self.advertise_node_resources,
            freeze_after_rebuild=self.gc_freeze_interval > 0,
        )


def is_loopback(address: str) -> bool:
    """Whether `address` (an IP or ``localhost``) only accepts connections from this host (pod)."""
    if address.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


def split_host_port(value: str) -> tuple[str, int]:
    """``[HOST]:PORT`` -> (host, port); an empty host is every address (``0.0.0.0``). Raises ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{value!r}: want [HOST]:PORT, e.g. :9395 or 127.0.0.1:9395")
    return host.strip("[]") or "0.0.0.0", int(port)
