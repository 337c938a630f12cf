"""The extender's two verbs, orchestrated: filter = decide + reserve (ClusterState) + record (one pod patch);
bind = node lock + bind-phase patch + Binding, undoing what was taken on any failure.

Rules this module keeps (k8s-protocols §1.2/§1.8, hami-legacy-spec §2.3/§2.7/§2.9):

* Always an HTTP-200 answer; a request-level problem (bad body, not ready, standby replica, a pod that
  cannot be understood, the decision could not be recorded) is the reply's ``Error``; a pod that fits
  nowhere is not an error but an empty ``NodeNames`` with a reason for every node.
* The reply names only nodes the caller sent, and exactly one passes (this extender makes the final
  node and card choice, like HAMi); every other candidate is in ``FailedNodes`` with its reason.
* The decision and the reservation happen inside `ClusterState.filter` under its lock, so two
  concurrent filters never take the same capacity. The only API call on the filter path is the pod
  patch that records the decision (``hami.io/vgpu-node`` annotation and label, ``hami.io/vgpu-time``,
  the vendors' device lists); if it fails the reservation is released and the reply is an ``Error``.
  With ``--async-record`` (`Settings.async_record`) that patch is written in the background after the
  reply; bind waits for it and fails (reservation released) if it failed, so a pod is never bound
  before its placement is on it.
  For a pod placed by an earlier filter that now fits nowhere, that one patch removes the stale
  allocation instead. Events are queued, never awaited. Decisions and pod events are serialised
  through `sync.Inflight`, so a late event cannot undo a newer reservation.
* Bind takes the node lock (first try from the watched Node, no GET), then creates the Binding, which
  carries ``hami.io/bind-phase: allocating`` and ``hami.io/bind-time`` in its annotations: the API server
  copies them onto the pod in the same write that binds it (two API calls on the happy path).
  A failure after the lock releases the lock (owner-checked); a pod or node
  that is gone also releases the reservation. Other failures keep the reservation: the pod still carries
  its allocation annotations (so a rebuild would count it too) until kube-scheduler filters it again,
  which replaces the reservation, or the pod is deleted (HAMi §2.9).
* Binding an already-bound pod to the same node succeeds (kube-scheduler may retry after a timeout).

Blocking work (ClusterState, the kube client) runs in worker threads; the event loop only parses,
dispatches and answers.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any

from hami import annotations as A
from hami.cluster import ClusterState, FilterOutcome
from hami.errors import Conflict, HamiError, InvalidRequest, NodeLockContention, NotFound
from hami.nodelock import NODE_LOCK_EXPIRY_S, NodeMutexes, lock_node, release_node_lock
from hami.vendors import pod_takes_node_lock
from scheduler_extender import events as ev
from scheduler_extender.candidates import fitting_nodes, prioritize_scores
from scheduler_extender.lockwait import LockQueues
from scheduler_extender.metrics import ExtenderMetrics
from scheduler_extender.runtime import TermGuard
from scheduler_extender.sync import Inflight
from scheduler_extender.wire import (
    BindArgs,
    FilterArgs,
    bind_result,
    filter_result,
    parse_bind_args,
    parse_filter_args,
)

log = logging.getLogger(__name__)


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


class BindFailure(Exception):
    """A bind step failed: `reason` is the metric label, the message goes into ``Error`` and the event."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LockHeld(BindFailure):
    """The node lock is held by another live pod (the bind may wait for it: `Settings.bind_lock_wait_s`)."""


