"""The extender's /filter and /prioritize verbs: decide + reserve (ClusterState) + record (one pod patch).

Rules this module keeps (k8s-protocols §1.2/§1.8, hami-legacy-spec §2.3/§2.7):

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
  reply; bind waits for it (`FilterVerbs.wait_recorded`) and fails (reservation released) if it failed,
  so a pod is never bound before its placement is on it.
  For a pod placed by an earlier filter that now fits nowhere, that one patch removes the stale
  allocation instead. Events are queued, never awaited. Decisions and pod events are serialised
  through `sync.Inflight`, so a late event cannot undo a newer reservation.

`FilterVerbs` is a mixin of `scheduler_extender.service.Extender`, which holds the shared state; the
bind verb is in `scheduler_extender.binding`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from hami import annotations as A
from hami.cluster import FilterOutcome
from hami.errors import Conflict, HamiError, InvalidRequest, NotFound
from scheduler_extender import events as ev
from scheduler_extender.candidates import fitting_nodes, prioritize_scores
from scheduler_extender.verb_state import VerbState
from scheduler_extender.wire import FilterArgs, filter_result, parse_filter_args

if TYPE_CHECKING:
    pass

# The logger keeps the name it had before the verbs were split out of service.py: log filters and
# documented transcripts name it.
log = logging.getLogger("scheduler_extender.service")


class FilterVerbs(VerbState):
    """/filter and /prioritize of `scheduler_extender.service.Extender` (a mixin: no state of its own)."""

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
            elif self._recorder is not None:
                result = await asyncio.to_thread(self._filter_sync, args, token)
            else:
                result = await self._filter_async(args, token)
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
        fitting = set(fits)
        failed = {n: outcome.failed_nodes.get(n, "no fit") for n in args.names if n not in fitting}
        containers = self._containers(pod)
        if not fits:
            self.metrics.filter_failed("no_fit")
            self.metrics.filters.labels("unschedulable").inc()
            self.events.emit(
                pod, reason=ev.FILTERING_FAILED,
                message=ev.filtering_failed_message(failed, containers=containers), warning=True,
            )  # fmt: skip
            return filter_result(args, passed=[], failed=ev.failed_nodes_words(failed, containers))
        self.metrics.filters.labels("placed").inc()
        return filter_result(args, passed=fits, failed=ev.failed_nodes_words(failed, containers))

    def _containers(self, pod: dict[str, Any]) -> list[Any]:
        """The pod's device requests per container, for the reasons' sentences ([] when unreadable)."""
        try:
            return self.state.pod_requests(pod)
        except InvalidRequest:
            return []

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

    async def _filter_async(self, args: FilterArgs, token: int | None) -> dict[str, Any]:
        """The default filter on the event loop: the decision here (no thread hand-off), the one pod
        patch through the client's coroutine. While a relist holds the pod watch's lock (a rebuild
        takes seconds at fleet size) the decision waits in a worker thread, so the loop keeps serving."""
        if self.inflight.lock.acquire(blocking=False):
            try:
                step = self._filter_decide(args, token)
            finally:
                self.inflight.lock.release()
        else:
            step = await asyncio.to_thread(self._filter_decide, args, token)
        if isinstance(step, dict):
            return step
        result, pod, outcome, succeed = step
        if outcome is None:
            await self._aclear(pod, token)
            return result
        with self.term_guard.writing(token) as current:
            error = await self._arecord(pod, outcome) if current else _TERM_ENDED
        if not self._settle(pod, error, succeed):
            return filter_result(args, error=self._last_error(pod["metadata"]["uid"]))
        self.metrics.filters.labels("placed").inc()
        return result

    def _filter_sync(self, args: FilterArgs, token: int | None = None) -> dict[str, Any]:
        step = self._filter_decide(args, token)
        if isinstance(step, dict):
            return step
        result, pod, outcome, succeed = step
        if outcome is None:
            self._clear(pod, token)
            return result
        meta = pod["metadata"]
        if self._recorder is not None:
            uid = meta["uid"]
            with self._pending_lock:
                self._record_errors.pop(uid, None)
                future = self._recorder.submit(self._record_and_settle, pod, outcome, succeed, token)
                self._pending[uid] = future
            future.add_done_callback(lambda _f, uid=uid: self._record_done(uid, _f))
            self.metrics.filters.labels("placed").inc()
            return result
        if not self._record_and_settle(pod, outcome, succeed, token):
            return filter_result(args, error=self._last_error(meta["uid"]))
        self.metrics.filters.labels("placed").inc()
        return result

    def _filter_decide(
        self, args: FilterArgs, token: int | None = None
    ) -> dict[str, Any] | tuple[dict[str, Any], dict[str, Any], FilterOutcome | None, str]:
        """Decide and reserve (no API call): the final reply, or ``(reply, pod, outcome, event text)``
        when a write must follow: the placement to record (`outcome`), or with `outcome` None the
        stale allocation of a pod that now fits nowhere to clear (`_clear`)."""
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
            seen = meta.get("resourceVersion")  # events of this version or older predate the write
            if outcome.node is not None:
                self.inflight.expect(meta["uid"], outcome.annotations, after=seen)
            elif placed_before and not outcome.error and not outcome.no_devices:
                self.inflight.expect(meta["uid"], self._cleared(), after=seen)
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
        # The reasons in words too ("needs 2 distinct cards, node has 1"), in the event and in the
        # reply's FailedNodes (kube-scheduler's FailedScheduling event shows those): what users read.
        containers = self._containers(pod)
        if outcome.node is None:
            for n in args.names:
                failed.setdefault(n, "no fit")
            self.metrics.filter_failed("no_fit")
            self.metrics.filters.labels("unschedulable").inc()
            self.events.emit(
                pod,
                reason=ev.FILTERING_FAILED,
                message=ev.filtering_failed_message(failed, containers=containers),
                warning=True,
            )
            reply = filter_result(args, passed=[], failed=ev.failed_nodes_words(failed, containers))
            return (reply, pod, None, "") if placed_before else reply
        failed = ev.failed_nodes_words(failed, containers)
        chosen_reason = f"node {outcome.node} chosen"  # one string for every other candidate
        for n in args.names:
            if n not in failed and n != outcome.node:
                failed[n] = chosen_reason
        cards = [d.uuid for lst in outcome.devices.values() for c in lst for d in c]
        succeed = ev.filtering_succeed_message(outcome.node, cards, len(failed))
        return filter_result(args, passed=[outcome.node], failed=failed), pod, outcome, succeed

    def _record_and_settle(
        self, pod: dict[str, Any], outcome: FilterOutcome, succeed: str, token: int | None = None
    ) -> bool:
        """Write the placement; on failure release the reservation, count and report it. True when written.

        Nothing is written when the leadership term of `token` (`TermGuard`) ended since the filter
        began: the next leader decides from the annotations, which must not change under it.
        The error text is kept for `wait_recorded` / `_last_error` (bounded to the last 1000 pods).
        """
        with self.term_guard.writing(token) as current:
            error = self._record(pod, outcome) if current else _TERM_ENDED
        return self._settle(pod, error, succeed)

    def _settle(self, pod: dict[str, Any], error: str | None, succeed: str) -> bool:
        """After the placement write: the success event, or release, count and report its `error`."""
        uid = pod["metadata"]["uid"]
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
                    meta.get("namespace") or "default", meta["name"], annotations=self._cleared(),
                    labels={A.ASSIGNED_NODE: None}, uid=meta["uid"],
                )  # fmt: skip
        except HamiError as e:
            self._not_cleared(pod, e)

    async def _aclear(self, pod: dict[str, Any], token: int | None = None) -> None:
        """`_clear` through the client's coroutine, on the event loop."""
        if self.client is None:
            return
        meta = pod["metadata"]
        try:
            with self.term_guard.writing(token) as current:
                if not current:
                    self.inflight.forget(meta["uid"])
                    return
                await self.client.apatch_pod_metadata(
                    meta.get("namespace") or "default", meta["name"], annotations=self._cleared(),
                    labels={A.ASSIGNED_NODE: None}, uid=meta["uid"],
                )  # fmt: skip
        except HamiError as e:
            self._not_cleared(pod, e)

    def _not_cleared(self, pod: dict[str, Any], e: HamiError) -> None:
        self.inflight.forget(pod["metadata"]["uid"])
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
        except HamiError as e:
            return _record_error(e, ns, name, outcome.node)
        return None

    async def _arecord(self, pod: dict[str, Any], outcome: FilterOutcome) -> str | None:
        """`_record` through the client's coroutine, on the event loop."""
        if self.client is None:
            return None
        meta = pod["metadata"]
        ns, name = meta.get("namespace") or "default", meta["name"]
        try:
            await self.client.apatch_pod_metadata(
                ns, name, annotations=outcome.annotations, labels=outcome.labels, uid=meta["uid"]
            )
        except HamiError as e:
            return _record_error(e, ns, name, outcome.node)
        return None


#: Why a placement was not written when the leadership term ended before the write (`TermGuard`).
_TERM_ENDED = (
    "leadership ended while this filter was running; the placement was not recorded "
    "and the pod will be filtered again by the new leader"
)


def _record_error(e: HamiError, ns: str, name: str, node: str | None) -> str:
    """The reply's and the event's text for a placement write that failed with `e`."""
    if isinstance(e, NotFound):
        return f"pod {ns}/{name} no longer exists; its device reservation on {node} was released"
    if isinstance(e, Conflict):
        return (
            f"pod {ns}/{name} was re-created (UID changed) while being filtered; "
            "its device reservation was released and it will be filtered again"
        )
    return f"recording the placement on pod {ns}/{name} failed ({e}); the reservation was released"


def _pod_name(pod: dict[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name')}"
