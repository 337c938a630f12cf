"""Who may serve: leader election, the per-term cluster sync, and the readiness answer built from both.

With leader election off the replica is always active: one sync starts at once and the replica is
ready when it has synced. With it on, every replica campaigns for a `coordination.k8s.io/v1` Lease;
winning starts a fresh `ClusterSync` (state rebuilt from annotations), losing stops it and empties
the state, so a standby never serves from a stale view and answers /readyz 503 and /filter with an
``Error`` (kube-scheduler then retries the pod; a Service that selects ready endpoints sends traffic
to the leader only).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from hami.cluster import ClusterState
from hami.kube import KubeClient, LeaderElector
from scheduler_extender.lockwait import LockQueues
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.options import LeaderElection, SyncOptions
from scheduler_extender.sync import ClusterSync, Inflight

log = logging.getLogger(__name__)


class TermGuard:
    """Writes to the API server belong to one leadership term: none may start after the term ended.

    Why: a filter decides from the term's state, then patches the pod. If leadership ends between the
    two, the new leader may already be deciding from annotations that do not have this placement,
    and a late patch from the old leader would book the same card twice. A request takes a `token()`
    when it starts; each write runs inside ``with guard.writing(token) as ok`` and is skipped when
    `ok` is False (the term of the token ended). Ending a term (`close`) first refuses new writers,
    then waits (at most `timeout_s`) for the writes in flight, so none lands after it returns.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._term = 0
        self._open = False
        self._writers = 0

    def open(self) -> int:
        """A new term begins; returns its token."""
        with self._cond:
            self._term += 1
            self._open = True
            return self._term

    def close(self, timeout_s: float = 10.0) -> bool:
        """The term ends: no new write; waits for those in flight. False when some still run after `timeout_s`."""
        with self._cond:
            self._open = False
            self._term += 1
            return self._cond.wait_for(lambda: self._writers == 0, timeout_s)

    def token(self) -> int | None:
        """The current term's token, None between terms."""
        with self._cond:
            return self._term if self._open else None

    @contextmanager
    def writing(self, token: int | None) -> Iterator[bool]:
        """Yield True (and hold the term open) when `token`'s term is still current, else False."""
        with self._cond:
            ok = self._open and token is not None and token == self._term
            if ok:
                self._writers += 1
        try:
            yield ok
        finally:
            if ok:
                with self._cond:
                    self._writers -= 1
                    self._cond.notify_all()


class Runtime:
    """Starts and stops terms; `readiness()` is None only for a leader whose caches synced this term.

    `sync` configures every term's `ClusterSync`; `inflight` (the filter's pending writes, shared with
    the service) is emptied when a term ends; `lock_queues` (binds waiting for a node lock) are woken
    by every term's watches; `election` None = no leader election.
    """

    def __init__(
        self,
        client: KubeClient,
        state: ClusterState,
        *,
        metrics: ExtenderMetrics | None = None,
        election: LeaderElection | None = None,
        sync: SyncOptions | None = None,
        inflight: Inflight | None = None,
        lock_queues: LockQueues | None = None,
        on_invalid_registration: Callable[[dict, str | None], None] | None = None,
    ) -> None:
        self.client = client
        self.lock_queues = lock_queues
        self.on_invalid_registration = on_invalid_registration
        self.state = state
        self.metrics = metrics
        self.sync_options = sync or SyncOptions()
        self.inflight = inflight
        self._lock = threading.Lock()
        # API writes of a request belong to the term it started in (TermGuard).
        self.guard = TermGuard()
        self.sync: ClusterSync | None = None
        self.term = 0
        self.elector: LeaderElector | None = None
        if election is not None:
            self.elector = LeaderElector(
                client,
                on_started_leading=self._start_term,
                on_stopped_leading=self._end_term,
                **dataclasses.asdict(election),
            )

    def start(self) -> None:
        """Begin: campaign (leader election) or start the only term."""
        if self.elector is None:
            self._start_term()
        else:
            self.elector.start()

    def stop(self) -> None:
        """Stop campaigning (releasing the Lease when held) and end the current term."""
        if self.elector is not None:
            self.elector.stop()
        self._end_term()

    def _start_term(self) -> None:
        with self._lock:
            if self.sync is not None:
                self.guard.close()
                self.sync.stop()
            self.term += 1
            log.info("term %d: rebuilding state from the API server", self.term)
            self.sync = ClusterSync(
                self.client, self.state, inflight=self.inflight, lock_queues=self.lock_queues,
                on_invalid_registration=self.on_invalid_registration,
                **dataclasses.asdict(self.sync_options),
            ).start()  # fmt: skip
            self.guard.open()
        self._gauges()

    def _end_term(self) -> None:
        # First: no request of this term writes any more (a filter that decided from the old state
        # must not patch the pod once the next leader may be deciding).
        if not self.guard.close():
            log.warning("term %d ended with API writes still in flight after 10s", self.term)
        with self._lock:
            sync, self.sync = self.sync, None
        if sync is not None:
            sync.stop()
            # A standby must not keep serving from (or counting into) the old term's view.
            self.state.rebuild([], [], [])
            if self.inflight is not None:
                self.inflight.clear()
            log.info("term %d ended; state cleared", self.term)
        self._gauges()

    @property
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader

    def readiness(self) -> str | None:
        """None when this replica may filter and bind, else the reason it may not."""
        if not self.is_leader:
            holder = self.elector.leader_identity if self.elector is not None else ""
            return f"standby replica (leader is {holder or 'not known yet'})"
        sync = self.sync
        if sync is not None and sync.rebuild_error is not None:
            return sync.rebuild_error
        if sync is None or not sync.synced:
            return "caches of nodes, pods and resourcequotas are not synced yet in this leadership term"
        self._gauges()
        return None

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.is_leader.set(1 if self.is_leader else 0)
            sync = self.sync
            self.metrics.synced.set(1 if sync is not None and sync.synced else 0)

    def wait_ready(self, timeout_s: float) -> bool:
        """Block until ready (tests, benchmarks)."""
        import time

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.readiness() is None:
                return True
            time.sleep(0.02)
        return False
