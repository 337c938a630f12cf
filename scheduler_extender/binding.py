"""The extender's /bind verb: node lock + Binding (with the bind-phase annotations), undone on failure.

Rules this module keeps (k8s-protocols §1.2/§1.8, hami-legacy-spec §2.7/§2.9):

* Always an HTTP-200 answer; any failure is the reply's ``Error`` (and a ``BindingFailed`` event).
* Bind takes the node lock (first try from the watched Node, no GET), then creates the Binding, which
  carries ``hami.io/bind-phase: allocating`` and ``hami.io/bind-time`` in its annotations: the API server
  copies them onto the pod in the same write that binds it (two API calls on the happy path).
  A failure after the lock releases the lock (owner-checked); a pod or node
  that is gone also releases the reservation. Other failures keep the reservation: the pod still carries
  its allocation annotations (so a rebuild would count it too) until kube-scheduler filters it again,
  which replaces the reservation, or the pod is deleted (HAMi §2.9). With ``--filter-mode all`` the
  placement is made by bind itself, so a bind that cannot take the node lock drops it (reservation and
  annotations): the next bind places the pod afresh.
* A pod whose devices' plugins take no node lock never waits in a node's lock queue.
* Binding an already-bound pod to the same node succeeds (kube-scheduler may retry after a timeout).
* With ``--async-record`` bind first waits for the filter's placement write and fails if it failed;
  with ``--filter-mode all`` the cards are chosen here, for the node kube-scheduler picked.

`BindVerbs` is a mixin of `scheduler_extender.service.Extender`, which holds the shared state; it uses
the filter side's `wait_recorded` and `_record` (`scheduler_extender.filtering`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from hami import annotations as A
from hami.cluster import FilterOutcome
from hami.errors import Conflict, HamiError, InvalidRequest, NodeLockContention, NotFound
from hami.nodelock import cached_lock_write, lock_node, release_node_lock
from hami.vendors import pod_takes_node_lock
from scheduler_extender import events as ev
from scheduler_extender.verb_state import VerbState
from scheduler_extender.wire import BindArgs, bind_result, parse_bind_args

if TYPE_CHECKING:
    pass

# The logger keeps the name it had before the verbs were split out of service.py: log filters and
# documented transcripts name it.
log = logging.getLogger("scheduler_extender.service")


class BindFailure(Exception):
    """A bind step failed: `reason` is the metric label, the message goes into ``Error`` and the event."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class LockHeld(BindFailure):
    """The node lock is held by another live pod (the bind may wait for it: `Settings.bind_lock_wait_s`).

    `expires_in_s`: seconds until the holder's lock expires (`NodeLockContention.expires_in_s`)."""

    def __init__(self, reason: str, message: str, *, expires_in_s: float | None = None) -> None:
        super().__init__(reason, message)
        self.expires_in_s = expires_in_s


