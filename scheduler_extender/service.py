"""The extender, assembled: its settings and the state the verbs share; the verbs live in
`scheduler_extender.filtering` (filter = decide + reserve (ClusterState) + record (one pod patch), and
prioritize), `scheduler_extender.binding` (bind = node lock + Binding, undoing what was taken on any
failure) and `scheduler_extender.preempting` (preempt = the victims that free cards, per node).

The common case runs on the event loop: the decision (`ClusterState`, about a millisecond) and the
API writes, which are `hami.kube.KubeClient`'s coroutines (no thread hand-off per call). Steps that
block (a read after a stale cache, node lock contention, undoing a failed bind, ``--async-record``'s
writer, ``--filter-mode all``) run in worker threads.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from hami.cluster import ClusterState
from hami.nodelock import NodeMutexes
from scheduler_extender import events as ev
from scheduler_extender.binding import BindFailure, BindVerbs, LockHeld
from scheduler_extender.filtering import FilterVerbs
from scheduler_extender.lockwait import LockQueues
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.preempting import PreemptVerbs
from scheduler_extender.runtime import TermGuard
from scheduler_extender.sync import Inflight
from scheduler_extender.verb_state import Settings

__all__ = ["BindFailure", "Extender", "LockHeld", "Settings"]


class Extender(FilterVerbs, BindVerbs, PreemptVerbs):
    """Filter, bind and preempt over `state` and `client` (a `hami.kube.KubeClient`, or None for no API writes).

    `readiness()` returns None when this replica may serve, else why not (standby, caches syncing).
    `pod_lookup(namespace, name)` returns the watched copy of a pod (or None); bind uses it to answer a
    retried bind of an already-bound pod without taking the node lock again. `node_lookup(name)` returns
    the watched copy of a Node (or None); the node lock's first write is made from it (no GET).
    """

    def __init__(
        self,
        state: ClusterState,
        client: Any,
        *,
        settings: Settings | None = None,
        metrics: ExtenderMetrics | None = None,
        events: ev.EventSink | None = None,
        readiness: Callable[[], str | None] = lambda: None,
        inflight: Inflight | None = None,
        pod_lookup: Callable[[str, str], dict[str, Any] | None] = lambda _ns, _name: None,
        node_lookup: Callable[[str], dict[str, Any] | None] = lambda _name: None,
        node_mutexes: NodeMutexes | None = None,
        lock_queues: LockQueues | None = None,
        term_guard: TermGuard | None = None,
    ) -> None:
        self.state = state
        # API writes of a request happen only while the leadership term it started in lasts.
        if term_guard is None:
            term_guard = TermGuard()
            term_guard.open()
        self.term_guard = term_guard
        # Binds waiting for a held node lock, woken by the watches (scheduler_extender.lockwait).
        self.lock_queues = lock_queues if lock_queues is not None else LockQueues()
        # This process's node-lock writers take turns per node (hami.nodelock.NodeMutexes).
        self.node_mutexes = node_mutexes if node_mutexes is not None else NodeMutexes()
        self.pod_lookup = pod_lookup
        self.node_lookup = node_lookup
        self.inflight = inflight if inflight is not None else Inflight()
        self.client = client
        self.settings = settings or Settings()
        self.metrics = metrics or ExtenderMetrics(state)
        self.events = events or ev.EventSink(None, component=self.settings.scheduler_name or "hami-scheduler")
        self.readiness = readiness
        # --async-record: pod UID -> the background patch recording its placement (until it is done),
        # and the error texts of failed ones (until bind reports them; bounded).
        self._pending: dict[str, Future[bool]] = {}
        self._record_errors: OrderedDict[str, str] = OrderedDict()
        self._pending_lock = threading.Lock()
        self._recorder = (
            ThreadPoolExecutor(max_workers=8, thread_name_prefix="extender-record")
            if self.settings.async_record and client is not None
            else None
        )

    def close(self) -> None:
        """Stop the background placement writer (``--async-record``); writes in flight finish."""
        if self._recorder is not None:
            self._recorder.shutdown(wait=False)
