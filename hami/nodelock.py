"""HAMi's per-node lock (``hami.io/mutex.lock``), held from the scheduler's Bind to the device plugin's Allocate.

Why a lock at all: kubelet's ``Allocate`` call to the device plugin names only device IDs, never the
pod. The device plugin therefore has to guess which pod it is allocating for, and it does so by
looking for the one pod on its node that the scheduler has just bound. If two GPU pods were bound to
one node at the same time, the plugin could hand pod A the cards (and memory limits) chosen for
pod B. The lock makes "being allocated" exclusive per node: Bind takes it before creating the Binding,
the device plugin releases it when the pod's last container was allocated (bind-phase ``success``)
or failed (``failed``).

The value (legacy spec §1.6.5, HAMi-compatible) is ``<RFC3339 time>,<namespace>,<pod name>``, e.g.
``2024-05-10T16:15:30+08:00,default,gpu-pod``; an older form is the time alone (owner unknown).

What the expiry protects against: a pod that takes the lock and then never reaches ``Allocate``
(deleted, rejected by kubelet, scheduler crash between lock and Binding) would block every GPU pod
on that node forever. After `expiry_s` (HAMi: 5 minutes, ``--node-lock-timeout``) anyone may take
the lock over. Improvement over HAMi, which only also reclaims a lock whose owner pod is gone: a lock
whose owner is *provably* no longer between Bind and Allocate is taken over at once -

* the owner pod does not exist (404) or is being deleted;
* the owner pod is terminal (``Succeeded``/``Failed``);
* its ``hami.io/bind-phase`` is already ``success`` or ``failed`` (the device plugin is done with it);
* it is bound to a different node than this lock's node;
* it is not placed on this node at all: neither bound here nor carrying this node in its placement
  annotation ``hami.io/vgpu-node`` (which the scheduler writes at filter time, before any Bind). The
  value names the owner by namespace/name only, so a pod deleted before Allocate and created again
  under the same name (a StatefulSet's ``web-0``) would otherwise pass for the live owner;
* this process took the lock for a pod UID (`NodeMutexes.owner_uid`) and the pod of that name now has
  another UID (a new incarnation placed here again).

An owner pod that is placed here but not yet bound (Bind is still running) or is bound here with
bind-phase ``allocating`` (or none) keeps its lock until expiry.

Concurrency: every write carries the node's ``resourceVersion`` (optimistic concurrency), so of two
schedulers racing for the same node exactly one wins; the loser re-reads and sees contention. Writes
in one process are also serialised per node through the caller's `NodeMutexes`. Re-locking by the owner pod succeeds (re-entrant), and
release checks the owner, so nobody frees a lock held by someone else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from datetime import UTC, datetime
from typing import Any

from hami.annotations import (
    ASSIGNED_NODE,
    BIND_PHASE,
    NODE_LOCK,
    NODE_LOCK_ALLOCATION,
    BindPhase,
    NodeLock,
    decode_node_lock,
    encode_node_lock,
)
from hami.errors import AnnotationError, Conflict, NodeLockContention, NotFound
from hami.kube.retry import Backoff, retry_call
from hami.pods import TERMINAL_PHASES

log = logging.getLogger(__name__)

NODE_LOCK_EXPIRY_S = 300.0  # HAMi's --node-lock-timeout default (5 minutes)
#: Optimistic-concurrency retries after the first try.
RETRY_STEPS = 5
#: The first conflict is retried at once: with one active scheduler the other writers of a node are
#: its device plugin releasing the lock and the handshake stamps, so a fresh read usually finds the
#: node free. Repeated conflicts back off as HAMi does (100 ms, x2, jitter 0.5).
RETRY_BACKOFF = Backoff(0.1, factor=2.0, jitter=0.5, immediate_first=True)


class NodeMutexes:
    """In-process mutual exclusion per node name, so one process's lockers of a node take turns.

    Without it, two binds of one extender racing for the same node would both read, both write, and
    one would lose on the resourceVersion precondition only to retry: correct, but wasted API calls.
    Across processes the precondition alone decides. The owner (the extender) creates one table and
    passes it to every `lock_node`/`release_node_lock` call; a caller that passes none gets no
    in-process serialisation (each call behaves like a separate process).

    An entry exists only while some thread holds or waits for that node's mutex, so the table stays
    as small as the number of nodes being locked right now, not every node ever seen.

    The recorded owners (`record_owner`) are kept for the lock's expiry only: the device plugin, not
    this process, normally releases the lock, so no `forget_owner` comes for most entries; after the
    expiry the lock may be taken over anyway and the UID no longer decides anything. So the owner
    table holds at most the nodes this process locked within the last expiry (5 minutes by default),
    not every node it ever locked. `clock`: monotonic seconds (tests pass a fake).
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._guard = threading.Lock()
        self._entries: dict[str, list[Any]] = {}  # node -> [lock, number of holders and waiters]
        # node -> (namespace, name, UID, forget at) of the pod this process last locked it for: the lock
        # value carries no UID (HAMi's wire format), so only the process that wrote it knows the
        # incarnation. At most one entry per node; in recording order, so the oldest come first.
        self._owners: dict[str, tuple[str, str, str, float]] = {}
        self._clock = clock

    def record_owner(
        self,
        node_name: str,
        namespace: str,
        name: str,
        uid: str | None,
        *,
        expiry_s: float = NODE_LOCK_EXPIRY_S,
    ) -> None:
        """This process locked `node_name` for pod `namespace`/`name` of UID `uid` (None: unknown);
        remembered for `expiry_s` seconds (the lock's expiry). Drops the entries whose time is up."""
        now = self._clock()
        with self._guard:
            self._owners.pop(node_name, None)  # re-inserted last: the order stays the recording order
            if uid:
                self._owners[node_name] = (namespace, name, uid, now + expiry_s)
            # With one expiry for all the oldest entry is the first to go: stop at the first live one.
            while self._owners:
                first = next(iter(self._owners))
                if self._owners[first][3] > now:
                    break
                del self._owners[first]

    def forget_owner(self, node_name: str) -> None:
        """The lock of `node_name` was released (by us)."""
        with self._guard:
            self._owners.pop(node_name, None)

    def owner_uid(self, node_name: str, namespace: str, name: str) -> str | None:
        """The UID this process locked `node_name` for, when the lock names `namespace`/`name` and was
        taken within its expiry; else None."""
        with self._guard:
            entry = self._owners.get(node_name)
            if entry is not None and entry[3] <= self._clock():
                del self._owners[node_name]
                entry = None
        return entry[2] if entry is not None and entry[:2] == (namespace, name) else None

    def recorded_owners(self) -> int:
        """Nodes with a recorded owner now (at most those locked by this process within the expiry)."""
        with self._guard:
            return len(self._owners)

    @contextmanager
    def hold(self, node_name: str) -> Iterator[None]:
        """Hold `node_name`'s mutex for the ``with`` block (blocks while another thread holds it)."""
        with self._guard:
            entry = self._entries.get(node_name)
            if entry is None:
                entry = self._entries[node_name] = [threading.Lock(), 0]
            entry[1] += 1
        try:
            with entry[0]:
                yield
        finally:
            with self._guard:
                entry[1] -= 1
                if entry[1] == 0:
                    del self._entries[node_name]

    @contextmanager
    def try_hold(self, node_name: str) -> Iterator[bool]:
        """Hold `node_name`'s mutex for the ``with`` block when it is free (yields True), else yield
        False at once: for an event loop, which must not block on a thread's turn."""
        with self._guard:
            entry = self._entries.get(node_name)
            if entry is None:
                entry = self._entries[node_name] = [threading.Lock(), 0]
            got = entry[0].acquire(blocking=False)
            if got:
                entry[1] += 1
            elif entry[1] == 0:
                del self._entries[node_name]
        try:
            yield got
        finally:
            if got:
                entry[0].release()
                with self._guard:
                    entry[1] -= 1
                    if entry[1] == 0:
                        del self._entries[node_name]

    def __len__(self) -> int:
        """Nodes whose mutex is held or waited for now."""
        with self._guard:
            return len(self._entries)


