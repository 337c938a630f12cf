"""hami.kube against the in-memory API server: plain-dict calls, retry policy, binding, events,
the reflector (relist on 410, reconnect after a dropped watch) and leader election."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from hami.errors import Conflict, InvalidRequest, NotFound
from hami.kube import ApiError, KubeClient, LeaderElector, Reflector, ResourceExpired
from kubefakes.apiserver import FakeApiServer
from tests.builders import make_node, make_pod


def wait_for(cond: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


# -- plain calls ----------------------------------------------------------------------------------


def test_get_list_patch_return_plain_dicts(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("nodes", make_node("n1", annotations={"keep": "1", "drop": "2"}))
    fake_apiserver.store.create("pods", make_pod("p1", node_name="n1"))
    fake_apiserver.store.create("pods", make_pod("p2", "ml"))
    assert kube_client.get_node("n1")["metadata"]["annotations"] == {"keep": "1", "drop": "2"}
    assert kube_client.get_node("missing") is None
    assert kube_client.get_pod("default", "missing") is None
    assert [p["metadata"]["name"] for p in kube_client.list_pods(field_selector="spec.nodeName=n1")] == ["p1"]
    assert [p["metadata"]["name"] for p in kube_client.list_pods(namespace="ml")] == ["p2"]
    node = kube_client.patch_node_annotations("n1", {"drop": None, "hami.io/node-handshake": "Requesting_x"})
    assert node["metadata"]["annotations"] == {"keep": "1", "hami.io/node-handshake": "Requesting_x"}
    pod = kube_client.patch_pod_metadata(
        "ml", "p2", annotations={"hami.io/vgpu-node": "n1"}, labels={"hami.io/vgpu-node": "n1"}
    )
    assert pod["metadata"]["annotations"]["hami.io/vgpu-node"] == "n1"
    assert pod["metadata"]["labels"]["hami.io/vgpu-node"] == "n1"
    assert kube_client.patch_pod_status("ml", "p2", {"phase": "Running"})["status"]["phase"] == "Running"
    with pytest.raises(NotFound, match='patch pods ml/ghost: pods "ghost" not found'):
        kube_client.patch_pod_metadata("ml", "ghost", annotations={"a": "b"})
    assert kube_client.delete_pod("ml", "p2") is True
    assert kube_client.delete_pod("ml", "p2") is False


def test_stale_resource_version_is_conflict_without_retry(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fake_apiserver.store.patch("nodes", "n1", {"metadata": {"labels": {"x": "y"}}})
    before = fake_apiserver.request_count
    with pytest.raises(Conflict, match="the object has been modified") as exc:
        kube_client.patch_node_annotations("n1", {"a": "b"}, resource_version="1")
    assert exc.value.status == 409
    assert fake_apiserver.request_count - before == 1


# -- retry policy ---------------------------------------------------------------------------------


def test_500_and_429_are_retried(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    f500 = fake_apiserver.faults.add(verb="patch", resource="nodes", status=500, times=2)
    assert kube_client.patch_node_annotations("n1", {"a": "1"})["metadata"]["annotations"]["a"] == "1"
    assert f500.hits == 2
    f429 = fake_apiserver.faults.add(verb="get", resource="nodes", status=429, times=1)
    assert kube_client.get_node("n1")["metadata"]["name"] == "n1"
    assert f429.hits == 1
    f503 = fake_apiserver.faults.add(verb="list", resource="pods", status=503, times=3)
    assert kube_client.list_pods() == []
    assert f503.hits == 3


def test_409_without_precondition_is_retried(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("pods", make_pod("p"))
    fault = fake_apiserver.faults.add(verb="patch", resource="pods", status=409, times=1)
    kube_client.patch_pod_metadata("default", "p", annotations={"a": "b"})
    assert fault.hits == 1
    assert fake_apiserver.store.get("pods", "p", namespace="default")["metadata"]["annotations"] == {"a": "b"}


def test_422_and_400_are_not_retried(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("pods", make_pod("p"))
    before = fake_apiserver.request_count
    with pytest.raises(InvalidRequest, match="metadata.labels: Invalid value") as exc:
        kube_client.patch_pod_metadata("default", "p", labels={"bad": "not valid!"})
    assert exc.value.status == 422 and exc.value.reason == "Invalid"
    assert fake_apiserver.request_count - before == 1
    fault = fake_apiserver.faults.add(verb="get", resource="pods", status=422, times=3)
    with pytest.raises(InvalidRequest):
        kube_client.get_pod("default", "p")
    assert fault.hits == 1


def test_retries_run_out_as_api_error(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fault = fake_apiserver.faults.add(verb="get", resource="nodes", status=500, times=100)
    with pytest.raises(ApiError, match="get nodes n1: Internal error occurred: injected fault") as exc:
        kube_client.get_node("n1")
    assert exc.value.status == 500
    assert fault.hits == kube_client.retries + 1


def test_unreachable_server_is_api_error(kubeconfig: str, fake_apiserver: FakeApiServer) -> None:
    client = KubeClient.from_kubeconfig(kubeconfig, timeout_s=1.0, retries=1, retry_initial_wait_s=0.01)
    fake_apiserver.stop()
    with pytest.raises(ApiError, match="cannot reach the API server") as exc:
        client.get_node("n1")
    assert exc.value.reason == "Transport"


def test_bad_kubeconfig_names_the_file(tmp_path) -> None:
    path = tmp_path / "nope"
    with pytest.raises(InvalidRequest, match=f"kubeconfig '{path}'"):
        KubeClient.from_kubeconfig(str(path))


@pytest.mark.parametrize(
    "content",
    [
        pytest.param("hello world\n", id="plain-text"),
        pytest.param("- a\n- b\n", id="yaml-list"),
        pytest.param("{a: [1,\n", id="broken-yaml"),
        pytest.param("apiVersion: v1\nclusters: 5\n", id="clusters-not-a-list"),
    ],
)
def test_kubeconfig_that_is_not_a_kubeconfig_names_the_file(tmp_path, content: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(content)
    with pytest.raises(InvalidRequest, match=f"kubeconfig '{path}'"):
        KubeClient.from_kubeconfig(str(path))


# -- binding and events ---------------------------------------------------------------------------


def test_bind_pod_sets_node_and_is_idempotent(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    pod = fake_apiserver.store.create("pods", make_pod("p"))
    uid = pod["metadata"]["uid"]
    fault = fake_apiserver.faults.add(verb="create", subresource="binding", status=500, times=1)
    kube_client.bind_pod("default", "p", uid=uid, node="n1")
    assert fault.hits == 1
    assert fake_apiserver.store.get("pods", "p", namespace="default")["spec"]["nodeName"] == "n1"
    kube_client.bind_pod("default", "p", uid=uid, node="n1")  # e.g. our earlier reply was lost
    with pytest.raises(Conflict, match='pod p is already assigned to node "n1"'):
        kube_client.bind_pod("default", "p", uid=uid, node="n2")
    with pytest.raises(NotFound, match='bind pod default/ghost to node n1: pods "ghost" not found'):
        kube_client.bind_pod("default", "ghost", uid=None, node="n1")


def test_bind_pod_annotations_are_written_with_the_binding(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    pod = store.create("pods", make_pod("p", annotations={"keep": "me"}))
    uid = pod["metadata"]["uid"]
    before_rv, before_requests = store.resource_version, fake_apiserver.request_count
    annos = {"hami.io/bind-phase": "allocating", "hami.io/bind-time": "1764417600"}
    kube_client.bind_pod("default", "p", uid=uid, node="n1", annotations=annos)
    bound = store.get("pods", "p", namespace="default")
    # One request and one write: nodeName and the annotations appear together (setPodHostAndAnnotations).
    assert fake_apiserver.request_count - before_requests == 1
    assert store.resource_version == before_rv + 1
    assert bound["metadata"]["resourceVersion"] == str(before_rv + 1)
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == {"keep": "me", **annos}


def test_bind_pod_retry_of_an_applied_binding_adds_missing_annotations(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    pod = store.create("pods", make_pod("p"))
    uid = pod["metadata"]["uid"]
    kube_client.bind_pod("default", "p", uid=uid, node="n1")  # bound by someone without annotations
    store.patch(
        "pods", "p", {"metadata": {"annotations": {"hami.io/bind-phase": "success"}}}, namespace="default"
    )
    annos = {"hami.io/bind-phase": "allocating", "hami.io/bind-time": "1764417600"}
    kube_client.bind_pod("default", "p", uid=uid, node="n1", annotations=annos)
    # Only what was missing: an existing bind-phase (the device plugin's "success") is never set back.
    assert store.get("pods", "p", namespace="default")["metadata"]["annotations"] == {
        "hami.io/bind-phase": "success",
        "hami.io/bind-time": "1764417600",
    }


def test_hot_calls_send_the_same_request_as_the_generated_client(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    # get / create / patch go straight through the urllib3 pool; the answers and errors are the same.
    store = fake_apiserver.store
    store.create("nodes", make_node("n1.example"))
    assert kube_client.get_node("n1.example")["metadata"]["name"] == "n1.example"
    assert kube_client.get_node("missing") is None
    lease = kube_client.create_lease("kube-system", "l", {"holderIdentity": "me"})
    assert lease["kind"] == "Lease" and lease["spec"] == {"holderIdentity": "me"}
    assert kube_client.get_lease("kube-system", "l")["spec"] == {"holderIdentity": "me"}
    with pytest.raises(Conflict, match='leases.coordination.k8s.io "l" already exists'):
        kube_client.create_lease("kube-system", "l", {})
    out = kube_client.patch("nodes", "n1.example", [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}],
                            patch_type="json")  # fmt: skip
    assert out["metadata"]["labels"] == {"a": "b"}


def test_bind_pod_refuses_a_recreated_pod(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("pods", make_pod("p"))
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: old-uid"):
        kube_client.bind_pod("default", "p", uid="old-uid", node="n1")
    assert "nodeName" not in fake_apiserver.store.get("pods", "p", namespace="default")["spec"]


def test_create_event_fields_and_dedup(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    pod = kube_client.create_pod(make_pod("p", "ml"))
    msg = "0/3 nodes are available: 3 node(s) had insufficient GPU memory (want 8000 MiB per card)"
    ev = kube_client.create_event(pod, reason="FilteringFailed", message=msg, type="Warning")
    assert ev["involvedObject"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "name": "p",
        "namespace": "ml",
        "uid": pod["metadata"]["uid"],
        "resourceVersion": pod["metadata"]["resourceVersion"],
    }
    assert (ev["reason"], ev["message"], ev["type"], ev["count"]) == ("FilteringFailed", msg, "Warning", 1)
    assert ev["source"] == {"component": "hami-scheduler"} and ev["metadata"]["namespace"] == "ml"
    again = kube_client.create_event(pod, reason="FilteringFailed", message=msg, type="Warning")
    assert again["metadata"]["name"] == ev["metadata"]["name"] and again["count"] == 2
    assert len(fake_apiserver.store.list("events", namespace="ml")) == 1
    node = fake_apiserver.store.create("nodes", make_node("n1"))
    long = kube_client.create_event(node, reason="AsymmetricGPUP2PLink", message="x" * 5000, type="Warning")
    assert long["involvedObject"]["kind"] == "Node" and long["metadata"]["namespace"] == "default"
    assert len(long["message"]) == 1024 and long["message"].endswith("...")
    with pytest.raises(InvalidRequest, match="event type 'Error'"):
        kube_client.create_event(pod, reason="X", message="y", type="Error")
    fake_apiserver.faults.add(verb="create", resource="events", status=403, times=10)
    assert kube_client.create_event(pod, reason="Other", message="refused") is None  # best effort


# -- watch and reflector --------------------------------------------------------------------------


def test_watch_error_410_raises_resource_expired(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fake_apiserver.store.patch("nodes", "n1", {"metadata": {"labels": {"a": "b"}}})
    fake_apiserver.compact()
    stream = kube_client.watch("nodes", resource_version="1", timeout_s=2)
    with pytest.raises(ResourceExpired, match="too old resource version: 1 \\(2\\)"):
        list(stream)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.lock = threading.Lock()

    def add(self, obj) -> None:
        with self.lock:
            self.calls.append(("add", obj["metadata"]["name"]))

    def update(self, old, new) -> None:
        with self.lock:
            self.calls.append(("update", new["metadata"]["name"], old["metadata"]["resourceVersion"]))

    def delete(self, obj) -> None:
        with self.lock:
            self.calls.append(("delete", obj["metadata"]["name"]))

    def sync(self, items) -> None:
        with self.lock:
            self.calls.append(("sync", sorted(i["metadata"]["name"] for i in items)))


def test_reflector_delivers_list_then_watch_events(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    store.create("pods", make_pod("a"))
    rec = Recorder()
    r = Reflector(
        kube_client, "pods", on_add=rec.add, on_update=rec.update, on_delete=rec.delete, on_sync=rec.sync
    )
    r.start()
    try:
        assert r.wait_synced(5)
        store.create("pods", make_pod("b"))
        store.patch("pods", "a", {"metadata": {"labels": {"x": "1"}}}, namespace="default")
        store.delete("pods", "b", namespace="default")
        wait_for(lambda: len(rec.calls) == 4)
        assert rec.calls == [("sync", ["a"]), ("add", "b"), ("update", "a", "1"), ("delete", "b")]
        assert [o["metadata"]["name"] for o in r.items()] == ["a"]
        assert r.resource_version == "4"
    finally:
        r.stop()


def test_reflector_relists_on_410_and_reports_differences(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    store.create("nodes", make_node("n1"))
    store.create("nodes", make_node("n2"))
    rec = Recorder()
    r = Reflector(
        kube_client,
        "nodes",
        on_add=rec.add,
        on_update=rec.update,
        on_delete=rec.delete,
        backoff_initial_s=0.05,
    )
    r.start()
    try:
        assert r.wait_synced(5)
        wait_for(lambda: fake_apiserver.open_watch_count("nodes") == 1)
        # While the watch is down, things change and the history is compacted: the re-watch from the
        # old resourceVersion gets 410 and the reflector must relist.
        fake_apiserver.faults.add(verb="watch", resource="nodes", status=503, times=1)
        fake_apiserver.drop_watches(abrupt=True)
        store.delete("nodes", "n1")
        store.patch("nodes", "n2", {"metadata": {"labels": {"gpu": "on"}}})
        store.create("nodes", make_node("n3"))
        fake_apiserver.compact()
        wait_for(lambda: r.list_count == 2)
        wait_for(lambda: len(rec.calls) == 5)
        assert rec.calls[:2] == [("add", "n1"), ("add", "n2")]
        assert sorted(rec.calls[2:]) == [("add", "n3"), ("delete", "n1"), ("update", "n2", "2")]
        assert sorted(o["metadata"]["name"] for o in r.items()) == ["n2", "n3"]
        # And it watches again from the relist: new changes still arrive.
        store.patch("nodes", "n3", {"metadata": {"labels": {"gpu": "on"}}})
        wait_for(lambda: rec.calls[-1][:2] == ("update", "n3"))
    finally:
        r.stop()


def test_reflector_resumes_after_dropped_watch_without_relist(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    store = fake_apiserver.store
    store.create("pods", make_pod("a"))
    rec = Recorder()
    r = Reflector(
        kube_client,
        "pods",
        on_add=rec.add,
        on_update=rec.update,
        on_delete=rec.delete,
        backoff_initial_s=0.05,
    )
    r.start()
    try:
        assert r.wait_synced(5)
        wait_for(lambda: fake_apiserver.open_watch_count("pods") == 1)
        fake_apiserver.faults.add(verb="watch", resource="pods", status=500, times=2)
        fake_apiserver.drop_watches(abrupt=True)
        store.create("pods", make_pod("b"))  # happens while disconnected
        wait_for(lambda: ("add", "b") in rec.calls)
        assert r.list_count == 1  # resumed from its resourceVersion, no relist needed
        assert r.watch_count >= 2
        fake_apiserver.drop_watches()  # a clean end of stream: resumed at once
        store.delete("pods", "a", namespace="default")
        wait_for(lambda: ("delete", "a") in rec.calls)
        assert r.list_count == 1
    finally:
        r.stop()


def test_reflector_follows_bookmarks_and_stops_promptly(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    fake_apiserver.store.create("pods", make_pod("a"))
    r = Reflector(kube_client, "nodes").start()
    assert r.wait_synced(5)
    assert r.resource_version == "1"
    fake_apiserver.store.create("pods", make_pod("b"))  # moves the global resourceVersion only
    wait_for(lambda: r.resource_version == "2")  # learnt from a bookmark
    start = time.monotonic()
    r.stop()
    assert time.monotonic() - start < 2
    wait_for(lambda: fake_apiserver.open_watch_count("nodes") == 0)


def test_reflector_resync_relists_on_demand(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    rec = Recorder()
    r = Reflector(kube_client, "nodes", on_sync=rec.sync).start()
    try:
        assert r.wait_synced(5)
        wait_for(lambda: fake_apiserver.open_watch_count("nodes") == 1)
        r.resync()
        assert r.wait_synced(5)
        wait_for(lambda: r.list_count == 2)
        assert rec.calls == [("sync", ["n1"]), ("sync", ["n1"])]
    finally:
        r.stop()


def test_reflector_survives_a_failing_callback(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    seen = []

    def on_add(obj) -> None:
        seen.append(obj["metadata"]["name"])
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("receiver bug")

    r = Reflector(kube_client, "nodes", on_add=on_add).start()
    try:
        assert r.wait_synced(5)
        fake_apiserver.store.create("nodes", make_node("bad"))
        fake_apiserver.store.create("nodes", make_node("good"))
        wait_for(lambda: seen == ["bad", "good"])
    finally:
        r.stop()


# -- leader election ------------------------------------------------------------------------------


def elector(
    client: KubeClient, identity: str, log: list[str], lease_duration_s: float = 1.0
) -> LeaderElector:
    return LeaderElector(
        client,
        namespace="kube-system",
        name="hami-scheduler",
        identity=identity,
        lease_duration_s=lease_duration_s,
        renew_deadline_s=0.6,
        retry_period_s=0.1,
        on_started_leading=lambda: log.append(f"{identity} started"),
        on_stopped_leading=lambda: log.append(f"{identity} stopped"),
    )


def test_one_leader_and_failover_on_release(fake_apiserver: FakeApiServer, kube_client: KubeClient) -> None:
    log: list[str] = []
    # A Lease far longer than the takeover may take: b leading within the wait below shows it used
    # the release, not the expiry.
    a = elector(kube_client, "a", log, lease_duration_s=15.0).start()
    assert a.wait_for_leadership(5)
    b = elector(kube_client, "b", log, lease_duration_s=15.0).start()
    wait_for(lambda: b.leader_identity == "a")  # b has read the Lease a holds
    assert a.is_leader and not b.is_leader and b.leader_identity == "a"
    lease = fake_apiserver.store.get("leases", "hami-scheduler", namespace="kube-system")
    assert lease["spec"]["holderIdentity"] == "a" and lease["spec"]["leaseDurationSeconds"] == 15
    a.stop()  # releases the lease: b takes over without waiting for expiry
    assert b.wait_for_leadership(10.0)
    lease = fake_apiserver.store.get("leases", "hami-scheduler", namespace="kube-system")
    assert lease["spec"]["holderIdentity"] == "b" and lease["spec"]["leaseTransitions"] == 1
    b.stop()
    assert log == ["a started", "a stopped", "b started", "b stopped"]


def test_leader_steps_down_when_it_cannot_renew(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    log: list[str] = []
    a = elector(kube_client, "a", log).start()
    try:
        assert a.wait_for_leadership(5)
        fake_apiserver.faults.add(resource="leases", status=500, times=1000)
        wait_for(lambda: not a.is_leader, timeout_s=5)
        assert log == ["a started", "a stopped"]
        fake_apiserver.faults.clear()
        assert a.wait_for_leadership(5)  # campaigns again once the API answers
    finally:
        a.stop()


def test_expired_lease_of_a_dead_leader_is_taken_over(
    fake_apiserver: FakeApiServer, kube_client: KubeClient
) -> None:
    fake_apiserver.store.create(
        "leases",
        {
            "metadata": {"name": "hami-scheduler", "namespace": "kube-system"},
            "spec": {
                "holderIdentity": "dead",
                "leaseDurationSeconds": 1,
                "renewTime": "2020-01-01T00:00:00.000000Z",
            },
        },
    )
    log: list[str] = []
    started = time.monotonic()
    b = elector(kube_client, "b", log).start()
    try:
        wait_for(lambda: b.leader_identity == "dead")  # b has read the Lease
        assert b.wait_for_leadership(10)
        # A lease not seen to change is respected for its full duration (1 s), counted from when b
        # first read it, which is after `started`: a lower bound that load cannot break.
        assert time.monotonic() - started >= 1.0
    finally:
        b.stop()
