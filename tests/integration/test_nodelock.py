"""The node lock protocol (``hami.io/mutex.lock``) over the in-memory API server."""

from __future__ import annotations

import re
import threading
from datetime import UTC, datetime, timedelta

import pytest

from hami.annotations import NODE_LOCK, NodeLock, decode_node_lock, encode_node_lock
from hami.errors import NodeLockContention, NotFound
from hami.kube import KubeClient
from hami.nodelock import NodeMutexes, lock_node, read_node_lock, release_node_lock
from kubefakes.apiserver import FakeApiServer
from tests.builders import make_node, make_pod

RFC3339 = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d)"


def lock_value(store, node: str = "n1") -> str | None:
    return (store.get("nodes", node)["metadata"].get("annotations") or {}).get(NODE_LOCK)


def seed(store, *, lock: str | None = None, owner: dict | None = None) -> None:
    store.create("nodes", make_node("n1", annotations={NODE_LOCK: lock} if lock else {}))
    if owner is not None:
        store.create("pods", owner)


def placed(name: str, ns: str = "ml", node: str = "n1") -> dict:
    """A pod the scheduler placed on `node` (its filter wrote ``hami.io/vgpu-node``): a live lock owner."""
    return make_pod(name, ns, annotations={"hami.io/vgpu-node": node})


def held_by(ns: str, name: str, *, ago_s: float = 10) -> str:
    return encode_node_lock(
        NodeLock(time=datetime.now(UTC) - timedelta(seconds=ago_s), namespace=ns, name=name)
    )


def test_lock_writes_hami_value_and_release_removes_it(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store)
    lock_node(kube_client, "n1", namespace="ml", pod_name="gpu-pod")
    value = lock_value(store)
    assert re.fullmatch(RFC3339 + ",ml,gpu-pod", value), value
    assert abs((datetime.now(UTC) - decode_node_lock(value).time).total_seconds()) < 5
    assert release_node_lock(kube_client, "n1", namespace="ml", pod_name="gpu-pod") is True
    assert lock_value(store) is None
    assert release_node_lock(kube_client, "n1", namespace="ml", pod_name="gpu-pod") is False


