"""`LeaderElector`: one active replica through a ``coordination.k8s.io/v1`` Lease (client-go's rules).

Why: several extender replicas may run for availability, but only one may reserve capacity and
write annotations, or two could hand out the same card. The Lease is the API server's arbiter.

Why not the official client's `kubernetes.leaderelection`: its `LeaderElection.run()` campaigns once
and returns for good when leadership is lost (the extender must campaign again and start a new term),
it has no way to stop and release the Lease on shutdown (client-go's ``ReleaseOnCancel``, which lets a
standby take over at once instead of after the lease duration), it calls `sys.exit` on a bad setting,
it measures expiry on the wall clock (a clock step can make a replica think the Lease expired), and its
lock talks through the client's global default configuration rather than our `KubeClient` with its one
retry policy and timeouts. This module keeps client-go's rules (observed-record time on a monotonic
clock, renew deadline, jittered retries) on our client.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from hami.errors import HamiError, InvalidRequest
from hami.kube.resources import now_micro

if TYPE_CHECKING:
    from hami.kube.client import KubeClient

log = logging.getLogger(__name__)


class LeaderElector:
    """Leader election over a ``coordination.k8s.io/v1`` Lease with client-go's rules.

    A candidate takes the Lease when it does not exist, is released (empty holder) or has not been
    renewed for ``leaseDurationSeconds`` as measured on *this* process's clock since it last saw the
    record change (so clock skew between replicas does not matter). The leader renews every
    `retry_period_s`; if it cannot renew for `renew_deadline_s`, or sees another holder, it stops
    leading (``on_stopped_leading``) and campaigns again. `stop()` releases the Lease when
    `release_on_stop` so a standby takes over at once.
    Callbacks run on the elector's thread and must return quickly.
    """

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration_s: float = 15.0,
        renew_deadline_s: float = 10.0,
        retry_period_s: float = 2.0,
        on_started_leading: Callable[[], None] | None = None,
        on_stopped_leading: Callable[[], None] | None = None,
        on_new_leader: Callable[[str], None] | None = None,
        release_on_stop: bool = True,
    ) -> None:
        if not lease_duration_s > renew_deadline_s > retry_period_s > 0:
            raise InvalidRequest(
                "leader election: want lease_duration_s > renew_deadline_s > retry_period_s > 0, got "
                f"{lease_duration_s} / {renew_deadline_s} / {retry_period_s}"
            )
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_started_leading = on_started_leading
        self.on_stopped_leading = on_stopped_leading
        self.on_new_leader = on_new_leader
        self.release_on_stop = release_on_stop
        self.leader_identity = ""
        self._observed_spec: dict[str, Any] | None = None
        self._observed_at = 0.0
        self._leading = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def is_leader(self) -> bool:
        return self._leading.is_set()

    def wait_for_leadership(self, timeout_s: float | None = None) -> bool:
        """Block until this candidate leads; False on timeout."""
        return self._leading.wait(timeout_s)

    def start(self) -> LeaderElector:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"leader-{self.name}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop campaigning; releases the Lease if leading and `release_on_stop`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def _sleep(self, seconds: float) -> bool:
        """Wait with client-go's jitter (up to +20%); True when stopped meanwhile."""
        return self._stop.wait(seconds * (1 + random.random() * 0.2))

    def _observe(self, spec: dict[str, Any]) -> None:
        if spec != self._observed_spec:
            self._observed_spec = spec
            self._observed_at = time.monotonic()
            holder = spec.get("holderIdentity") or ""
            if holder != self.leader_identity:
                self.leader_identity = holder
                if holder and self.on_new_leader is not None:
                    try:
                        self.on_new_leader(holder)
                    except Exception:  # noqa: BLE001
                        log.exception("leader election: on_new_leader failed")

    def try_acquire_or_renew(self) -> bool:
        """One round: take or renew the Lease; True when this candidate holds it afterwards."""
        now = now_micro()
        duration = int(round(self.lease_duration_s))
        try:
            lease = self.client.get_lease(self.namespace, self.name)
            if lease is None:
                spec = {
                    "holderIdentity": self.identity,
                    "leaseDurationSeconds": duration,
                    "acquireTime": now,
                    "renewTime": now,
                    "leaseTransitions": 0,
                }
                created = self.client.create_lease(self.namespace, self.name, spec)
                self._observe(created.get("spec") or spec)
                return True
            spec = dict(lease.get("spec") or {})
            self._observe(spec)
            holder = spec.get("holderIdentity") or ""
            held_for = float(spec.get("leaseDurationSeconds") or duration)
            if holder and holder != self.identity and time.monotonic() < self._observed_at + held_for:
                return False
            new_spec = dict(spec)
            if holder == self.identity:
                new_spec.update(renewTime=now, leaseDurationSeconds=duration)
            else:
                new_spec.update(
                    holderIdentity=self.identity,
                    leaseDurationSeconds=duration,
                    acquireTime=now,
                    renewTime=now,
                    leaseTransitions=int(spec.get("leaseTransitions") or 0) + 1,
                )
            updated = self.client.update_lease({**lease, "spec": new_spec})
            self._observe(updated.get("spec") or new_spec)
            return True
        except HamiError as e:
            log.info("leader election %s/%s: %s", self.namespace, self.name, e)
            return False

    def release(self) -> bool:
        """Give the Lease up if held (holder emptied, duration 1 s); True when released."""
        try:
            lease = self.client.get_lease(self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return False
            now = now_micro()
            spec = {
                **(lease.get("spec") or {}),
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "acquireTime": now,
                "renewTime": now,
            }
            self.client.update_lease({**lease, "spec": spec})
            return True
        except HamiError as e:
            log.warning("leader election: release of %s/%s failed: %s", self.namespace, self.name, e)
            return False

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.try_acquire_or_renew():
                if self._sleep(self.retry_period_s):
                    break
                continue
            log.info("leader election %s/%s: %s is the leader", self.namespace, self.name, self.identity)
            self._leading.set()
            self._callback(self.on_started_leading)
            last_renew = time.monotonic()
            while not self._stop.is_set():
                if self._sleep(self.retry_period_s):
                    break
                if self.try_acquire_or_renew():
                    last_renew = time.monotonic()
                    continue
                other = self.leader_identity and self.leader_identity != self.identity
                if other or time.monotonic() - last_renew > self.renew_deadline_s:
                    break
            self._leading.clear()
            if self._stop.is_set() and self.release_on_stop:
                self.release()
            log.info("leader election %s/%s: %s stopped leading", self.namespace, self.name, self.identity)
            self._callback(self.on_stopped_leading)

    @staticmethod
    def _callback(fn: Callable[[], None] | None) -> None:
        if fn is not None:
            try:
                fn()
            except Exception:  # noqa: BLE001
                log.exception("leader election callback failed")
