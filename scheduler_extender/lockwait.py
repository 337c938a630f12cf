"""Lock pipelining: binds that find a node's lock held wait for it in a per-node FIFO instead of failing.

Why: the node lock (`hami.nodelock`) lets one pod per node be between Bind and the device plugin's
Allocate. HAMi fails a Bind that finds the lock held; kube-scheduler then backs the pod off (1 s
doubling to 10 s, or parks it as unschedulable), so a burst of pods onto few nodes starts at the pace
of the backoff, not of Allocate. Here such a Bind waits - at most ``--bind-lock-wait`` seconds, which
must stay below kube-scheduler's extender ``httpTimeout`` - and takes the lock the moment the device
plugin releases it. Only then does it fail, exactly as before.

How: every node with waiters has a FIFO of `Waiter` objects on the server's event loop (an asyncio
event each: no thread per waiter), ordered by ticket. Only the head of a queue tries the lock, one try
at a time, and only after something that could have freed it happened since the last try: the node
watch saw the lock removed, the owner pod was deleted, finished, or reported Allocate done, a relist
of nodes or pods (the watch was down: what it missed is unknown), or the holder's lock reached its
expiry (`LockQueues.retry_later` arms a timer for it) (`notify`). A bind arriving while others wait
joins the tail without trying, so the order is first come, first served. A waiter whose pod is deleted
leaves the queue at once (`pod_gone`). The reflector threads call `notify` / `pod_gone` / `notify_all`;
they hand over to the event loop with ``call_soon_threadsafe`` and cost nothing without waiters.

Under load: every handoff is timed (the interval between two takes of the node's lock, an average of
the recent ones is the node's pace). A waiter whose place in the queue times the pace exceeds what is
left of its wait is told at once (`turn` answers ``"hopeless"``), so kube-scheduler's backoff starts
now rather than after the whole wait; it keeps its ticket (`PLACE_TTL_S`), and the pod's next bind
onto that node re-enters the queue at its old place, ahead of the binds that came after it. A lock
release wakes the head only: its cost does not grow with the number of waiters.

HAMi v2.10's ``--node-lock-retry-timeout`` (28 s, PodGroup members only, retried every 100 ms) is the
same budget; this extender applies it to every pod and wakes on the watch instead of polling.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami.pods import TERMINAL_PHASES

#: Seconds a waiter that gave up keeps its place for the pod's next bind onto the same node: above
#: kube-scheduler's longest backoff (podMaxBackoffSeconds, 10 s) plus a scheduling cycle.
PLACE_TTL_S = 60.0
#: Places kept at most (the oldest go first).
MAX_PLACES = 10_000
#: Weight of the newest handoff interval in the node's pace (an exponential average).
PACE_WEIGHT = 0.3
#: Seconds between two looks of one waiter at its chances, at least (each look walks the queue ahead).
MIN_CHECK_S = 0.5
#: A waiter is told early when the binds ahead of it, at the node's pace times this, take longer than
#: what is left of its wait: the pace is an average of the recent handoffs, and under CPU contention
#: the next ones tend to be slower, so a wait that would just fit usually ends in a timeout.
HOPELESS_MARGIN = 1.25
#: Seconds between two looks of a waiter at the node's pace while none was measured yet.
UNKNOWN_PACE_CHECK_S = 2.0
#: Seconds after the holder's computed expiry at which its waiter tries again.
EXPIRY_MARGIN_S = 0.05


@dataclass(eq=False)
class Waiter:
    """One bind waiting for the lock of `node` for pod `uid`; `ticket` orders the node's queue.

    `gone`: its pod was deleted (it leaves with that reason). `left`: it is out of the queue (a lazily
    removed entry until it reaches the head). `waited`: it found the lock held or waited for its
    turn (its take is a handoff, timed for the node's pace). `ahead`,
    `expected_s`: what the last look at its chances found (the binds ahead, the seconds they take).
    """

    node: str
    uid: str
    ticket: int
    gone: bool = False
    left: bool = False
    waited: bool = False
    check_at: float = 0.0
    ahead: int = 0
    expected_s: float = 0.0
    event: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(eq=False)
class _Queue:
    """One node's waiters: new tickets in `fresh` (ascending), returning ones in the heap `back`."""

    fresh: deque[Waiter] = field(default_factory=deque)
    back: list[tuple[int, int, Waiter]] = field(default_factory=list)  # (ticket, join count, waiter)
    live: int = 0
    # A release (or anything that may have freed the lock) was seen since the last try began.
    released: bool = True
    trying: Waiter | None = None
    holder_since: float | None = None  # loop time the current holder took the lock, when known
    pace_s: float | None = None
    expiry_timer: asyncio.TimerHandle | None = None

    def head(self) -> Waiter | None:
        fresh, back = self.fresh, self.back
        while fresh and fresh[0].left:
            fresh.popleft()
        while back and back[0][2].left:
            heapq.heappop(back)
        if not fresh:
            return back[0][2] if back else None
        if back and back[0][0] < fresh[0].ticket:
            return back[0][2]
        return fresh[0]

    def ahead_of(self, waiter: Waiter) -> int:
        """Waiters before `waiter` in the queue (walks those, not the whole queue)."""
        n = 0
        for w in self.fresh:
            if w.ticket >= waiter.ticket:
                break
            n += not w.left
        return n + sum(1 for t, _, w in self.back if t < waiter.ticket and not w.left)


class LockQueues:
    """The per-node FIFOs of binds waiting for a node lock. Owned by one `Extender`, one event loop.

    `notify(node)`, `notify_all()` and `pod_gone(uid)` may be called from any thread; the other methods
    run on the loop that `attach` (or the first `join`) recorded.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, _Queue] = {}
        self._by_uid: dict[str, list[Waiter]] = {}
        self._tickets = itertools.count()
        self._joins = itertools.count()
        # pod UID -> (node, ticket, forget at): places of waiters that gave up, for the pod's next bind.
        self._places: OrderedDict[str, tuple[str, int, float]] = OrderedDict()
        # node -> loop time of the last take of its lock through a queue (the holder's start, for the
        # pace of the first handoff of a backlog); entries go after PLACE_TTL_S.
        self._taken_at: OrderedDict[str, float] = OrderedDict()
        self.handoffs = 0  # binds that got the lock after waiting for it (tests, the benchmark)
        self.told_early = 0  # waiters told at once that their wait could not end in time

    # -- any thread ----------------------------------------------------------------------------------

    def notify(self, node: str) -> None:
        """Something that may free `node`'s lock happened (lock removed, owner gone or done)."""
        loop = self._loop
        if loop is not None and node in self._queues:
            try:
                loop.call_soon_threadsafe(self._notified, node)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def notify_all(self) -> None:
        """A relist: any lock may have been released while the watch was down; every head looks again."""
        loop = self._loop
        if loop is not None and self._queues:
            try:
                loop.call_soon_threadsafe(self._notified_all)
            except RuntimeError:
                pass

    def pod_gone(self, uid: str) -> None:
        """Pod `uid` was deleted: its waiter (if any) leaves the queue, and its kept place is dropped."""
        loop = self._loop
        if loop is not None and uid and (self._queues or self._places):
            try:
                loop.call_soon_threadsafe(self._gone, uid)
            except RuntimeError:
                pass

    @property
    def active(self) -> bool:
        """Whether any bind waits (the watch callbacks skip all work otherwise)."""
        return bool(self._queues) or bool(self._places)

    def waiting(self, node: str | None = None) -> int:
        """Binds waiting for `node`'s lock (all nodes when None)."""
        if node is not None:
            q = self._queues.get(node)
            return q.live if q is not None else 0
        return sum(q.live for q in list(self._queues.values()))

    def pace_s(self, node: str) -> float | None:
        """The recent seconds per handoff of `node`'s lock while binds waited, None before the first."""
        q = self._queues.get(node)
        return None if q is None else q.pace_s

    # -- the event loop ------------------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def join(self, node: str, uid: str) -> Waiter:
        """Queue a bind for `node`'s lock, before its first try: at the tail, or at the place the pod
        kept when its previous bind onto `node` gave up.

        Alone in the queue, its first `turn` comes at once; behind others it waits to be the head and
        for a release seen after the last try.
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        now = self._loop.time()
        self._forget_places(now)
        q = self._queues.get(node)
        if q is None:
            q = self._queues[node] = _Queue(holder_since=self._taken_at.get(node))
        kept = self._places.pop(uid, None)
        if kept is not None and kept[0] == node:
            waiter = Waiter(node=node, uid=uid, ticket=kept[1])
            # The join count breaks ties: a left entry of the same ticket may still be in the heap.
            heapq.heappush(q.back, (waiter.ticket, next(self._joins), waiter))
        else:
            waiter = Waiter(node=node, uid=uid, ticket=next(self._tickets))
            q.fresh.append(waiter)
        q.live += 1
        self._by_uid.setdefault(uid, []).append(waiter)
        return waiter

    async def turn(self, waiter: Waiter, deadline: float) -> str | None:
        """Wait until `waiter` may try the lock: None, then try it and call `leave` or `retry_later`.

        Returns "timeout" when `deadline` (loop time) passed first, "gone" when its pod was deleted,
        "hopeless" when the binds ahead of it take longer than what is left at the node's pace
        (`waiter.ahead`, `waiter.expected_s` say how many and how long).
        """
        loop = asyncio.get_running_loop()
        while True:
            if waiter.gone:
                return "gone"
            q = self._queues.get(waiter.node)
            if q is None:
                return "gone"
            if q.trying is None and q.released and q.head() is waiter:
                q.released = False
                q.trying = waiter
                return None
            now = loop.time()
            remaining = deadline - now
            if remaining <= 0:
                return "timeout"
            # Before the node's first timed handoff nothing is known: look again every UNKNOWN_PACE_CHECK_S.
            wait_s = min(remaining, UNKNOWN_PACE_CHECK_S)
            if q.pace_s is not None:
                if now >= waiter.check_at:
                    waiter.ahead = q.ahead_of(waiter)
                    waiter.expected_s = self._expected_s(q, waiter.ahead, now)
                    if waiter.expected_s * HOPELESS_MARGIN > remaining:
                        return "hopeless"
                    slack = remaining - waiter.expected_s * HOPELESS_MARGIN
                    waiter.check_at = now + max(slack, q.pace_s, MIN_CHECK_S)
                wait_s = min(remaining, waiter.check_at - now)
            waiter.waited = True
            waiter.event.clear()
            try:
                await asyncio.wait_for(waiter.event.wait(), wait_s)
            except TimeoutError:
                pass  # the loop decides: the deadline, or a new look at its chances

    def retry_later(self, waiter: Waiter, *, expires_in_s: float | None = None) -> None:
        """`waiter`'s try found the lock held: it waits for the next release, or for the holder's
        expiry `expires_in_s` seconds from now (a timer wakes the head then)."""
        waiter.waited = True
        q = self._queues.get(waiter.node)
        if q is None:
            return
        if q.trying is waiter:
            q.trying = None
        loop = asyncio.get_running_loop()
        if expires_in_s is not None:
            if q.expiry_timer is not None:
                q.expiry_timer.cancel()
            q.expiry_timer = loop.call_later(
                max(expires_in_s, 0.0) + EXPIRY_MARGIN_S, self._expired, waiter.node
            )
        if q.released:
            self._wake_head(q)  # something happened during the try: the head looks again

    def leave(self, waiter: Waiter, *, got_lock: bool = False, keep_place: bool = False) -> None:
        """`waiter` is done (lock taken, timed out, pod gone, other failure); the next one moves up.

        `keep_place`: it gave up waiting (timeout, hopeless): its ticket is kept for the pod's next
        bind onto this node (`PLACE_TTL_S`).
        """
        if waiter.left:
            return
        waiter.left = True
        same = self._by_uid.get(waiter.uid)
        if same is not None:
            same[:] = [w for w in same if w is not waiter]
            if not same:
                del self._by_uid[waiter.uid]
        q = self._queues.get(waiter.node)
        if q is None:
            return
        q.live -= 1
        loop = asyncio.get_running_loop()
        if q.trying is waiter:
            q.trying = None
        if got_lock:
            now = loop.time()
            if waiter.waited:
                self.handoffs += 1
                if q.holder_since is not None:
                    sample = now - q.holder_since
                    q.pace_s = (
                        sample if q.pace_s is None else (1 - PACE_WEIGHT) * q.pace_s + PACE_WEIGHT * sample
                    )
            q.holder_since = now
            self._taken_at[waiter.node] = now
            self._taken_at.move_to_end(waiter.node)
            # The release it consumed freed the lock for it alone: the others wait for the next one.
            q.released = False
            if q.expiry_timer is not None:
                q.expiry_timer.cancel()
                q.expiry_timer = None
        elif keep_place and not waiter.gone:
            self._places[waiter.uid] = (waiter.node, waiter.ticket, loop.time() + PLACE_TTL_S)
            while len(self._places) > MAX_PLACES:
                self._places.popitem(last=False)
        if q.live == 0:
            if q.expiry_timer is not None:
                q.expiry_timer.cancel()
            del self._queues[waiter.node]
            return
        # The new head re-checks: it tries at once if a release was seen while the old head held the
        # turn, else it waits for the next one (the old head may have just taken the lock).
        self._wake_head(q)

    @staticmethod
    def _expected_s(q: _Queue, ahead: int, now: float) -> float:
        """Seconds until a waiter with `ahead` binds before it gets the lock, at the node's pace."""
        pace = q.pace_s or 0.0
        held = now - q.holder_since if q.holder_since is not None else 0.0
        return max(pace - held, 0.0) + ahead * pace

    def _wake_head(self, q: _Queue) -> None:
        head = q.head()
        if head is not None:
            head.event.set()

    def _notified(self, node: str) -> None:
        q = self._queues.get(node)
        if q is None:
            return
        q.released = True
        if q.trying is None:
            self._wake_head(q)

    def _notified_all(self) -> None:
        for node in list(self._queues):
            self._notified(node)

    def _expired(self, node: str) -> None:
        q = self._queues.get(node)
        if q is not None:
            q.expiry_timer = None
            self._notified(node)

    def _gone(self, uid: str) -> None:
        self._places.pop(uid, None)
        for waiter in list(self._by_uid.get(uid, ())):
            waiter.gone = True
            waiter.event.set()

    def _forget_places(self, now: float) -> None:
        places = self._places
        while places:
            first = next(iter(places))
            if places[first][2] > now:
                break
            del places[first]
        taken = self._taken_at
        while taken:
            first = next(iter(taken))
            if taken[first] + PLACE_TTL_S > now:
                break
            del taken[first]


def lock_freed(old: dict[str, Any], new: dict[str, Any]) -> bool:
    """Whether a Node update removed its ``hami.io/mutex.lock`` (the device plugin's release)."""
    old_lock = ((old.get("metadata") or {}).get("annotations") or {}).get(A.NODE_LOCK)
    new_lock = ((new.get("metadata") or {}).get("annotations") or {}).get(A.NODE_LOCK)
    return bool(old_lock) and not new_lock


def owner_done_node(old: dict[str, Any] | None, new: dict[str, Any]) -> str | None:
    """The node whose lock a pod update may have made dangling, or None.

    A pod that just finished (terminal phase) or whose ``hami.io/bind-phase`` just became
    ``success``/``failed`` no longer needs the lock of the node it is placed on.
    """
    meta = new.get("metadata") or {}
    annos = meta.get("annotations") or {}
    phase = (new.get("status") or {}).get("phase")
    bind_phase = annos.get(A.BIND_PHASE)
    done = phase in TERMINAL_PHASES or bind_phase in (A.BindPhase.SUCCESS.value, A.BindPhase.FAILED.value)
    if not done:
        return None
    if old is not None:
        old_annos = (old.get("metadata") or {}).get("annotations") or {}
        if old_annos.get(A.BIND_PHASE) == bind_phase and (old.get("status") or {}).get("phase") == phase:
            return None  # nothing changed that matters to a waiter
    return placed_node(new)


def placed_node(pod: dict[str, Any]) -> str | None:
    """The node a pod is bound to, else the one its placement annotation names, else None."""
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound:
        return bound
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(A.ASSIGNED_NODE)


__all__ = ["PLACE_TTL_S", "LockQueues", "Waiter", "lock_freed", "owner_done_node", "placed_node"]