def test_release_checks_the_owner(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    seed(store, lock=held_by("ml", "owner"))
    assert release_node_lock(kube_client, "n1", namespace="ml", pod_name="other") is False
    assert release_node_lock(kube_client, "n1", namespace="other-ns", pod_name="owner") is False
    assert lock_value(store).endswith(",ml,owner")


def test_lock_is_reentrant_for_the_same_pod(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    seed(store)
    lock_node(kube_client, "n1", namespace="ml", pod_name="p")
    rv = store.get("nodes", "n1")["metadata"]["resourceVersion"]
    lock_node(kube_client, "n1", namespace="ml", pod_name="p")  # e.g. a second vendor of the same pod
    assert store.get("nodes", "n1")["metadata"]["resourceVersion"] == rv


def test_live_owner_means_contention(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    owner = make_pod(
        "owner", "ml", annotations={"hami.io/bind-phase": "allocating", "hami.io/vgpu-node": "n1"}
    )
    value = held_by("ml", "owner", ago_s=30)
    seed(store, lock=value, owner=owner)
    with pytest.raises(
        NodeLockContention, match=r"node n1 is locked by ml/owner since .* \(30s ago; expires after 300s\)"
    ):
        lock_node(kube_client, "n1", namespace="ml", pod_name="late")
    store.patch(
        "pods", "owner", {"spec": {"nodeName": "n1"}}, namespace="ml"
    )  # bound here, not yet allocated
    with pytest.raises(NodeLockContention):
        lock_node(kube_client, "n1", namespace="ml", pod_name="late")
    assert lock_value(store) == value


def test_expired_lock_is_taken_over(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    seed(store, lock=held_by("ml", "owner", ago_s=301), owner=make_pod("owner", "ml"))
    lock_node(kube_client, "n1", namespace="ml", pod_name="next")
    assert lock_value(store).endswith(",ml,next")


def test_expiry_is_configurable(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    seed(store, lock=held_by("ml", "owner", ago_s=90), owner=placed("owner"))
    with pytest.raises(NodeLockContention):
        lock_node(kube_client, "n1", namespace="ml", pod_name="next")
    lock_node(kube_client, "n1", namespace="ml", pod_name="next", expiry_s=60)
    assert lock_value(store).endswith(",ml,next")


def test_legacy_time_only_lock(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    fresh = encode_node_lock(NodeLock(time=datetime.now(UTC) - timedelta(seconds=5)))
    seed(store, lock=fresh)
    with pytest.raises(NodeLockContention, match="locked by an unknown pod \\(legacy lock\\)"):
        lock_node(kube_client, "n1", namespace="ml", pod_name="p")
    assert release_node_lock(kube_client, "n1", namespace="ml", pod_name="anyone") is True  # owner unknown
    store.patch("nodes", "n1", {"metadata": {"annotations": {NODE_LOCK: "2020-01-01T00:00:00+08:00"}}})
    lock_node(kube_client, "n1", namespace="ml", pod_name="p")
    assert lock_value(store).endswith(",ml,p")


@pytest.mark.parametrize(
    ("owner", "why"),
    [
        (None, "owner pod gone"),
        (make_pod("owner", "ml", phase="Succeeded"), "terminal"),
        (make_pod("owner", "ml", phase="Failed"), "terminal"),
        (make_pod("owner", "ml", annotations={"hami.io/bind-phase": "success"}), "past Allocate"),
        (make_pod("owner", "ml", annotations={"hami.io/bind-phase": "failed"}), "Allocate failed"),
        (make_pod("owner", "ml", node_name="n2"), "bound to another node"),
        (make_pod("owner", "ml", annotations={"hami.io/vgpu-node": "n2"}), "re-filtered to another node"),
    ],
    ids=[
        "owner-gone",
        "owner-succeeded",
        "owner-failed",
        "owner-allocated",
        "owner-allocate-failed",
        "owner-bound-elsewhere",
        "owner-refiltered-elsewhere",
    ],
)
def test_dangling_owner_is_taken_over_at_once(
    fake_apiserver: FakeApiServer, kube_client: KubeClient, owner: dict | None, why: str
) -> None:
    store = fake_apiserver.store
    seed(store, lock=held_by("ml", "owner", ago_s=5), owner=owner)
    lock_node(kube_client, "n1", namespace="ml", pod_name="next")
    assert lock_value(store).endswith(",ml,next"), why


def test_owner_being_deleted_is_dangling() -> None:
    with FakeApiServer(graceful_pod_deletion=True) as server:
        client = KubeClient.from_kubeconfig(server.kubeconfig_path, retry_initial_wait_s=0.01)
        seed(server.store, lock=held_by("ml", "owner"), owner=make_pod("owner", "ml", node_name="n1"))
        client.delete_pod("ml", "owner")  # graceful: stays with a deletionTimestamp
        assert server.store.get("pods", "owner", namespace="ml")["metadata"]["deletionTimestamp"]
        lock_node(client, "n1", namespace="ml", pod_name="next")
        assert lock_value(server.store).endswith(",ml,next")


def test_malformed_lock_is_taken_over(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    store = fake_apiserver.store
    seed(store, lock="garbage,with-two")
    lock_node(kube_client, "n1", namespace="ml", pod_name="p")
    assert lock_value(store).endswith(",ml,p")


def test_missing_node_is_not_found(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    with pytest.raises(NotFound, match="node ghost not found; cannot take its lock for pod ml/p"):
        lock_node(kube_client, "ghost", namespace="ml", pod_name="p")
    assert release_node_lock(kube_client, "ghost", namespace="ml", pod_name="p") is False


def test_injected_conflicts_and_errors_are_retried(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store)
    conflicts = fake_apiserver.faults.add(verb="patch", resource="nodes", status=409, times=2)
    errors = fake_apiserver.faults.add(verb="get", resource="nodes", status=500, times=1)
    lock_node(kube_client, "n1", namespace="ml", pod_name="p")
    assert (conflicts.hits, errors.hits) == (2, 1)
    assert lock_value(store).endswith(",ml,p")
    conflicts = fake_apiserver.faults.add(verb="patch", resource="nodes", status=409, times=1)
    assert release_node_lock(kube_client, "n1", namespace="ml", pod_name="p") is True
    assert conflicts.hits == 1 and lock_value(store) is None


class RacingClient:
    """A client through which another scheduler takes the lock right after our GET (cross-process race)."""

    def __init__(self, inner: KubeClient, store) -> None:
        self.inner = inner
        self.store = store
        self.raced = False

    def get_node(self, name: str):
        node = self.inner.get_node(name)
        if not self.raced:
            self.raced = True
            self.store.create("pods", placed("rival"))
            self.store.patch(
                "nodes", name, {"metadata": {"annotations": {NODE_LOCK: held_by("ml", "rival", ago_s=0)}}}
            )
        return node

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def test_race_with_another_process_is_decided_by_resource_version(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store)
    with pytest.raises(NodeLockContention, match="locked by ml/rival"):
        lock_node(RacingClient(kube_client, store), "n1", namespace="ml", pod_name="p")
    assert lock_value(store).endswith(",ml,rival")


def test_concurrent_lockers_exactly_one_wins(fake_apiserver: FakeApiServer, kubeconfig: str) -> None:
    # Each locker with its own mutex table, as if every locker were a separate scheduler process.
    store = fake_apiserver.store
    seed(store)
    for i in range(6):
        store.create("pods", placed(f"p{i}"))
    barrier = threading.Barrier(6)
    results: dict[str, str] = {}

    def contend(i: int) -> None:
        client = KubeClient.from_kubeconfig(kubeconfig, retry_initial_wait_s=0.01)
        barrier.wait()
        try:
            lock_node(client, "n1", namespace="ml", pod_name=f"p{i}", mutexes=NodeMutexes())
            results[f"p{i}"] = "won"
        except NodeLockContention:
            results[f"p{i}"] = "contention"

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    winners = [p for p, r in results.items() if r == "won"]
    assert len(results) == 6 and len(winners) == 1
    assert lock_value(store).endswith(f",ml,{winners[0]}")


def test_one_process_lockers_take_turns_and_the_mutex_table_empties(
    fake_apiserver: FakeApiServer, kubeconfig: str
) -> None:
    # One table shared by six threads, as in one extender: they take turns, so none of their writes
    # meets a 409 from another; once nobody holds or waits, the table keeps no entry for the node.
    store = fake_apiserver.store
    seed(store)
    for i in range(6):
        store.create("pods", placed(f"p{i}"))
    mutexes = NodeMutexes()
    requests_before = fake_apiserver.request_count
    barrier = threading.Barrier(6)
    results: dict[str, str] = {}
    peak: list[int] = []

    def contend(i: int) -> None:
        client = KubeClient.from_kubeconfig(kubeconfig, retry_initial_wait_s=0.01)
        barrier.wait()
        try:
            lock_node(client, "n1", namespace="ml", pod_name=f"p{i}", mutexes=mutexes)
            results[f"p{i}"] = "won"
        except NodeLockContention:
            results[f"p{i}"] = "contention"
        peak.append(len(mutexes))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    winners = [p for p, r in results.items() if r == "won"]
    assert len(results) == 6 and len(winners) == 1
    # Serialised: one GET + one PATCH for the winner; each loser one GET of the node + one of the owner.
    assert fake_apiserver.request_count - requests_before == 2 + 5 * 2
    assert len(mutexes) == 0
    assert release_node_lock(KubeClient.from_kubeconfig(kubeconfig), "n1", namespace="ml",
                             pod_name=winners[0], mutexes=mutexes) is True  # fmt: skip
    assert len(mutexes) == 0


def test_node_mutexes_keep_an_entry_only_while_held_or_awaited() -> None:
    mutexes = NodeMutexes()
    waiting = threading.Event()
    entered = threading.Event()

    def second() -> None:
        waiting.set()
        with mutexes.hold("n1"):
            entered.set()

    with mutexes.hold("n1"):
        with mutexes.hold("n2"):
            assert len(mutexes) == 2
        assert len(mutexes) == 1
        t = threading.Thread(target=second)
        t.start()
        waiting.wait(5)
        assert not entered.is_set()  # n1 is held here: the second holder waits
    t.join(5)
    assert entered.is_set() and len(mutexes) == 0
    for i in range(1000):  # every node ever locked: nothing stays behind
        with mutexes.hold(f"node-{i}"):
            pass
    assert len(mutexes) == 0


def test_read_node_lock_decodes_the_annotation() -> None:
    node = make_node("n1", annotations={NODE_LOCK: "2024-05-10T16:15:30+08:00,default,gpu-pod"})
    lock = read_node_lock(node)
    assert (lock.namespace, lock.name) == ("default", "gpu-pod")
    assert lock.time == datetime(2024, 5, 10, 8, 15, 30, tzinfo=UTC)
    assert read_node_lock(make_node("n2")) is None


# -- first attempt from a cached Node (the extender's reflector) ---------------------------------------


def test_lock_from_a_current_cached_node_makes_one_request(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store)
    cached = store.get("nodes", "n1")
    before = fake_apiserver.request_count
    lock_node(kube_client, "n1", namespace="ml", pod_name="gpu-pod", cached=cached)
    assert fake_apiserver.request_count - before == 1  # the PATCH only, no GET
    assert lock_value(store).endswith(",ml,gpu-pod")


def test_lock_from_a_stale_cached_node_rereads_and_still_refuses_a_live_holder(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store, owner=placed("owner"))
    stale = store.get("nodes", "n1")  # unlocked in the cache ...
    store.patch("nodes", "n1", {"metadata": {"annotations": {NODE_LOCK: held_by("ml", "owner")}}})
    before = fake_apiserver.request_count
    with pytest.raises(NodeLockContention, match="node n1 is locked by ml/owner"):
        lock_node(kube_client, "n1", namespace="ml", pod_name="gpu-pod", cached=stale)
    # PATCH (409: stale resourceVersion), GET, GET of the owner pod: never a write over the live lock.
    assert fake_apiserver.request_count - before == 3
    assert lock_value(store).endswith(",ml,owner")


def test_a_cached_lock_is_not_trusted_when_the_holder_released_it(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store, lock=held_by("ml", "owner"), owner=make_pod("owner", "ml"))
    cached = store.get("nodes", "n1")  # ... locked in the cache, released since
    store.patch("nodes", "n1", {"metadata": {"annotations": {NODE_LOCK: None}}})
    lock_node(kube_client, "n1", namespace="ml", pod_name="gpu-pod", cached=cached)
    assert lock_value(store).endswith(",ml,gpu-pod")


# -- the owner is the pod placed on this node, not any pod of that name --------------------------------


def test_a_recreated_pod_of_the_owners_name_is_not_the_owner(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    # A StatefulSet's web-0 took the lock, was deleted before Allocate and created again: the new web-0
    # was never placed on n1 (no placement annotation, not bound), so it cannot be between Bind and
    # Allocate there. Before the fix the node stayed locked until expiry (5 minutes).
    store = fake_apiserver.store
    seed(store, lock=held_by("ml", "web-0", ago_s=5), owner=make_pod("web-0", "ml"))
    lock_node(kube_client, "n1", namespace="ml", pod_name="next")
    assert lock_value(store).endswith(",ml,next")


def test_a_recreated_owner_placed_here_again_is_told_apart_by_the_recorded_uid(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    seed(store)
    old = store.create("pods", make_pod("web-0", "ml", annotations={"hami.io/vgpu-node": "n1"}))
    mutexes = NodeMutexes()
    lock_node(kube_client, "n1", namespace="ml", pod_name="web-0", uid=old["metadata"]["uid"], mutexes=mutexes)
    assert mutexes.owner_uid("n1", "ml", "web-0") == old["metadata"]["uid"]
    # The same placement on the new incarnation: only the UID tells them apart.
    store.delete("pods", "web-0", namespace="ml")
    new = store.create("pods", make_pod("web-0", "ml", annotations={"hami.io/vgpu-node": "n1"}))
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    lock_node(kube_client, "n1", namespace="ml", pod_name="next", mutexes=mutexes)
    assert lock_value(store).endswith(",ml,next")
    # While the live owner (recorded UID matches) keeps it.
    with pytest.raises(NodeLockContention, match="locked by ml/next"):
        store.create("pods", make_pod("next", "ml", annotations={"hami.io/vgpu-node": "n1"}))
        lock_node(kube_client, "n1", namespace="ml", pod_name="late", mutexes=mutexes)


def test_the_owners_new_incarnation_takes_the_lock_afresh(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    # Same name, recorded UID differs: not re-entrant, the value is rewritten (fresh time) for the new pod.
    store = fake_apiserver.store
    seed(store)
    mutexes = NodeMutexes()
    lock_node(kube_client, "n1", namespace="ml", pod_name="web-0", uid="uid-old", mutexes=mutexes)
    before = fake_apiserver.request_count
    lock_node(kube_client, "n1", namespace="ml", pod_name="web-0", uid="uid-old", mutexes=mutexes)
    assert fake_apiserver.request_count - before == 1  # same pod: re-entrant, the GET only
    before = fake_apiserver.request_count
    lock_node(kube_client, "n1", namespace="ml", pod_name="web-0", uid="uid-new", mutexes=mutexes)
    assert fake_apiserver.request_count - before == 2  # GET + the rewrite, no GET of the old owner
    assert mutexes.owner_uid("n1", "ml", "web-0") == "uid-new"
    assert release_node_lock(kube_client, "n1", namespace="ml", pod_name="web-0", mutexes=mutexes) is True
    assert mutexes.owner_uid("n1", "ml", "web-0") is None