class BindVerbs(VerbState):
    """/bind of `scheduler_extender.service.Extender` (a mixin: no state of its own)."""

    if TYPE_CHECKING:
        # Provided by the filter side (scheduler_extender.filtering.FilterVerbs).
        def wait_recorded(self, uid: str, *, timeout_s: float) -> str | None: ...
        def _record(self, pod: dict[str, Any], outcome: FilterOutcome) -> str | None: ...
        def _cleared(self) -> dict[str, str | None]: ...
        def _clear(self, pod: dict[str, Any], token: int | None = None) -> None: ...

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
        """Bind, waiting in the node's FIFO while its lock is held (`_bind_queued`).

        ``--filter-mode all``: a bind that placed the pod and then could not take the node lock
        releases that placement (the reservation and the annotations), so the capacity is free at once.
        """
        try:
            await self._bind_queued(a, token)
        except BindFailure as e:
            # Only a failure before the Binding (the lock): after it the pod may be bound after all.
            if self.settings.filter_mode == "all" and isinstance(e, LockHeld):
                await asyncio.to_thread(self._unplace, a, token)
            raise

    async def _bind_queued(self, a: BindArgs, token: int | None = None) -> None:
        """Bind; while the node lock is held by another pod, wait in the node's FIFO (lock pipelining).

        A pod that takes no node lock (`hami.vendors.pod_takes_node_lock`) never queues. A bind arriving
        while others wait for the node queues behind them without trying (or at the place its pod kept
        from its previous bind onto the node). The head tries again whenever the watch saw something
        that may have freed the lock, or the holder's lock reached its expiry; after
        `Settings.bind_lock_wait_s` seconds, or at once when the binds ahead of it cannot be done in what
        is left of that at the node's recent pace, or when the pod is deleted, it fails as a bind
        without waiting would.
        """
        budget = self.settings.bind_lock_wait_s
        queues = self.lock_queues
        takes_lock = self.client is not None and await self._takes_lock(a)
        if budget <= 0 or not takes_lock:
            await self._bind_attempt(a, token, takes_lock=takes_lock)
            return
        loop = asyncio.get_running_loop()
        queues.attach(loop)
        deadline = loop.time() + budget
        # Queued before the first try, so that a release seen by the watch while that try is in flight
        # is not lost; alone in the queue it tries at once, behind others it waits for its turn.
        waiter = queues.join(a.node, a.pod_uid or f"{a.pod_namespace}/{a.pod_name}")
        held: LockHeld | None = None
        gave_up = False
        try:
            while True:
                try:
                    await self._await_turn(a, waiter, deadline, held)
                except LockHeld:
                    gave_up = True
                    raise
                try:
                    await self._bind_attempt(a, token, takes_lock=True)
                except LockHeld as e:
                    held = e
                    queues.retry_later(waiter, expires_in_s=e.expires_in_s)
                    continue
                queues.leave(waiter, got_lock=True)
                return
        finally:
            queues.leave(waiter, keep_place=gave_up)

    async def _takes_lock(self, a: BindArgs) -> bool:
        """Whether this bind takes the node lock: False only for a pod of this UID whose devices'
        plugins take none (`pod_takes_node_lock`; its device requests are in its spec, which never
        changes). From the watch cache; for a pod the watch has not delivered yet (a slow watch: the
        filter saw the pod, the bind follows at once), from this process's own filter decision for
        the node, else read from the API server: a lock taken for a pod whose plugin never releases it
        holds the node's next bind until it expires, and such a pod queued behind the lock would wait
        for another pod's Allocate. The safe side (True) when none of them can tell."""
        ns, name, uid = a.pod_namespace, a.pod_name, a.pod_uid
        pod = self.pod_lookup(ns, name)
        if pod is None or (uid and (pod.get("metadata") or {}).get("uid") != uid):
            decided = self._lock_by_decision(uid, a.node)
            if decided is not None:
                return decided
            try:
                pod = await self.client.aget("pods", name, namespace=ns)
            except HamiError as e:
                log.info("pod %s/%s: not read to see whether its bind takes the node lock: %s", ns, name, e)
                return True
            if pod is None or (uid and (pod.get("metadata") or {}).get("uid") != uid):
                return True
        return pod_takes_node_lock(pod, self.state.vendors)

    def _lock_by_decision(self, uid: str, node: str) -> bool | None:
        """Whether pod `uid`'s bind to `node` takes the node lock by this process's filter decision
        (any decided vendor whose plugin uses it), or None without a decision for that node."""
        decided = self.state.decision(uid) if uid else None
        if decided is None or decided[0] != node or not decided[1]:
            return None
        vendors = self.state.vendors
        return any(vendors[v].uses_node_lock if v in vendors else True for v in decided[1])

    async def _await_turn(self, a: BindArgs, waiter: Any, deadline: float, held: LockHeld | None) -> None:
        """Wait for `waiter`'s turn; raise the bind's failure when the wait ends without one."""
        why = await self.lock_queues.turn(waiter, deadline)
        if why is None:
            return None
        who = f"pod {a.pod_namespace}/{a.pod_name}"
        if why == "gone":
            raise BindFailure(
                "pod_gone",
                f"binding {who} to {a.node} failed: the pod was deleted while waiting for the node lock",
            )
        budget = self.settings.bind_lock_wait_s
        if why == "hopeless":
            left = deadline - asyncio.get_running_loop().time()
            pace = self.lock_queues.pace_s(a.node) or 0.0
            ahead = f"{waiter.ahead} bind{'s' if waiter.ahead != 1 else ''} ahead of it"
            text = (
                f"binding {who} to {a.node} failed: the node lock is held and {ahead} in the node's "
                f"queue take about {waiter.expected_s:.0f}s at the recent {pace:.1f}s per bind, more "
                f"than the {left:.0f}s left of its {budget:g}s wait (--bind-lock-wait); it keeps its "
                "place in the queue for its next bind"
            )
            self.lock_queues.told_early += 1
            raise LockHeld("lock", text)
        waited = f"waited {budget:g}s for it (--bind-lock-wait)"
        if held is not None:
            raise LockHeld("lock", f"{held}; {waited}")
        raise LockHeld(
            "lock",
            f"binding {who} to {a.node} failed: other pods were still waiting for the node lock; {waited}",
        )

    async def _bind_attempt(self, a: BindArgs, token: int | None = None, *, takes_lock: bool = True) -> None:
        """One bind attempt on the event loop; its API writes only while `token`'s leadership term
        lasts (`TermGuard`). The happy path's two writes (node lock from the watched Node, Binding) are
        the client's coroutines; the rare steps that block (reads on a stale cache, lock contention,
        undoing) run in a worker thread."""
        with self.term_guard.writing(token) as current:
            if not current:
                raise BindFailure(
                    "not_ready", f"binding pod {a.pod_namespace}/{a.pod_name} failed: leadership ended; the "
                    "new leader will filter it again",
                )  # fmt: skip
            await self._bind_in_term(a, takes_lock)

    async def _bind_in_term(self, a: BindArgs, takes_lock: bool = True) -> None:
        ns, name, uid, node = a.pod_namespace, a.pod_name, a.pod_uid, a.node
        who = f"pod {ns}/{name}"
        if not uid and self.client is not None:
            # Callers that leave PodUID out: the reservation is keyed by UID, so look it up.
            try:
                pod = await self.client.aget("pods", name, namespace=ns)
            except HamiError as e:
                raise BindFailure("bind", f"binding {who} failed: cannot read the pod: {e}") from None
            if pod is None:
                raise BindFailure("pod_gone", f"binding {who} to {node} failed: the pod no longer exists")
            uid = (pod.get("metadata") or {}).get("uid", "")
            a = BindArgs(name, ns, uid, node)
        if self._recorder is not None and uid:
            error = await asyncio.to_thread(self.wait_recorded, uid, timeout_s=30.0)
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
            cached = await asyncio.to_thread(self._place_at_bind, a, cached)
            reserved = node
        if reserved is not None and reserved != node:
            raise BindFailure(
                "no_reservation",
                f"{who} was filtered onto node {reserved}, not {node}; it will be filtered again",
            )
        if reserved is None and await asyncio.to_thread(self._already_bound, a):
            return
        if self.client is None:
            return
        try:
            if takes_lock:  # `_takes_lock`
                # The stamp tells the device plugin which pod UID and which allocation the lock is for.
                decided = self.state.decided_allocations(uid) if uid else {}
                await self._lock_node(
                    node, ns, name, uid, A.encode_allocation_stamp(uid, decided) if decided else None
                )
        except NodeLockContention as e:
            raise LockHeld(
                "lock", f"binding {who} to {node} failed: {e}", expires_in_s=e.expires_in_s
            ) from None
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
                await asyncio.to_thread(self._unlock, node, ns, name)
                self._release_reservation(uid)
                raise BindFailure(
                    "node_gone",
                    f"binding {who} failed: node {node} no longer exists; the reservation was released",
                )
            # bind-phase and bind-time ride on the Binding: the API server writes them together with
            # spec.nodeName, so the device plugin never sees one without the other.
            await self.client.abind_pod(
                ns,
                name,
                uid=uid or None,
                node=node,
                annotations={A.BIND_PHASE: A.BindPhase.ALLOCATING.value, A.BIND_TIME: str(int(time.time()))},
            )
        except (NotFound, Conflict) as e:
            await asyncio.to_thread(self._unlock, node, ns, name)
            gone = isinstance(e, NotFound) or await asyncio.to_thread(self._pod_gone, ns, name, uid)
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
            await asyncio.to_thread(self._unlock, node, ns, name)
            raise BindFailure(
                "bind", f"binding {who} to {node} failed: {e}; the node lock was released"
            ) from None
        self.events.emit(
            ev.pod_ref(ns, name, uid),
            reason=ev.BINDING_SUCCEED,
            message=ev.binding_succeed_message(node, ns, name),
        )

    async def _lock_node(self, node: str, ns: str, name: str, uid: str, stamp: str | None) -> None:
        """`hami.nodelock.lock_node` with its first write from the watched Node sent from the event loop;
        anything else (a live lock in the cache, a stale cache, the node's mutex taken by a thread) goes
        the synchronous way in a worker thread. Raises as `lock_node`."""
        expiry_s = self.settings.node_lock_expiry_s
        cached = self.node_lookup(node)
        write = (
            cached_lock_write(cached, node, namespace=ns, pod_name=name, expiry_s=expiry_s, stamp=stamp)
            if cached is not None
            else None
        )
        if write is not None:
            with self.node_mutexes.try_hold(node) as held:
                if held:
                    try:
                        await self.client.apatch_node_annotations(node, write[0], resource_version=write[1])
                    except Conflict:
                        cached = None  # the cache was behind the API server: the long way reads afresh
                    else:
                        self.node_mutexes.record_owner(node, ns, name, uid or None, expiry_s=expiry_s)
                        return
        await asyncio.to_thread(
            lock_node, self.client, node, namespace=ns, pod_name=name, uid=uid or None, expiry_s=expiry_s,
            cached=cached, mutexes=self.node_mutexes, stamp=stamp,
        )  # fmt: skip

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
                self.inflight.expect(uid, outcome.annotations, after=pod["metadata"].get("resourceVersion"))
        if outcome.error:
            raise BindFailure("invalid_pod", f"binding {who} to {node} failed: {outcome.error}")
        if outcome.node != node:
            why = outcome.failed_nodes.get(node, "no fit")
            raise BindFailure(
                "no_fit",
                f"binding {who} to {node} failed: it no longer fits there ({why}); it will be scheduled again",
            )
        error = self._record(pod, outcome)
        if error is not None:
            self._release_reservation(uid)
            raise BindFailure("record", f"binding {who} to {node} failed: {error}")
        cards = [d.uuid for lst in outcome.devices.values() for c in lst for d in c]
        self.events.emit(
            pod, reason=ev.FILTERING_SUCCEED, message=ev.filtering_succeed_message(node, cards, 0)
        )
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

    def _unplace(self, a: BindArgs, token: int | None = None) -> None:
        """``--filter-mode all``, a failed bind: drop the placement this pod got at bind time - its
        reservation and its allocation annotations (left on the pod, the next pod event or a restart
        would count them again) - unless the pod is bound (then the placement is real)."""
        uid = a.pod_uid
        if not uid or self.state.pod_node(uid) is None:
            return
        cached = self.pod_lookup(a.pod_namespace, a.pod_name)
        if cached is not None and (cached.get("spec") or {}).get("nodeName"):
            return
        with self.inflight.lock:
            self.state.release_reservation(uid)
            self.inflight.expect(
                uid, self._cleared(), after=(cached or {}).get("metadata", {}).get("resourceVersion")
            )
        stub = {"metadata": {"namespace": a.pod_namespace, "name": a.pod_name, "uid": uid}}
        self._clear(stub, token)

    def _release_reservation(self, uid: str) -> None:
        if uid:
            self.state.release_reservation(uid)
            self.inflight.forget(uid)

    def _unlock(self, node: str, ns: str, name: str) -> None:
        try:
            release_node_lock(self.client, node, namespace=ns, pod_name=name, mutexes=self.node_mutexes)
        except HamiError as e:
            log.warning("node %s: lock of pod %s/%s not released: %s (it expires)", node, ns, name, e)
