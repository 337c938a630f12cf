"""The attributes `scheduler_extender.service.Extender.__init__` sets up and both verb mixins read
(`filtering.FilterVerbs`, `binding.BindVerbs`): declared once, for type checkers and readers; no
state and no code of its own. `Settings`, the type of one of them, lives here too, one floor below the
verbs and the assembly that name it (`scheduler_extender.service` re-exports it)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from hami.cluster import ClusterState
from hami.nodelock import NODE_LOCK_EXPIRY_S, NodeMutexes
from scheduler_extender import events as ev
from scheduler_extender.lockwait import LockQueues
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.runtime import TermGuard
from scheduler_extender.sync import Inflight


@dataclass(frozen=True)
class Settings:
    """Extender behaviour knobs (flags in `scheduler_extender.cli`).

    `scheduler_name`: pods must carry this ``spec.schedulerName`` to be placed (HAMi
    ``--scheduler-name``); "" accepts any. `node_lock_expiry_s`: HAMi ``--node-lock-timeout``.
    """

    scheduler_name: str = "hami-scheduler"
    node_lock_expiry_s: float = NODE_LOCK_EXPIRY_S
    #: ``--async-record``: answer /filter once the decision is reserved and write the pod patch in the
    #: background; /bind waits for that write (and fails if it failed) before taking the node lock.
    async_record: bool = False
    #: ``--bind-lock-wait``: seconds a bind that finds the node lock held waits for it in the node's
    #: FIFO (`scheduler_extender.lockwait`) before failing; 0 fails at once (HAMi). Keep it below
    #: kube-scheduler's extender httpTimeout.
    bind_lock_wait_s: float = 25.0
    #: ``--filter-mode``: ``single`` (HAMi: /filter returns the one node we chose, cards reserved) or
    #: ``all`` (/filter returns every fitting node, /prioritize scores them, /bind picks the cards;
    #: `scheduler_extender.candidates`).
    filter_mode: str = "single"


class VerbState:
    """The extender's shared state as both verbs see it (set by `Extender.__init__`)."""

    state: ClusterState
    client: Any
    settings: Settings
    metrics: ExtenderMetrics
    events: ev.EventSink
    readiness: Callable[[], str | None]
    inflight: Inflight
    pod_lookup: Callable[[str, str], dict[str, Any] | None]
    node_lookup: Callable[[str], dict[str, Any] | None]
    node_mutexes: NodeMutexes
    lock_queues: LockQueues
    term_guard: TermGuard
    _pending: dict[str, Future[bool]]
    _record_errors: OrderedDict[str, str]
    _pending_lock: threading.Lock
    _recorder: ThreadPoolExecutor | None