class _NodeChanged(Exception):
    """Internal: the node changed between our read and our write (409); read again."""


def read_node_lock(node: Mapping[str, Any], *, key: str = NODE_LOCK) -> NodeLock | None:
    """The node's lock, None when unlocked. Raises AnnotationError for a malformed value."""
    value = ((node.get("metadata") or {}).get("annotations") or {}).get(key)
    if value is None or value == "":
        return None
    return decode_node_lock(value)


def dangling_reason(
    client: Any, lock: NodeLock, node_name: str, *, owner_uid: str | None = None
) -> str | None:
    """Why the lock's owner pod is no longer between Bind and Allocate on `node_name`, or None if it may be.

    `owner_uid`: the UID the lock was taken for, when known (`NodeMutexes.owner_uid`); a pod of the
    owner's name with another UID is a new incarnation, not the owner. A legacy lock without an owner
    is never dangling (only its expiry frees it). One GET of the owner pod.
    """
    if lock.namespace is None or lock.name is None:
        return None
    pod = client.get_pod(lock.namespace, lock.name)
    owner = f"{lock.namespace}/{lock.name}"
    if pod is None:
        return f"owner pod {owner} no longer exists"
    meta = pod.get("metadata") or {}
    if owner_uid and meta.get("uid") != owner_uid:
        return f"owner pod {owner} was re-created (UID {meta.get('uid')}, the lock was taken for {owner_uid})"
    if meta.get("deletionTimestamp"):
        return f"owner pod {owner} is being deleted"
    phase = (pod.get("status") or {}).get("phase")
    if phase in TERMINAL_PHASES:
        return f"owner pod {owner} has finished (phase {phase})"
    bind_phase = (meta.get("annotations") or {}).get(BIND_PHASE)
    if bind_phase in (BindPhase.SUCCESS.value, BindPhase.FAILED.value):
        return f"owner pod {owner} is past Allocate (bind-phase {bind_phase})"
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound and bound != node_name:
        return f"owner pod {owner} is bound to node {bound}, not {node_name}"
    assigned = (meta.get("annotations") or {}).get(ASSIGNED_NODE)
    if not bound and assigned and assigned != node_name:
        return f"owner pod {owner} is now assigned to node {assigned}, not {node_name}"
    if not bound and not assigned:
        return (
            f"owner pod {owner} is not placed on node {node_name} (not bound, no {ASSIGNED_NODE}): "
            "a new pod of the same name"
        )
    return None


