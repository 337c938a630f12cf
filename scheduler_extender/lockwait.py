"""Lock pipelining: binds that find a node's lock held wait for it in a per-node FIFO instead of failing.

Why: the node lock (`hami.nodelock`) lets one pod per node be between Bind and the device plugin's
Allocate. HAMi fails a Bind that finds the lock held; kube-scheduler then backs the pod off (1 s
doubling to 10 s, or parks it as unschedulable), so a burst of pods onto few nodes starts at the pace
of the backoff, not of Allocate. Here such a Bind waits - at most ``--bind-lock-wait`` seconds, which
must stay below kube-scheduler's extender ``httpTimeout`` - and takes the lock the moment the device
plugin releases it. Only then does it fail, exactly as before.

How: every node with waiters has a FIFO of `Waiter` objects on the server's event loop (an asyncio
event each: no thread per waiter). Only the head of a queue tries the lock, and only after something
that could have freed it happened since its last try: the node watch saw the lock removed, or the
owner pod was deleted, finished, or reported Allocate done (`notify`). A bind arriving while others
wait joins the tail without trying, so the order is first come, first served. A waiter whose pod is
deleted leaves the queue at once (`pod_gone`). The reflector threads call `notify` / `pod_gone`;
both hand over to the event loop with ``call_soon_threadsafe`` and cost nothing for nodes without
waiters.

HAMi v2.10's ``--node-lock-retry-timeout`` (28 s, PodGroup members only, retried every 100 ms) is the
same budget; this extender applies it to every pod and wakes on the watch instead of polling.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hami import annotations as A
from hami.pods import TERMINAL_PHASES


@dataclass(eq=False)
class Waiter:
    """One bind waiting for the lock of `node` for pod `uid`.

    `seen`: the node's notification count at this waiter's last try (one less than the count when it
    may try at once); it tries again once the count moved on and it is at the head. `gone`: its pod was deleted (it leaves with that reason).
    """

    node: str
    uid: str
    seen: int
    gone: bool = False
    left: bool = False
    waited: bool = False
    event: asyncio.Event = field(default_factory=asyncio.Event)


class LockQueues:
    """The per-node FIFOs of binds waiting for a node lock. Owned by one `Extender`, one event loop.

    `notify(node)` and `pod_gone(uid)` may be called from any thread; the other methods run on the
    loop that `attach` (or the first `join`) recorded.
    """

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: dict[str, deque[Waiter]] = {}
        self._generation: dict[str, int] = {}  # node -> notifications seen (only while it has waiters)
        self.handoffs = 0  # binds that got the lock after waiting for it (tests, the benchmark)

    # -- any thread ----------------------------------------------------------------------------------

    def notify(self, node: str) -> None:
        """Something that may free `node`'s lock happened (lock removed, owner gone or done)."""
        loop = self._loop
        if loop is not None and node in self._queues:
            try:
                loop.call_soon_threadsafe(self._notified, node)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def pod_gone(self, uid: str) -> None:
        """Pod `uid` was deleted: its waiter (if any) leaves the queue."""
        loop = self._loop
        if loop is not None and uid and self._queues:
            try:
                loop.call_soon_threadsafe(self._gone, uid)
            except RuntimeError:
                pass

    @property
    def active(self) -> bool:
        """Whether any bind waits (the watch callbacks skip all work otherwise)."""
        return bool(self._queues)

    def waiting(self, node: str | None = None) -> int:
        """Binds waiting for `node`'s lock (all nodes when None)."""
        if node is not None:
            return len(self._queues.get(node, ()))
        return sum(len(q) for q in list(self._queues.values()))

    # -- the event loop ------------------------------------------------------------------------------

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def join(self, node: str, uid: str) -> Waiter:
        """Queue a bind for `node`'s lock at the tail of its FIFO, before its first try.

        Alone in the queue, its first `turn` comes at once; behind others it waits to be the head and
        for a release seen after it joined (the one before was for the binds ahead of it).
        """
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        queue = self._queues.get(node)
        if queue is None:
            queue = self._queues[node] = deque()
            self._generation[node] = 0
        generation = self._generation[node]
        waiter = Waiter(node=node, uid=uid, seen=generation - 1 if not queue else generation)
        queue.append(waiter)
        return waiter

    async def turn(self, waiter: Waiter, deadline: float) -> str | None:
        """Wait until `waiter` is at the head and notified since its last try: None, then try the lock.

        Returns "timeout" when `deadline` (loop time) passed first, "gone" when its pod was deleted.
        """
        loop = asyncio.get_running_loop()
        while True:
            if waiter.gone:
                return "gone"
            queue = self._queues.get(waiter.node)
            generation = self._generation.get(waiter.node, 0)
            if queue and queue[0] is waiter and generation > waiter.seen:
                waiter.seen = generation
                return None
            remaining = deadline - loop.time()
            if remaining <= 0:
                return "timeout"
            waiter.waited = True
            waiter.event.clear()
            try:
                await asyncio.wait_for(waiter.event.wait(), remaining)
            except TimeoutError:
                return "timeout" if not waiter.gone else "gone"

    def leave(self, waiter: Waiter, *, got_lock: bool = False) -> None:
        """`waiter` is done (lock taken, timed out, pod gone, other failure); the next one moves up."""
        queue = self._queues.get(waiter.node)
        if queue is None or waiter.left:
            return
        waiter.left = True
        was_head = bool(queue) and queue[0] is waiter
        try:
            queue.remove(waiter)
        except ValueError:
            return
        if got_lock and waiter.waited:
            self.handoffs += 1
            # The release it consumed freed the lock for it alone: the others wait for the next one.
            generation = self._generation.get(waiter.node, 0)
            for other in queue:
                other.seen = max(other.seen, generation)
        if not queue:
            del self._queues[waiter.node]
            self._generation.pop(waiter.node, None)
        elif was_head:
            # The new head re-checks: it tries at once if a release was seen while the old head held
            # the turn, else it waits for the next one (the old head may have just taken the lock).
            queue[0].event.set()

    def _notified(self, node: str) -> None:
        queue = self._queues.get(node)
        if not queue:
            return
        self._generation[node] = self._generation.get(node, 0) + 1
        queue[0].event.set()

    def _gone(self, uid: str) -> None:
        for queue in list(self._queues.values()):
            for waiter in queue:
                if waiter.uid == uid:
                    waiter.gone = True
                    waiter.event.set()


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


__all__ = ["LockQueues", "Waiter", "lock_freed", "owner_done_node", "placed_node"]