class Extender:
    """Filter and bind over `state` and `client` (a `hami.kube.KubeClient`, or None for no API writes).

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

    # ------------------------------------------------------------------------------------------
    # filter

    async def filter(self, body: bytes) -> dict[str, Any]:
        """Answer one ExtenderArgs body with an ExtenderFilterResult dict (never raises)."""
        t0 = time.perf_counter()
        args: FilterArgs | None = None
        try:
            args = parse_filter_args(body)
            not_ready = self.readiness()
            token = self.term_guard.token()
            if not_ready is None and token is None:
                not_ready = "leadership term is changing"
            if not_ready is not None:
                self.metrics.filter_failed("not_ready")
                result = filter_result(args, error=f"extender not ready: {not_ready}")
            elif self.settings.filter_mode == "all":
                result = await asyncio.to_thread(self._filter_all_sync, args)
            else:
                result = await asyncio.to_thread(self._filter_sync, args, token)
        except InvalidRequest as e:
            self.metrics.filter_failed("bad_request")
            result = filter_result(args, error=str(e))
        except Exception:  # noqa: BLE001 - never a stack trace to the caller, never a dead server
            log.exception("filter failed unexpectedly")
            self.metrics.filter_failed("internal")
            result = filter_result(args, error="internal error in the extender; see its log")
        self.metrics.filter_latency.observe(time.perf_counter() - t0)
        if result["Error"]:
            self.metrics.filters.labels("error").inc()
        return result

    def _decide(self, args: FilterArgs) -> tuple[FilterOutcome, str]:
        """The outcome and, for an `error` outcome, its metric reason (wrong_scheduler, invalid_pod)."""
        other = self._other_scheduler(args.pod)
        if other is not None:
            return other
        return self.state.filter(args.pod, args.names), "invalid_pod"

    def _other_scheduler(self, pod: dict[str, Any]) -> tuple[FilterOutcome, str] | None:
        """For a pod of another scheduler: pass-through (no devices asked) or the error; else None."""
        sched = (pod.get("spec") or {}).get("schedulerName") or ""
        want = self.settings.scheduler_name
        if want and sched != want:
            try:
                asks = any(c.requests for c in self.state.pod_requests(pod))
            except InvalidRequest:
                asks = True
            if not asks:
                return FilterOutcome(no_devices=True), ""
            return FilterOutcome(
                error=f"pod {_pod_name(pod)} asks for devices but has spec.schedulerName {sched!r}; this "
                f"extender places pods of scheduler {want!r} (let the webhook set it, or run the extender "
                "with --scheduler-name matching the kube-scheduler profile)"
            ), "wrong_scheduler"
        return None

    def _filter_all_sync(self, args: FilterArgs) -> dict[str, Any]:
        """``--filter-mode all``: every fitting candidate passes; nothing is reserved or written."""
        pod = args.pod
        fits: list[str] = []
        other = self._other_scheduler(pod)
        if other is not None:
            outcome, error_reason = other
        else:
            error_reason = "invalid_pod"
            outcome, fits = fitting_nodes(self.state, pod, args.names)
        if outcome.warnings:
            self.events.emit(pod, reason=ev.POLICY_IGNORED, message="; ".join(outcome.warnings), warning=True)
        if outcome.no_devices:
            self.metrics.filters.labels("passthrough").inc()
            return filter_result(args, passed=list(args.names))
        if outcome.error:
            self.metrics.filter_failed(error_reason)
            self.events.emit(pod, reason=ev.FILTERING_FAILED, message=outcome.error, warning=True)
            return filter_result(args, error=outcome.error)
        failed = {n: outcome.failed_nodes.get(n, "no fit") for n in args.names if n not in set(fits)}
        if not fits:
            self.metrics.filter_failed("no_fit")
            self.metrics.filters.labels("unschedulable").inc()
            self.events.emit(
                pod, reason=ev.FILTERING_FAILED, message=ev.filtering_failed_message(failed), warning=True
            )
            return filter_result(args, passed=[], failed=failed)
        self.metrics.filters.labels("placed").inc()
        return filter_result(args, passed=fits, failed=failed)

    async def prioritize(self, body: bytes) -> list[dict[str, Any]]:
        """Answer one ExtenderArgs body with a HostPriorityList (never raises; [] on any problem, which
        kube-scheduler counts as 0 for every node)."""
        try:
            args = parse_filter_args(body)
            if self.readiness() is not None:
                return []
            return await asyncio.to_thread(prioritize_scores, self.state, args.pod, args.names)
        except InvalidRequest as e:
            log.info("prioritize: %s", e)
            return []
        except Exception:  # noqa: BLE001 - never a stack trace to the caller, never a dead server
            log.exception("prioritize failed unexpectedly")
            return []

    def _filter_sync(self, args: FilterArgs, token: int | None = None) -> dict[str, Any]:
        pod = args.pod
        meta = pod["metadata"]
        if self._recorder is not None:
            # A re-filter of a pod whose previous placement is still being written: let that write land
            # first, or it could overwrite the new placement's annotations.
            self.wait_recorded(meta["uid"], timeout_s=30.0)
        with self.inflight.lock:
            # Atomic with the pod watch: no event older than this decision can undo its reservation.
            placed_before = self.state.pod_node(meta["uid"]) is not None or A.ASSIGNED_NODE in (
                meta.get("annotations") or {}
            )
            outcome, error_reason = self._decide(args)
            if outcome.node is not None:
                self.inflight.expect(meta["uid"], outcome.annotations)
            elif placed_before and not outcome.error and not outcome.no_devices:
                self.inflight.expect(meta["uid"], self._cleared())
        if outcome.warnings:
            # The pod asked for a policy that does not parse; the default was used, and the user must
            # be told (a log line on the scheduler's side is not where they look).
            self.events.emit(pod, reason=ev.POLICY_IGNORED, message="; ".join(outcome.warnings), warning=True)
        if outcome.no_devices:
            self.metrics.filters.labels("passthrough").inc()
            return filter_result(args, passed=list(args.names))
        if outcome.error:
            self.metrics.filter_failed(error_reason)
            self.events.emit(pod, reason=ev.FILTERING_FAILED, message=outcome.error, warning=True)
            return filter_result(args, error=outcome.error)
        sent = set(args.names)
        failed = {n: r for n, r in outcome.failed_nodes.items() if n in sent and n != outcome.node}
        if outcome.node is not None and outcome.node not in sent:
            # Cannot happen (the state chooses among the names sent); never hold capacity for it.
            self.state.release_reservation(meta["uid"])
            self.inflight.forget(meta["uid"])
            outcome.node = None
        if outcome.node is None:
            for n in args.names:
                failed.setdefault(n, "no fit")
            if placed_before:
                self._clear(pod, token)
            self.metrics.filter_failed("no_fit")
            self.metrics.filters.labels("unschedulable").inc()
            self.events.emit(
                pod,
                reason=ev.FILTERING_FAILED,
                # The reasons in words too ("needs 2 distinct cards, node has 1"): the event is what users read.
                message=ev.filtering_failed_message(failed, containers=self.state.pod_requests(pod)),
                warning=True,
            )
            return filter_result(args, passed=[], failed=failed)
        chosen_reason = f"node {outcome.node} chosen"  # one string for every other candidate
        for n in args.names:
            if n not in failed and n != outcome.node:
                failed[n] = chosen_reason
        cards = [d.uuid for lst in outcome.devices.values() for c in lst for d in c]
        succeed = ev.filtering_succeed_message(outcome.node, cards, len(failed))
        if self._recorder is not None:
            uid = meta["uid"]
            with self._pending_lock:
                self._record_errors.pop(uid, None)
                future = self._recorder.submit(self._record_and_settle, pod, outcome, succeed, token)
                self._pending[uid] = future
            future.add_done_callback(lambda _f, uid=uid: self._record_done(uid, _f))
            self.metrics.filters.labels("placed").inc()
            return filter_result(args, passed=[outcome.node], failed=failed)
        if not self._record_and_settle(pod, outcome, succeed, token):
            return filter_result(args, error=self._last_error(meta["uid"]))
        self.metrics.filters.labels("placed").inc()
        return filter_result(args, passed=[outcome.node], failed=failed)

    def _record_and_settle(
        self, pod: dict[str, Any], outcome: FilterOutcome, succeed: str, token: int | None = None
    ) -> bool:
        """Write the placement; on failure release the reservation, count and report it. True when written.

        Nothing is written when the leadership term of `token` (`TermGuard`) ended since the filter
        began: the next leader decides from the annotations, which must not change under it.
        The error text is kept for `wait_recorded` / `_last_error` (bounded to the last 1000 pods).
        """
        uid = pod["metadata"]["uid"]
        with self.term_guard.writing(token) as current:
            if current:
                error = self._record(pod, outcome)
            else:
                error = (
                    "leadership ended while this filter was running; the placement was not recorded "
                    "and the pod will be filtered again by the new leader"
                )
        if error is None:
            self.events.emit(pod, reason=ev.FILTERING_SUCCEED, message=succeed)
            return True
        self.state.release_reservation(uid)
        self.inflight.forget(uid)
        self.metrics.filter_failed("patch")
        self.events.emit(pod, reason=ev.FILTERING_FAILED, message=error, warning=True)
        with self._pending_lock:
            self._record_errors[uid] = error
            while len(self._record_errors) > 1000:
                self._record_errors.popitem(last=False)
        return False

    def _last_error(self, uid: str) -> str:
        with self._pending_lock:
            return self._record_errors.pop(uid, "recording the placement failed")

    def _record_done(self, uid: str, future: Future[bool]) -> None:
        with self._pending_lock:
            if self._pending.get(uid) is future:
                del self._pending[uid]

    def wait_recorded(self, uid: str, *, timeout_s: float) -> str | None:
        """``--async-record``: wait for the pending placement write of pod `uid`; its error text, or None.

        None also when nothing is pending (written long ago, or synchronous mode).
        """
        with self._pending_lock:
            future = self._pending.get(uid)
        if future is not None:
            try:
                future.result(timeout=timeout_s)
            except FutureTimeout:
                return f"recording the placement is still in progress after {timeout_s:.0f}s"
            except Exception as e:  # noqa: BLE001 - a bug in the writer must fail the bind, not the server
                log.exception("placement write of pod %s failed unexpectedly", uid)
                return f"recording the placement failed: {e}"
        with self._pending_lock:
            return self._record_errors.pop(uid, None)

    def _cleared(self) -> dict[str, str | None]:
        keys: dict[str, str | None] = {A.ASSIGNED_NODE: None, A.ASSIGNED_TIME: None}
        for v in self.state.vendors.values():
            keys[v.allocated_key] = None
            if v.to_allocate_key:
                keys[v.to_allocate_key] = None
        return keys

    def _clear(self, pod: dict[str, Any], token: int | None = None) -> None:
        """A re-filtered pod that now fits nowhere: remove the allocation an earlier filter wrote.

        Its reservation is already gone from the state; left on the pod, the stale annotations would be
        counted again by the next pod event or a restarted replica (HAMi keeps such phantom usage
        until the pod is deleted). Best effort: on failure the old allocation simply stays counted.
        """
        if self.client is None:
            return
        meta = pod["metadata"]
        try:
            with self.term_guard.writing(token) as current:
                if not current:
                    self.inflight.forget(meta["uid"])
                    return
                self.client.patch_pod_metadata(
                    meta.get("namespace") or "default",
                    meta["name"],
                    annotations=self._cleared(),
                    labels={A.ASSIGNED_NODE: None},
                    uid=meta["uid"],
                )
        except HamiError as e:
            self.inflight.forget(meta["uid"])
            log.info("pod %s: stale allocation not removed: %s", _pod_name(pod), e)

    def _record(self, pod: dict[str, Any], outcome: FilterOutcome) -> str | None:
        """Patch the decision onto the pod (only this incarnation: its UID). Returns an error text or None."""
        if self.client is None:
            return None
        meta = pod["metadata"]
        ns, name = meta.get("namespace") or "default", meta["name"]
        try:
            self.client.patch_pod_metadata(
                ns, name, annotations=outcome.annotations, labels=outcome.labels, uid=meta["uid"]
            )
        except NotFound:
            return f"pod {ns}/{name} no longer exists; its device reservation on {outcome.node} was released"
        except Conflict:
            return (
                f"pod {ns}/{name} was re-created (UID changed) while being filtered; "
                "its device reservation was released and it will be filtered again"
            )
        except HamiError as e:
            return f"recording the placement on pod {ns}/{name} failed ({e}); the reservation was released"
        return None

    # ------------------------------------------------------------------------------------------
    # bind

    async def bind(self, body: bytes) -> dict[str, str]:
        """Answer one ExtenderBindingArgs body with ``{"Error": ...}`` (never raises)."""
        t0 = time.perf_counter()
        args: BindArgs | None = None
        try:
            args = parse_bind_args(body)
            not_ready = self.readiness()
            token = self.term_guard.token()
            if not_ready is None and token is None:
                not_ready = "leadership term is changing"
            if not_ready is not None:
                raise BindFailure("not_ready", f"extender not ready: {not_ready}")
            await self._bind_waiting(args, token)
            result = bind_result()
            self.metrics.binds.labels("bound").inc()
        except InvalidRequest as e:
            self.metrics.bind_failed("bad_request")
            result = bind_result(str(e))
        except BindFailure as e:
            self.metrics.bind_failed(e.reason)
            result = bind_result(str(e))
            if args is not None and e.reason != "not_ready":
                self.events.emit(
                    ev.pod_ref(args.pod_namespace, args.pod_name, args.pod_uid),
                    reason=ev.BINDING_FAILED,
                    message=str(e),
                    warning=True,
                )
        except Exception:  # noqa: BLE001
            log.exception("bind failed unexpectedly")
            self.metrics.bind_failed("internal")
            result = bind_result("internal error in the extender; see its log")
        if result["Error"]:
            self.metrics.binds.labels("error").inc()
        self.metrics.bind_latency.observe(time.perf_counter() - t0)
        return result

    async def _bind_waiting(self, a: BindArgs, token: int | None = None) -> None:
        """Bind; while the node lock is held by another pod, wait in the node's FIFO (lock pipelining).

        A bind arriving while others wait for the node queues behind them without trying. The head
        tries again whenever the watch saw something that may have freed the lock; after
        `Settings.bind_lock_wait_s` seconds (or when the pod is deleted) it fails as a bind without
        waiting would.
        """
        budget = self.settings.bind_lock_wait_s
        queues = self.lock_queues
        if budget <= 0 or self.client is None:
            await asyncio.to_thread(self._bind_sync, a, token)
            return
        loop = asyncio.get_running_loop()
        queues.attach(loop)
        deadline = loop.time() + budget
        # Queued before the first try, so that a release seen by the watch while that try is in flight
        # is not lost; alone in the queue it tries at once, behind others it waits for its turn.
        waiter = queues.join(a.node, a.pod_uid or f"{a.pod_namespace}/{a.pod_name}")
        held: LockHeld | None = None
        try:
            while True:
                await self._await_turn(a, waiter, deadline, held)
                try:
                    await asyncio.to_thread(self._bind_sync, a, token)
                except LockHeld as e:
                    held = e
                    continue
                queues.leave(waiter, got_lock=True)
                return
        finally:
            queues.leave(waiter)

    async def _await_turn(self, a: BindArgs, waiter: Any, deadline: float, held: LockHeld | None) -> None:
        """Wait for `waiter`'s turn; raise the bind's failure when the wait ends without one."""
        why = await self.lock_queues.turn(waiter, deadline)
        if why is None:
            return None
        who = f"pod {a.pod_namespace}/{a.pod_name}"
        if why == "gone":
            raise BindFailure(
                "pod_gone", f"binding {who} to {a.node} failed: the pod was deleted while waiting for the node lock"
            )
        waited = f"waited {self.settings.bind_lock_wait_s:g}s for it (--bind-lock-wait)"
        if held is not None:
            raise LockHeld("lock", f"{held}; {waited}")
        raise LockHeld(
            "lock", f"binding {who} to {a.node} failed: other pods were still waiting for the node lock; {waited}"
        )

    def _bind_sync(self, a: BindArgs, token: int | None = None) -> None:
        """One bind attempt; its API writes only while `token`'s leadership term lasts (`TermGuard`)."""
        with self.term_guard.writing(token) as current:
            if not current:
                raise BindFailure(
                    "not_ready", f"binding pod {a.pod_namespace}/{a.pod_name} failed: leadership ended; the "
                    "new leader will filter it again",
                )  # fmt: skip
            self._bind_in_term(a)

    def _bind_in_term(self, a: BindArgs) -> None:
        ns, name, uid, node = a.pod_namespace, a.pod_name, a.pod_uid, a.node
        who = f"pod {ns}/{name}"
        if not uid and self.client is not None:
            # Callers that leave PodUID out: the reservation is keyed by UID, so look it up.
            try:
                pod = self.client.get_pod(ns, name)
            except HamiError as e:
                raise BindFailure("bind", f"binding {who} failed: cannot read the pod: {e}") from None
            if pod is None:
                raise BindFailure("pod_gone", f"binding {who} to {node} failed: the pod no longer exists")
            uid = (pod.get("metadata") or {}).get("uid", "")
            a = BindArgs(name, ns, uid, node)
        if self._recorder is not None and uid:
            error = self.wait_recorded(uid, timeout_s=30.0)
            if error is not None:
                raise BindFailure("record", f"binding {who} to {node} failed: {error}")
        cached = self.pod_lookup(ns, name)
        if cached is not None and (not uid or (cached.get("metadata") or {}).get("uid") == uid):
            bound = (cached.get("spec") or {}).get("nodeName")
            if bound == node:
                return  # a retried bind of a pod that is already bound: nothing to take again
            if bound:
                raise BindFailure(
                    "bind", f"binding {who} to {node} failed: the pod is already bound to {bound}"
                )
        reserved = self.state.pod_node(uid) if uid else None
        if self.settings.filter_mode == "all" and reserved != node and uid and self.client is not None:
            # --filter-mode all: the cards are decided now, for the node kube-scheduler picked.
            cached = self._place_at_bind(a, cached)
            reserved = node
        if reserved is not None and reserved != node:
            raise BindFailure(
                "no_reservation",
                f"{who} was filtered onto node {reserved}, not {node}; it will be filtered again",
            )
        if reserved is None and self._already_bound(a):
            return
        if self.client is None:
            return
        try:
            if pod_takes_node_lock(cached, self.state.vendors):
                lock_node(
                    self.client, node, namespace=ns, pod_name=name, uid=uid or None,
                    expiry_s=self.settings.node_lock_expiry_s,
                    cached=self.node_lookup(node), mutexes=self.node_mutexes,
                )  # fmt: skip
        except NodeLockContention as e:
            raise LockHeld("lock", f"binding {who} to {node} failed: {e}") from None
        except NotFound:
            self._release_reservation(uid)
            raise BindFailure(
                "node_gone",
                f"binding {who} failed: node {node} no longer exists; the reservation was released",
            ) from None
        except HamiError as e:
            raise BindFailure(
                "lock", f"binding {who} failed: cannot take the lock of node {node}: {e}"
            ) from None
        try:
            why = self.state.node_unusable_reason(node)
            if why is not None and why.startswith("node unregistered"):
                # The node (or its registration) went away while we held the lock: the API server would
                # still accept the Binding, but nothing on that node can allocate the cards.
                self._unlock(node, ns, name)
                self._release_reservation(uid)
                raise BindFailure(
                    "node_gone",
                    f"binding {who} failed: node {node} no longer exists; the reservation was released",
                )
            # bind-phase and bind-time ride on the Binding: the API server writes them together with
            # spec.nodeName, so the device plugin never sees one without the other.
            self.client.bind_pod(
                ns,
                name,
                uid=uid or None,
                node=node,
                annotations={A.BIND_PHASE: A.BindPhase.ALLOCATING.value, A.BIND_TIME: str(int(time.time()))},
            )
        except (NotFound, Conflict) as e:
            self._unlock(node, ns, name)
            gone = isinstance(e, NotFound) or self._pod_gone(ns, name, uid)
            if gone:
                self._release_reservation(uid)
                raise BindFailure(
                    "pod_gone",
                    f"binding {who} to {node} failed: the pod was deleted (or re-created) after filtering; "
                    "its reservation and the node lock were released",
                ) from None
            raise BindFailure(
                "bind", f"binding {who} to {node} failed: {e}; the node lock was released"
            ) from None
        except HamiError as e:
            self._unlock(node, ns, name)
            raise BindFailure(
                "bind", f"binding {who} to {node} failed: {e}; the node lock was released"
            ) from None
        self.events.emit(
            ev.pod_ref(ns, name, uid),
            reason=ev.BINDING_SUCCEED,
            message=ev.binding_succeed_message(node, ns, name),
        )

    def _place_at_bind(self, a: BindArgs, cached: dict[str, Any] | None) -> dict[str, Any]:
        """``--filter-mode all``: choose and reserve the cards on `a.node`, record them on the pod.

        Returns the pod. Raises BindFailure when the pod is gone, no longer fits on the node (another
        pod took the capacity since /filter), or the placement could not be written (the reservation
        is released then).
        """
        ns, name, uid, node = a.pod_namespace, a.pod_name, a.pod_uid, a.node
        who = f"pod {ns}/{name}"
        pod = cached
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            try:
                pod = self.client.get_pod(ns, name)
            except HamiError as e:
                raise BindFailure("bind", f"binding {who} failed: cannot read the pod: {e}") from None
        if pod is None or (pod.get("metadata") or {}).get("uid") != uid:
            raise BindFailure("pod_gone", f"binding {who} to {node} failed: the pod no longer exists")
        with self.inflight.lock:
            outcome = self.state.filter(pod, [node])
            if outcome.node == node:
                self.inflight.expect(uid, outcome.annotations)
        if outcome.error:
            raise BindFailure("invalid_pod", f"binding {who} to {node} failed: {outcome.error}")
        if outcome.node != node:
            why = outcome.failed_nodes.get(node, "no fit")
            raise BindFailure(
                "no_fit", f"binding {who} to {node} failed: it no longer fits there ({why}); it will be scheduled again"
            )
        error = self._record(pod, outcome)
        if error is not None:
            self._release_reservation(uid)
            raise BindFailure("record", f"binding {who} to {node} failed: {error}")
        cards = [d.uuid for lst in outcome.devices.values() for c in lst for d in c]
        self.events.emit(pod, reason=ev.FILTERING_SUCCEED, message=ev.filtering_succeed_message(node, cards, 0))
        return pod

    def _already_bound(self, a: BindArgs) -> bool:
        """No reservation for this pod UID: True for a pod already bound to the node (a retried bind),
        else BindFailure explaining why there is nothing to bind."""
        who = f"pod {a.pod_namespace}/{a.pod_name}"
        if self.client is None:
            raise BindFailure("no_reservation", f"{who} has no device reservation; it will be filtered again")
        try:
            pod = self.client.get_pod(a.pod_namespace, a.pod_name)
        except HamiError as e:
            raise BindFailure("bind", f"binding {who} failed: cannot read the pod: {e}") from None
        if pod is None or (a.pod_uid and (pod.get("metadata") or {}).get("uid") != a.pod_uid):
            raise BindFailure("pod_gone", f"binding {who} to {a.node} failed: the pod no longer exists")
        if (pod.get("spec") or {}).get("nodeName") == a.node:
            return True
        raise BindFailure(
            "no_reservation",
            f"{who} has no device reservation on node {a.node} (reservation expired or the extender "
            "restarted before recording it); it will be filtered again",
        )

    def _pod_gone(self, ns: str, name: str, uid: str) -> bool:
        try:
            pod = self.client.get_pod(ns, name)
        except HamiError:
            return False
        return pod is None or bool(uid and (pod.get("metadata") or {}).get("uid") != uid)

    def _release_reservation(self, uid: str) -> None:
        if uid:
            self.state.release_reservation(uid)
            self.inflight.forget(uid)

    def _unlock(self, node: str, ns: str, name: str) -> None:
        try:
            release_node_lock(self.client, node, namespace=ns, pod_name=name, mutexes=self.node_mutexes)
        except HamiError as e:
            log.warning("node %s: lock of pod %s/%s not released: %s (it expires)", node, ns, name, e)


def _pod_name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