def lock_node(
    client: Any,
    node_name: str,
    *,
    namespace: str,
    pod_name: str,
    uid: str | None = None,
    expiry_s: float = NODE_LOCK_EXPIRY_S,
    key: str = NODE_LOCK,
    now: Callable[[], datetime] | None = None,
    cached: Mapping[str, Any] | None = None,
    mutexes: NodeMutexes | None = None,
    stamp: str | None = None,
) -> None:
    """Take the node lock for pod `namespace`/`pod_name` (a `hami.kube.KubeClient` as `client`).

    `stamp`: the ``hami.io/mutex.lock-allocation`` value written in the same patch as the lock (the
    pod's UID and the digest of its allocation, `hami.annotations.encode_allocation_stamp`), so the
    device plugin can tell the pod and the allocation the lock was taken for; None writes none (and
    removes a stale one).

    `uid`: the pod's UID; recorded in `mutexes` so that this process tells a re-created pod of the
    same name from the one it locked for (the lock value itself carries no UID).

    `cached`: the caller's watched copy of the Node (e.g. the extender's reflector). When it shows the
    node unlocked (or the lock expired), the first write is made from it with its resourceVersion as
    the precondition, saving the GET; a stale copy costs one 409 and then the normal read-and-retry
    path runs without a backoff. A cached copy that shows any live lock is never trusted: the node
    is read afresh before contention is declared (the holder may have released it since).
    `mutexes`: the caller's `NodeMutexes`, serialising this process's lockers of one node (None: none).

    Succeeds when the node is unlocked, already locked by this pod (re-entrant, nothing written; a
    lock this process took for another UID of the same name is rewritten),
    locked longer than `expiry_s` seconds ago, locked with a malformed value, or locked by a dangling
    owner (see module docstring). Raises NodeLockContention when another live pod holds it (the
    message names the holder and when it locked; `expires_in_s` says when its age frees it), NotFound when the node does not exist, Conflict
    when the node kept changing under us through all retries.
    """
    clock = now or (lambda: datetime.now().astimezone())

    def attempt() -> None:
        node = client.get_node(node_name)
        if node is None:
            raise NotFound(f"node {node_name} not found; cannot take its lock for pod {namespace}/{pod_name}")
        meta = node.get("metadata") or {}
        try:
            lock = read_node_lock(node, key=key)
        except AnnotationError as e:
            log.warning("node %s: malformed %s value (%s); taking it over", node_name, key, e)
            lock = None
        if lock is not None:
            recorded = (
                mutexes.owner_uid(node_name, lock.namespace, lock.name)
                if mutexes is not None and lock.namespace is not None and lock.name is not None
                else None
            )
            if lock.namespace == namespace and lock.name == pod_name and (not uid or recorded in (None, uid)):
                return
            age_s = (clock() - lock.time).total_seconds()
            if lock.namespace == namespace and lock.name == pod_name:
                log.info(
                    "node %s: lock of an earlier incarnation of pod %s/%s; taking it",
                    node_name,
                    namespace,
                    pod_name,
                )
            elif age_s <= expiry_s:
                why = dangling_reason(client, lock, node_name, owner_uid=recorded)
                if why is None:
                    holder = f"{lock.namespace}/{lock.name}" if lock.name else "an unknown pod (legacy lock)"
                    raise NodeLockContention(
                        f"node {node_name} is locked by {holder} since "
                        f"{encode_node_lock(NodeLock(time=lock.time))} ({int(age_s)}s ago; "
                        f"expires after {int(expiry_s)}s); pod {namespace}/{pod_name} must wait until "
                        "that pod's devices are allocated",
                        expires_in_s=expiry_s - age_s,
                    )
                log.info("node %s: taking over lock from %s", node_name, why)
            else:
                log.info(
                    "node %s: lock of %s expired %ds ago; taking it over",
                    node_name,
                    lock.name,
                    int(age_s - expiry_s),
                )
        value = encode_node_lock(NodeLock(time=clock(), namespace=namespace, name=pod_name))
        try:
            client.patch_node_annotations(
                node_name, _lock_patch(key, value, stamp), resource_version=meta.get("resourceVersion")
            )
        except Conflict:
            # The node changed since we read it (maybe another scheduler took the lock): re-read.
            raise _NodeChanged() from None
        if mutexes is not None:
            mutexes.record_owner(node_name, namespace, pod_name, uid, expiry_s=expiry_s)

    with _holding(mutexes, node_name):
        if cached is not None and _lock_from_cache(
            client, cached, node_name, namespace=namespace, pod_name=pod_name, expiry_s=expiry_s,
            key=key, clock=clock, stamp=stamp,
        ):  # fmt: skip
            if mutexes is not None:
                mutexes.record_owner(node_name, namespace, pod_name, uid, expiry_s=expiry_s)
            return
        try:
            retry_call(attempt, retry_on=(_NodeChanged,), retries=RETRY_STEPS, backoff=RETRY_BACKOFF)
        except _NodeChanged:
            raise Conflict(
                f"node {node_name} kept changing; could not take its lock for pod {namespace}/{pod_name}"
            ) from None


