"""Feeding ClusterState from the API server for one leadership term: nodes, pods (all namespaces) and
ResourceQuotas through `hami.kube.Reflector`, plus the periodic registration pass.

Why per term: a replica that just became active must decide from what the API server says *now*
(annotations written by the previous leader included), not from a cache it kept while standing by.
So every term starts fresh reflectors whose first lists rebuild the state exactly from annotations,
and the replica is ready only once all three lists were applied. A term ends by stopping the
reflectors; a late callback of an old term is ignored (`_closed`), so it cannot touch the next term's
state.

Ordering: the three reflectors call back from three threads; one lock serialises every callback, so
a relist of one kind (`ClusterState.rebuild` with the other kinds' cached objects) never interleaves
with an event of another kind. Node liveness (`hami.handshake.check_node`) is applied after every
node upsert and re-judged by the periodic pass, which also writes the handshake stamps and expires
reservations that no pod event confirmed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from hami import pods
from hami.annotations import ASSIGNED_NODE as NODE_ASSIGNED
from hami.annotations import NODE_LOCK
from hami.cluster import ClusterState
from hami.errors import HamiError
from hami.handshake import HANDSHAKE_TIMEOUT_S, check_node
from hami.kube import KubeClient, Reflector
from scheduler_extender.advertise import NodeAdvertiser
from scheduler_extender.lockwait import LockQueues, lock_freed, owner_done_node, placed_node

log = logging.getLogger(__name__)

_KINDS = frozenset({"nodes", "pods", "quotas"})


class Inflight:
    """Allocation annotations this replica has written (filter) and not yet seen come back in a pod event.

    Why: a watch event can be older than a reservation. A pod filtered onto card X, refused at bind and
    filtered again onto card Y has its reservation moved to Y; the event of the first patch (card X)
    may arrive only now. Applied, it would move the pod's usage back to X and free Y for another pod
    while the API server says Y: an overcommitted card once the second event lands (found by the burst
    property test). Only the scheduler writes these annotations, so while a write of ours is pending,
    an event carrying a different allocation for that pod is older than our write and is skipped.

    `lock` makes "decide + reserve + expect" (the extender) and "check + apply" (the pod watch) atomic
    with respect to each other. Entries end when the matching event arrives, when the pod is deleted
    or terminal, when the write failed (`forget`), or after `ttl_s`.

    An event of the pod version the decision was made from (`after`, its resourceVersion) or of an
    older one never ends an entry: it predates our write even where it looks like it. The write that
    clears a stale placement expects the allocation keys absent, as they are in the pod's creation
    event; a slow watch delivering that event late would otherwise end the entry, and the late event
    of the placement being cleared would then be counted until the clearing event arrives.
    """

    def __init__(self, ttl_s: float = 60.0) -> None:
        self.lock = threading.RLock()
        self.ttl_s = ttl_s
        self._by_uid: dict[str, tuple[dict[str, str | None], float, int | None]] = {}

    def expect(self, uid: str, annotations: Mapping[str, str | None], *, after: object = None) -> None:
        """Our write of `annotations` (None = key removed) to pod `uid` is on its way; `after`: the
        resourceVersion of the pod the write was decided from (None: unknown)."""
        with self.lock:
            self._by_uid[uid] = (dict(annotations), time.monotonic(), _revision(after))

    def forget(self, uid: str) -> None:
        with self.lock:
            self._by_uid.pop(uid, None)

    def clear(self) -> None:
        with self.lock:
            self._by_uid.clear()

    def __len__(self) -> int:
        return len(self._by_uid)

    def __contains__(self, uid: object) -> bool:
        return uid in self._by_uid

    def admits(self, pod: dict[str, Any]) -> bool:
        """Whether a pod event may be applied (False: it predates our pending write for that pod)."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid", "")
        with self.lock:
            entry = self._by_uid.get(uid)
            if entry is None:
                return True
            expected, since, after = entry
            annos = meta.get("annotations") or {}
            revision = _revision(meta.get("resourceVersion"))
            ours = after is None or revision is None or revision > after
            if (
                (ours and all(annos.get(k) == v for k, v in expected.items()))
                or pods.is_terminal(pod)
                or time.monotonic() - since > self.ttl_s
            ):
                del self._by_uid[uid]
                return True
            # Not placed at all (e.g. the creation event, late): harmless, the state keeps the reservation.
            return NODE_ASSIGNED not in annos


