"""The attributes `scheduler_extender.service.Extender.__init__` sets up and both verb mixins read
(`filtering.FilterVerbs`, `binding.BindVerbs`): declared once, for type checkers and readers; no
state and no code of its own."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from hami.cluster import ClusterState
from hami.nodelock import NodeMutexes
from scheduler_extender import events as ev
from scheduler_extender.lockwait import LockQueues
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.runtime import TermGuard
from scheduler_extender.sync import Inflight

if TYPE_CHECKING:
    from scheduler_extender.service import Settings


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