def _holding(mutexes: NodeMutexes | None, node_name: str) -> Any:
    return nullcontext() if mutexes is None else mutexes.hold(node_name)


def _lock_from_cache(
    client: Any,
    node: Mapping[str, Any],
    node_name: str,
    *,
    namespace: str,
    pod_name: str,
    expiry_s: float,
    key: str,
    clock: Callable[[], datetime],
    stamp: str | None = None,
) -> bool:
    """One optimistic write from a cached Node; True when the lock was taken, False to go the long way."""
    write = cached_lock_write(
        node, node_name, namespace=namespace, pod_name=pod_name, expiry_s=expiry_s, key=key, clock=clock,
        stamp=stamp,
    )  # fmt: skip
    if write is None:
        return False
    try:
        client.patch_node_annotations(node_name, write[0], resource_version=write[1])
    except Conflict:
        return False  # the cache was behind the API server: re-read
    return True


def cached_lock_write(
    node: Mapping[str, Any],
    node_name: str,
    *,
    namespace: str,
    pod_name: str,
    expiry_s: float = NODE_LOCK_EXPIRY_S,
    key: str = NODE_LOCK,
    clock: Callable[[], datetime] | None = None,
    stamp: str | None = None,
) -> tuple[dict[str, str | None], str] | None:
    """The optimistic first write of `lock_node` from a cached Node: ``(annotations patch,
    resourceVersion precondition)``, or None when the cache cannot decide (the normal path must read).

    Only an unlocked node or an expired lock is written from the cache; anything else (a live lock,
    ours included, a malformed value, no resourceVersion) needs the fresh read of the normal path. A
    caller that sends it itself (an event loop) records the owner in its `NodeMutexes` on success and
    calls `lock_node` without `cached` after a Conflict.
    """
    clock = clock or (lambda: datetime.now().astimezone())
    meta = node.get("metadata") or {}
    rv = meta.get("resourceVersion")
    if not rv or meta.get("name") != node_name:
        return None
    try:
        lock = read_node_lock(node, key=key)
    except AnnotationError:
        return None
    if lock is not None and (clock() - lock.time).total_seconds() <= expiry_s:
        return None
    value = encode_node_lock(NodeLock(time=clock(), namespace=namespace, name=pod_name))
    return _lock_patch(key, value, stamp), str(rv)