def _revision(resource_version: object) -> int | None:
    """A resourceVersion as a number to order pod versions by (etcd's revision, which every API
    server writes), or None where it is not one: then annotations alone decide (`Inflight.admits`)."""
    if not isinstance(resource_version, str) or not resource_version.isdigit():
        return None
    return int(resource_version)


def _node_inputs(node: dict[str, Any]) -> tuple[Any, Any]:
    """What ClusterState and the liveness check read from a Node: annotations (bar the lock), allocatable."""
    annos = dict((node.get("metadata") or {}).get("annotations") or {})
    annos.pop(NODE_LOCK, None)
    return annos, (node.get("status") or {}).get("allocatable")


class ClusterSync:
    """One term's reflectors and registration loop over `state`.

    `register_interval_s`: period of the registration pass (HAMi: 15 s; 0 disables liveness checks and
    handshake stamps; reservations still expire every 15 s). `reservation_ttl_s`: a filter reservation no pod event confirmed within this
    many seconds is dropped. `clock`: local wall clock for handshakes (HAMi writes local time).
    """

    def __init__(
        self,
        client: KubeClient,
        state: ClusterState,
        *,
        register_interval_s: float = 15.0,
        handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
        reservation_ttl_s: float = 60.0,
        write_handshakes: bool = True,
        watch_timeout_s: float = 300.0,
        clock: Callable[[], datetime] = datetime.now,
        inflight: Inflight | None = None,
        lock_queues: LockQueues | None = None,
        on_invalid_registration: Callable[[dict[str, Any], str | None], None] | None = None,
        advertise_node_resources: bool = False,
        freeze_after_rebuild: bool = False,
    ) -> None:
        self.client = client
        # Told (node, reason) when a node's registration turns unreadable, (node, None) when it is
        # readable again or the node is gone: the operator's event and metric (scheduler_extender.app).
        self.on_invalid_registration = on_invalid_registration
        self._invalid: dict[str, str] = {}  # node -> reason its registration cannot be read
        self.rebuild_error: str | None = None  # why the last rebuild did not complete
        # Binds waiting for a node lock are woken from these watches (scheduler_extender.lockwait).
        self.lock_queues = lock_queues
        self.inflight = inflight if inflight is not None else Inflight(reservation_ttl_s)
        self.state = state
        self.register_interval_s = register_interval_s
        self.freeze_after_rebuild = freeze_after_rebuild
        self.handshake_timeout_s = handshake_timeout_s
        self.reservation_ttl_s = reservation_ttl_s
        self.write_handshakes = write_handshakes
        self.clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._health: dict[str, str | None] = {}  # node -> last liveness verdict applied
        self._listed: set[str] = set()  # kinds whose first list of this term was applied
        self.rebuilds = 0  # state rebuilds applied in this term (one per list of any kind)
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._alloc_keys = (NODE_ASSIGNED, *sorted({v.allocated_key for v in state.vendors.values()}))
        self.nodes = Reflector(
            client, "nodes", on_sync=self._nodes_synced, on_add=self._node_event,
            on_update=self._node_updated, on_delete=self._node_deleted,
            watch_timeout_s=watch_timeout_s, name="extender-nodes",
        )  # fmt: skip
        self.pods = Reflector(
            client, "pods", on_sync=self._pods_synced, on_add=self._pod_event,
            on_update=self._pod_updated, on_delete=self._pod_deleted,
            watch_timeout_s=watch_timeout_s, name="extender-pods",
        )  # fmt: skip
        # --advertise-node-resources: the nodes' device totals as capacity (scheduler_extender.advertise).
        self.advertiser = NodeAdvertiser(client, state, self.nodes.get) if advertise_node_resources else None
        self.quotas = Reflector(
            client, "resourcequotas", on_sync=self._quotas_synced, on_add=self._quota_event,
            on_update=lambda _old, new: self._quota_event(new), on_delete=self._quota_deleted,
            watch_timeout_s=watch_timeout_s, name="extender-quotas",
        )  # fmt: skip

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> ClusterSync:
        """Start the reflectors and the registration loop (non-blocking)."""
        if self.advertiser is not None:
            self.advertiser.start()
        for r in (self.quotas, self.nodes, self.pods):
            r.start()
        self._loop_thread = threading.Thread(target=self._loop, name="extender-register", daemon=True)
        self._loop_thread.start()
        return self

    def stop(self) -> None:
        """End the term: later callbacks are ignored; threads are joined."""
        with self._lock:
            self._closed = True
        self._stop.set()
        for r in (self.nodes, self.pods, self.quotas):
            r.stop()
        if self.advertiser is not None:
            self.advertiser.stop()
        if self._loop_thread is not None:
            self._loop_thread.join(5.0)

    @property
    def synced(self) -> bool:
        """True once nodes, pods and quotas were each listed and applied in this term, and the last
        rebuild of the state from them completed."""
        return (
            self.nodes.synced
            and self.pods.synced
            and self.quotas.synced
            and self.rebuild_error is None
            and not self._closed
        )

    def wait_synced(self, timeout_s: float | None = None) -> bool:
        """Block until `synced` (False on timeout)."""
        return all(r.wait_synced(timeout_s) for r in (self.nodes, self.pods, self.quotas))

    def cached_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The reflector's copy of a pod (may lag the API server by a watch event)."""
        return self.pods.get(name, namespace)

    # -- callbacks (reflector threads) -------------------------------------------------------------

    def _apply_node(self, node: dict[str, Any], reason: str | None = None, *, judged: bool = False) -> None:
        # Called with self._lock held. `reason`: a liveness verdict already computed (`judged`).
        name = (node.get("metadata") or {}).get("name", "")
        if not judged and self.register_interval_s > 0:
            reason = check_node(
                node, self.state.vendors.values(), now=self.clock(), timeout_s=self.handshake_timeout_s
            ).reason
        # With --register-interval 0 node liveness is off: no verdict from the handshake (`reason` None).
        self._health[name] = reason
        problem = self.state.upsert_node(node)
        self._note_registration(node, problem)
        if problem is not None:
            return  # unregistered or malformed: upsert_node already says why
        if reason is not None:
            self.state.mark_node_unusable(name, reason)

    def _note_registration(self, node: dict[str, Any], problem: str | None) -> None:
        """Tell the operator once when a node's registration becomes unreadable, and when it is not."""
        name = (node.get("metadata") or {}).get("name", "")
        invalid = problem if problem is not None and not problem.startswith("node unregistered") else None
        if self._invalid.get(name) == invalid:
            return
        if invalid is None:
            self._invalid.pop(name, None)
        else:
            self._invalid[name] = invalid
            log.warning("node %s left out: its device registration cannot be read: %s", name, invalid)
        if self.on_invalid_registration is not None:
            try:
                self.on_invalid_registration(node, invalid)
            except Exception:  # noqa: BLE001 - reporting must not stop the sync
                log.exception("reporting the registration of node %s failed", name)

    def _rebuild_from_caches(self, kind: str) -> None:
        """Rebuild the state from the three caches after `kind` ("nodes", "pods", "quotas") was listed.

        The first lists of a term rebuild from the API server alone. A later relist (410 Gone,
        `Reflector.resync`) happens while filters reserve: it keeps the reservations whose pod patch
        is still on its way, and a listed pod that predates such a write of ours (`Inflight.admits`
        is False) is left out, exactly as its watch event would be; otherwise the relist would free
        capacity that a filter already handed out and give it out a second time.
        """
        with self._lock, self.inflight.lock:
            if self._closed:
                return
            mid_term = self._listed >= _KINDS
            self._listed.add(kind)
            nodes = self.nodes.items()
            pods = self.pods.items()
            if mid_term:
                pods = [p for p in pods if self.inflight.admits(p)]
            try:
                self.state.rebuild(
                    nodes, pods, self.quotas.items(), keep_reservations=mid_term,
                    freeze_after=self.freeze_after_rebuild,
                )  # fmt: skip
                for node in nodes:
                    self._apply_node(node)
                    if self.advertiser is not None:
                        self.advertiser.notify((node.get("metadata") or {}).get("name", ""))
            except Exception as e:  # noqa: BLE001 - not ready rather than serving from half a state
                self.rebuild_error = (
                    f"the state could not be rebuilt from the {kind} list: {type(e).__name__}: {e}"
                )
                log.exception("state rebuild after the %s list failed; not ready until one completes", kind)
                return
            self.rebuild_error = None
            self.rebuilds += 1
            log.info(
                "state rebuilt from %d nodes, %d pods, %d quotas%s",
                len(nodes),
                len(pods),
                len(self.quotas.items()),
                " (in-flight reservations kept)" if mid_term else "",
            )

    def _nodes_synced(self, _items: list[dict[str, Any]]) -> None:
        self._rebuild_from_caches("nodes")
        self._relisted()

    def _pods_synced(self, _items: list[dict[str, Any]]) -> None:
        self._rebuild_from_caches("pods")
        self._relisted()

    def _relisted(self) -> None:
        # A relist replaces what the watch missed while it was down (a lock released, an owner pod
        # deleted or done): no event comes for those, so every waiting bind's queue looks again.
        if self.lock_queues is not None:
            self.lock_queues.notify_all()

    def _quotas_synced(self, _items: list[dict[str, Any]]) -> None:
        self._rebuild_from_caches("quotas")

    def _node_event(self, node: dict[str, Any]) -> None:
        with self._lock:
            if self._closed:
                return
            self._apply_node(node)
        if self.advertiser is not None:
            self.advertiser.notify((node.get("metadata") or {}).get("name", ""))

    def _node_updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        queues = self.lock_queues
        if queues is not None and queues.active and lock_freed(old, new):
            queues.notify((new.get("metadata") or {}).get("name", ""))
        # Every bind writes the node lock twice (take, release); re-parsing the registration for
        # those would be most of the node events' cost on a busy cluster.
        if _node_inputs(old) != _node_inputs(new):
            self._node_event(new)

    def _node_deleted(self, node: dict[str, Any]) -> None:
        with self._lock:
            if not self._closed:
                name = (node.get("metadata") or {}).get("name", "")
                self._health.pop(name, None)
                self.state.remove_node(name)
                self._note_registration(node, None)
        if self.lock_queues is not None:
            self.lock_queues.notify((node.get("metadata") or {}).get("name", ""))  # waiters fail fast

    def _pod_event(self, pod: dict[str, Any]) -> None:
        with self._lock, self.inflight.lock:
            if not self._closed and self.inflight.admits(pod):
                self.state.upsert_pod(pod)

    def _pod_updated(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        # Most pod updates after our filter patch are the Binding (nodeName, bind-phase) and the device
        # plugin's bind-phase success: nothing ClusterState counts changed, so skip the decode. Only
        # when no write of ours is pending: then `admits` would pass and upsert_pod be a no-op.
        queues = self.lock_queues
        if queues is not None and queues.active:
            node = owner_done_node(old, new)
            if node:
                queues.notify(node)  # the lock owner finished: its lock is dangling now
        uid = (new.get("metadata") or {}).get("uid", "")
        if uid not in self.inflight and self._pod_inputs(old) == self._pod_inputs(new):
            return
        self._pod_event(new)

    def _ours(self, spec: dict[str, Any]) -> bool:
        """Whether ClusterState counts this pod as placed by us (hami/cluster.py `upsert_pod`)."""
        name = self.state.scheduler_name
        return not name or spec.get("schedulerName") == name

    def _pod_inputs(self, pod: dict[str, Any]) -> tuple[Any, ...]:
        """What `ClusterState.upsert_pod` reads from a pod (hami/cluster.py): allocation annotations,
        scheduler name, node name, phase, the container lists and init container states, the nominated
        node (a preemptor's hold), the start of graceful deletion (a victim still on its cards) and the
        labels (PodDisruptionBudgets select by them)."""
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        annos = meta.get("annotations") or {}
        keys = self._alloc_keys
        return (
            meta.get("uid"),
            tuple(annos.get(k) for k in keys),
            spec.get("schedulerName"),
            # Another scheduler's Binding: its CPU is counted on that node. Our own pods are counted
            # on the node their annotations name, so their Binding stays a no-op here (bind hot path).
            None if self._ours(spec) else spec.get("nodeName"),
            spec.get("containers"),
            spec.get("initContainers"),
            status.get("phase"),
            status.get("initContainerStatuses"),
            status.get("nominatedNodeName"),
            status.get("startTime"),  # preemption keeps the longest-running pods
            meta.get("deletionTimestamp"),
            meta.get("labels"),  # PodDisruptionBudget selectors
        )

    def _pod_deleted(self, pod: dict[str, Any]) -> None:
        uid = (pod.get("metadata") or {}).get("uid", "")
        with self._lock, self.inflight.lock:
            if not self._closed:
                self.inflight.forget(uid)
                self.state.remove_pod(uid)
        queues = self.lock_queues
        if queues is not None and queues.active:
            queues.pod_gone(uid)  # a waiting bind of this pod leaves the queue
            node = placed_node(pod)
            if node:
                queues.notify(node)  # a lock it held is dangling now

    def _quota_event(self, quota: dict[str, Any]) -> None:
        with self._lock:
            if not self._closed:
                self.state.upsert_quota(quota)

    def _quota_deleted(self, quota: dict[str, Any]) -> None:
        meta = quota.get("metadata") or {}
        with self._lock:
            if not self._closed:
                self.state.remove_quota(meta.get("namespace", "default"), meta.get("name", ""))

    # -- registration pass -------------------------------------------------------------------------

    def register_pass(self, *, liveness: bool = True) -> int:
        """Re-judge every node's liveness and write handshake stamps (`liveness`), expire reservations.

        Returns the number of nodes whose handshake was stamped. API errors are logged, never raised.
        """
        stamped = 0
        if liveness and self.nodes.synced:
            now = self.clock()
            for node in self.nodes.items():
                name = (node.get("metadata") or {}).get("name", "")
                verdict = check_node(
                    node, self.state.vendors.values(), now=now, timeout_s=self.handshake_timeout_s
                )
                with self._lock:
                    if self._closed:
                        return stamped
                    changed = self._health.get(name, "unseen") != verdict.reason
                    if changed:
                        self._apply_node(node, verdict.reason, judged=True)
                if changed and verdict.reason is not None:
                    log.warning("node %s not usable: %s", name, verdict.reason)
                if verdict.stamps and self.write_handshakes:
                    try:
                        self.client.patch_node_annotations(name, verdict.stamps)
                        stamped += 1
                    except HamiError as e:
                        log.info("node %s: handshake stamp not written: %s", name, e)
        expired = self.state.expire_reservations(self.reservation_ttl_s)
        if expired:
            log.info("dropped %d unconfirmed reservations: %s", len(expired), ", ".join(expired[:10]))
        return stamped

    def _loop(self) -> None:
        # Reservations expire even when the liveness pass is off (--register-interval 0).
        liveness = self.register_interval_s > 0
        interval = self.register_interval_s if liveness else 15.0
        while not self._stop.wait(interval):
            try:
                self.register_pass(liveness=liveness)
            except Exception:  # noqa: BLE001 - the loop must survive anything
                log.exception("registration pass failed")