def _lock_patch(key: str, value: str, stamp: str | None) -> dict[str, str | None]:
    """The lock and, for HAMi's lock key, its allocation stamp (None removes a stale one) in one write."""
    if key != NODE_LOCK:
        return {key: value}
    return {key: value, NODE_LOCK_ALLOCATION: stamp}


def release_node_lock(
    client: Any,
    node_name: str,
    *,
    namespace: str,
    pod_name: str,
    key: str = NODE_LOCK,
    mutexes: NodeMutexes | None = None,
) -> bool:
    """Remove the node lock if `namespace`/`pod_name` holds it (or it is a legacy owner-less lock).

    Returns True when this call removed it, False when the node is gone, unlocked or locked by
    another pod (which is left alone). Raises Conflict when the node kept changing through all retries.
    `mutexes` as for `lock_node`.
    """

    def attempt() -> bool:
        node = client.get_node(node_name)
        if node is None:
            return False
        try:
            lock = read_node_lock(node, key=key)
        except AnnotationError:
            log.warning("node %s: malformed %s value; leaving it for the next locker", node_name, key)
            return False
        if lock is None:
            return False
        if lock.name is not None and (lock.namespace, lock.name) != (namespace, pod_name):
            log.info(
                "node %s: lock belongs to %s/%s, not %s/%s; not releasing",
                node_name,
                lock.namespace,
                lock.name,
                namespace,
                pod_name,
            )
            return False
        rv = (node.get("metadata") or {}).get("resourceVersion")
        patch: dict[str, str | None] = {key: None}
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        if key == NODE_LOCK and NODE_LOCK_ALLOCATION in annotations:
            patch[NODE_LOCK_ALLOCATION] = None  # the stamp belongs to the lock it was written with
        try:
            client.patch_node_annotations(node_name, patch, resource_version=rv)
        except NotFound:
            return False
        except Conflict:
            raise _NodeChanged() from None
        if mutexes is not None:
            mutexes.forget_owner(node_name)
        return True

    with _holding(mutexes, node_name):
        try:
            return retry_call(attempt, retry_on=(_NodeChanged,), retries=RETRY_STEPS, backoff=RETRY_BACKOFF)
        except _NodeChanged:
            raise Conflict(
                f"node {node_name} kept changing; could not release its lock for pod {namespace}/{pod_name}"
            ) from None


def lock_age_s(lock: NodeLock, *, now: datetime | None = None) -> float:
    """Seconds since the lock was taken (negative if its writer's clock runs ahead)."""
    return ((now or datetime.now(UTC)) - lock.time).total_seconds()


__all__ = [
    "NODE_LOCK_EXPIRY_S",
    "RETRY_BACKOFF",
    "RETRY_STEPS",
    "NodeMutexes",
    "dangling_reason",
    "lock_age_s",
    "lock_node",
    "read_node_lock",
    "release_node_lock",
]
