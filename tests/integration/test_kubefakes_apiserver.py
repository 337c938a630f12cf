"""The in-memory API server, driven by the official `kubernetes` client over HTTP.

Each test states the real kube-apiserver behaviour it checks; the Status bodies are the exact
shapes kube-apiserver answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import urllib3
from kubernetes import client, config, watch

from kubefakes.apiserver import FakeApiServer
from tests.builders import make_node, make_pod

MERGE = "application/merge-patch+json"


@pytest.fixture
def api(kubeconfig: str) -> Iterator[client.ApiClient]:
    c = config.new_client_from_config(config_file=kubeconfig, persist_config=False)
    yield c
    c.close()


@pytest.fixture
def v1(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def raw(resp) -> dict:
    return json.loads(resp.data)


def error_body(excinfo: pytest.ExceptionInfo[client.ApiException]) -> dict:
    return json.loads(excinfo.value.body)


def test_list_carries_resource_version_and_items_without_kind(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fake_apiserver.store.create("pods", make_pod("a", "ns1"))
    fake_apiserver.store.create("pods", make_pod("b", "ns2"))
    body = raw(v1.list_pod_for_all_namespaces(_preload_content=False))
    assert body["kind"] == "PodList" and body["apiVersion"] == "v1"
    assert body["metadata"]["resourceVersion"] == "3"
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in body["items"]] == [
        ("ns1", "a"),
        ("ns2", "b"),
    ]
    assert "kind" not in body["items"][0]
    assert [p.metadata.name for p in v1.list_namespaced_pod("ns2").items] == ["b"]
    single = raw(v1.read_namespaced_pod("a", "ns1", _preload_content=False))
    assert single["kind"] == "Pod" and single["metadata"]["resourceVersion"] == "2"


def test_watch_streams_changes_in_order_from_a_resource_version(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    rv = v1.list_node().metadata.resource_version
    v1.patch_node("n1", {"metadata": {"labels": {"gpu": "on"}}})
    v1.create_node(make_node("n2"))
    v1.delete_node("n1")
    w = watch.Watch()
    seen = []
    for ev in w.stream(v1.list_node, resource_version=rv, timeout_seconds=1):
        seen.append(
            (
                ev["type"],
                ev["raw_object"]["metadata"]["name"],
                ev["raw_object"]["metadata"]["resourceVersion"],
            )
        )
        if len(seen) == 3:
            w.stop()
    assert seen == [("MODIFIED", "n1", "2"), ("ADDED", "n2", "3"), ("DELETED", "n1", "4")]


def test_watch_without_resource_version_starts_with_synthetic_added(
    fake_apiserver: FakeApiServer, v1
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fake_apiserver.store.create("nodes", make_node("n2"))
    w = watch.Watch()
    names = []
    for ev in w.stream(v1.list_node, resource_version="0", timeout_seconds=1):
        assert ev["type"] == "ADDED"
        names.append(ev["raw_object"]["metadata"]["name"])
        if len(names) == 2:
            w.stop()
    assert sorted(names) == ["n1", "n2"]


def test_bookmarks_carry_the_current_resource_version(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fake_apiserver.store.create("pods", make_pod("p"))  # another resource moves the global rv
    w = watch.Watch()
    for ev in w.stream(v1.list_node, resource_version="1", allow_watch_bookmarks=True, timeout_seconds=2):
        assert ev["type"] == "BOOKMARK"
        assert ev["raw_object"] == {"kind": "Node", "apiVersion": "v1", "metadata": {"resourceVersion": "2"}}
        w.stop()
        break
    assert w.resource_version == "2"


def test_too_old_resource_version_is_a_410_error_event_then_relist_works(
    fake_apiserver: FakeApiServer, v1
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    fake_apiserver.compact()
    resp = v1.list_node(watch=True, resource_version="1", timeout_seconds=1, _preload_content=False)
    assert resp.status == 200
    assert json.loads(resp.data.decode().splitlines()[0]) == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": "too old resource version: 1 (2)",
            "reason": "Expired",
            "code": 410,
        },
    }
    with pytest.raises(client.ApiException) as exc:
        for _ in watch.Watch().stream(v1.list_node, resource_version="1", timeout_seconds=1):
            pass
    assert exc.value.status == 410
    # The recovery a reflector does: relist, then watch from the list's resourceVersion.
    rv = v1.list_node().metadata.resource_version
    v1.patch_node("n1", {"metadata": {"labels": {"a": "c"}}})
    w = watch.Watch()
    for ev in w.stream(v1.list_node, resource_version=rv, timeout_seconds=1):
        assert (ev["type"], ev["raw_object"]["metadata"]["labels"]["a"]) == ("MODIFIED", "c")
        w.stop()


def test_bounded_history_expires_old_resource_versions() -> None:
    with FakeApiServer(history_size=4) as server:
        server.store.create("nodes", make_node("n1"))
        for i in range(6):
            server.store.patch("nodes", "n1", {"metadata": {"labels": {"i": str(i)}}})
        v1 = client.CoreV1Api(config.new_client_from_config(config_file=server.kubeconfig_path))
        lines = v1.list_node(watch=True, resource_version="1", timeout_seconds=1, _preload_content=False).data
        assert json.loads(lines.splitlines()[0])["object"]["code"] == 410
        # Versions still inside the window replay normally.
        lines = v1.list_node(watch=True, resource_version="5", timeout_seconds=1, _preload_content=False).data
        events = [json.loads(line) for line in lines.splitlines()]
        assert [e["object"]["metadata"]["resourceVersion"] for e in events] == ["6", "7"]


def test_merge_patch_null_removes_and_noop_keeps_resource_version(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1", annotations={"a": "1", "b": "2"}))
    out = raw(
        v1.patch_node(
            "n1",
            {"metadata": {"annotations": {"a": None, "c": "3"}}},
            _content_type=MERGE,
            _preload_content=False,
        )
    )
    assert out["metadata"]["annotations"] == {"b": "2", "c": "3"}
    assert out["metadata"]["resourceVersion"] == "2"
    again = raw(
        v1.patch_node(
            "n1", {"metadata": {"annotations": {"c": "3"}}}, _content_type=MERGE, _preload_content=False
        )
    )
    assert again["metadata"]["resourceVersion"] == "2"  # a write that changes nothing is not a new version


def test_strategic_merge_patch_merges_containers_by_name(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("pods", make_pod("p", limits=({"nvidia.com/gpu": "1"}, {"cpu": "1"})))
    patch = {"metadata": {"labels": {"x": "y"}}, "spec": {"containers": [{"name": "c1", "image": "other"}]}}
    out = raw(v1.patch_namespaced_pod("p", "default", patch, _preload_content=False))  # dict -> strategic
    assert [(c["name"], c["image"]) for c in out["spec"]["containers"]] == [
        ("c0", "busybox"),
        ("c1", "other"),
    ]
    assert out["metadata"]["labels"] == {"x": "y"}


def test_json_patch_applies_and_failed_test_is_422(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("pods", make_pod("p", annotations={"k": "v"}))
    ops = [
        {"op": "test", "path": "/metadata/annotations/k", "value": "v"},
        {"op": "add", "path": "/metadata/annotations/hami.io~1bind-phase", "value": "allocating"},
        {"op": "remove", "path": "/metadata/annotations/k"},
    ]
    out = raw(v1.patch_namespaced_pod("p", "default", ops, _preload_content=False))
    assert out["metadata"]["annotations"] == {"hami.io/bind-phase": "allocating"}
    with pytest.raises(client.ApiException) as exc:
        v1.patch_namespaced_pod(
            "p", "default", [{"op": "test", "path": "/metadata/annotations/k", "value": "v"}]
        )
    assert exc.value.status == 422
    body = error_body(exc)
    assert body["reason"] == "Invalid" and body["details"]["causes"][0]["field"] == "patch"


def test_binding_sets_node_and_second_binding_conflicts(fake_apiserver: FakeApiServer, v1) -> None:
    pod = fake_apiserver.store.create("pods", make_pod("p"))
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p", "namespace": "default", "uid": pod["metadata"]["uid"]},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    resp = v1.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert resp.status == 201
    assert raw(resp) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "code": 201,
    }
    stored = fake_apiserver.store.get("pods", "p", namespace="default")
    assert stored["spec"]["nodeName"] == "n1"
    assert [c["type"] for c in stored["status"]["conditions"]] == ["PodScheduled"]
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespaced_pod_binding("p", "default", binding, _preload_content=False)
    assert exc.value.status == 409
    assert error_body(exc) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on pods/binding "p": pod p is already assigned to node "n1"',
        "reason": "Conflict",
        "details": {"name": "p", "kind": "pods/binding"},
        "code": 409,
    }


def test_binding_to_missing_pod_is_404_and_wrong_uid_is_409(fake_apiserver: FakeApiServer, v1) -> None:
    target = {"kind": "Node", "name": "n1"}
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespaced_pod_binding(
            "ghost", "default", {"metadata": {"name": "ghost"}, "target": target}, _preload_content=False
        )
    assert (exc.value.status, error_body(exc)["message"]) == (404, 'pods "ghost" not found')
    fake_apiserver.store.create("pods", make_pod("p"))
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespaced_pod_binding(
            "p",
            "default",
            {"metadata": {"name": "p", "uid": "other"}, "target": target},
            _preload_content=False,
        )
    assert exc.value.status == 409
    assert "Precondition failed: UID in precondition: other" in error_body(exc)["message"]
    assert fake_apiserver.store.get("pods", "p", namespace="default")["spec"].get("nodeName") is None


def test_update_with_stale_resource_version_is_409(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    node = raw(v1.read_node("n1", _preload_content=False))
    v1.patch_node("n1", {"metadata": {"labels": {"moved": "on"}}})
    node["metadata"]["labels"]["mine"] = "x"
    with pytest.raises(client.ApiException) as exc:
        v1.replace_node("n1", node, _preload_content=False)
    assert error_body(exc) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "reason": "Conflict",
        "details": {"name": "n1", "kind": "nodes"},
        "code": 409,
    }
    # A merge patch naming the stale version is refused the same way.
    with pytest.raises(client.ApiException) as exc:
        v1.patch_node(
            "n1", {"metadata": {"resourceVersion": "1", "annotations": {"a": "b"}}}, _content_type=MERGE
        )
    assert exc.value.status == 409


def test_main_resource_ignores_status_and_status_subresource_ignores_metadata(
    fake_apiserver: FakeApiServer, v1
) -> None:
    fake_apiserver.store.create("pods", make_pod("p"))
    out = raw(
        v1.patch_namespaced_pod(
            "p", "default", {"status": {"phase": "Running"}}, _content_type=MERGE, _preload_content=False
        )
    )
    assert out["status"]["phase"] == "Pending"
    out = raw(
        v1.patch_namespaced_pod_status(
            "p",
            "default",
            {"metadata": {"labels": {"x": "y"}}, "status": {"phase": "Running"}},
            _content_type=MERGE,
            _preload_content=False,
        )
    )
    assert out["status"]["phase"] == "Running" and out["metadata"]["labels"] == {}


def test_create_defaults_errors_and_validation(fake_apiserver: FakeApiServer, v1) -> None:
    created = raw(v1.create_namespaced_pod("default", make_pod("p", phase="Running"), _preload_content=False))
    assert created["status"] == {"phase": "Pending"}  # the request's status is dropped on create
    assert created["metadata"]["uid"] and created["metadata"]["creationTimestamp"].endswith("Z")
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespaced_pod("default", make_pod("p"), _preload_content=False)
    assert (exc.value.status, error_body(exc)["reason"], error_body(exc)["message"]) == (
        409,
        "AlreadyExists",
        'pods "p" already exists',
    )
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespaced_pod("default", make_pod("Bad_Name"), _preload_content=False)
    body = error_body(exc)
    assert exc.value.status == 422 and body["reason"] == "Invalid"
    assert body["message"].startswith(
        'Pod "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123'
    )
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespaced_pod("other", make_pod("q", "default"), _preload_content=False)
    assert exc.value.status == 400
    assert (
        error_body(exc)["message"]
        == "the namespace of the provided object does not match the namespace sent on the request"
    )


def test_field_and_label_selectors(fake_apiserver: FakeApiServer, v1) -> None:
    store = fake_apiserver.store
    store.create("pods", make_pod("a", node_name="n1", labels={"app": "x", "tier": "gpu"}, phase="Running"))
    store.create("pods", make_pod("b", labels={"app": "y"}))
    store.create(
        "pods",
        make_pod("c", "kube-system", node_name="n2", scheduler_name="default-scheduler", phase="Succeeded"),
    )

    def names(**kw) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in raw(v1.list_pod_for_all_namespaces(_preload_content=False, **kw))["items"]
        ]

    assert names(field_selector="spec.nodeName=n1") == ["a"]
    assert names(field_selector="spec.nodeName=") == ["b"]
    assert names(field_selector="spec.nodeName!=,status.phase!=Succeeded") == ["a"]
    assert names(field_selector="spec.schedulerName=hami-scheduler") == ["a", "b"]
    assert names(field_selector="metadata.namespace=kube-system") == ["c"]
    assert names(field_selector="metadata.name==b") == ["b"]
    assert names(label_selector="app=x") == ["a"]
    assert names(label_selector="app!=x") == ["b", "c"]
    assert names(label_selector="app in (x,y)") == ["a", "b"]
    assert names(label_selector="app notin (x)") == ["b", "c"]
    assert names(label_selector="tier") == ["a"]
    assert names(label_selector="!tier") == ["b", "c"]
    assert names(label_selector="app,tier==gpu") == ["a"]
    with pytest.raises(client.ApiException) as exc:
        v1.list_pod_for_all_namespaces(field_selector="spec.foo=bar")
    assert (exc.value.status, error_body(exc)["message"]) == (400, "field label not supported: spec.foo")


def test_watch_with_selector_sees_objects_leave_and_enter(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("pods", make_pod("p", labels={"gpu": "yes"}))
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"gpu": "no"}}})
    v1.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"gpu": "yes"}}})
    w = watch.Watch()
    seen = []
    for ev in w.stream(
        v1.list_namespaced_pod, "default", label_selector="gpu=yes", resource_version=rv, timeout_seconds=1
    ):
        seen.append(ev["type"])
        if len(seen) == 2:
            w.stop()
    assert seen == ["DELETED", "ADDED"]


def test_injected_500_and_429_then_success(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fault = fake_apiserver.faults.add(verb="patch", resource="nodes", status=500, times=2)
    for _ in range(2):
        with pytest.raises(client.ApiException) as exc:
            v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
        assert exc.value.status == 500
        assert error_body(exc)["message"] == "Internal error occurred: injected fault"
    v1.patch_node("n1", {"metadata": {"labels": {"a": "b"}}})
    assert fault.hits == 2
    fake_apiserver.faults.add(verb="get", resource="nodes", name="n1", status=429, retry_after_s=3)
    with pytest.raises(urllib.error.HTTPError) as http_exc:
        urllib.request.urlopen(fake_apiserver.url + "/api/v1/nodes/n1")
    assert http_exc.value.code == 429 and http_exc.value.headers["Retry-After"] == "3"
    assert json.loads(http_exc.value.read())["details"] == {"retryAfterSeconds": 3}
    # The official client's default urllib3 retry policy honours Retry-After on 429 by itself.
    fake_apiserver.faults.add(verb="get", resource="nodes", name="n1", status=429, retry_after_s=1)
    start = time.monotonic()
    assert v1.read_node("n1").metadata.name == "n1"
    assert time.monotonic() - start >= 0.9


def test_injected_hang_times_out_the_client(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    fake_apiserver.faults.add(verb="GET", path=r"^/api/v1/nodes/n1$", status=None, hang_s=5, times=10)
    start = time.monotonic()
    # urllib3's default policy (3 retries) retries the read timeouts, then gives up.
    with pytest.raises(urllib3.exceptions.MaxRetryError) as exc:
        v1.read_node("n1", _request_timeout=(1, 0.2))
    assert isinstance(exc.value.reason, urllib3.exceptions.ReadTimeoutError)
    assert time.monotonic() - start < 2.5
    fake_apiserver.faults.clear()
    assert v1.read_node("n1").metadata.name == "n1"


def test_drop_watches_ends_open_streams(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    resp = v1.list_node(watch=True, resource_version="1", timeout_seconds=30, _preload_content=False)
    deadline = time.monotonic() + 2
    while fake_apiserver.open_watch_count("nodes") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert fake_apiserver.drop_watches() == 1
    start = time.monotonic()
    assert resp.data == b""  # the stream ends instead of running for 30 s
    assert time.monotonic() - start < 2


def test_leases_and_events(fake_apiserver: FakeApiServer, api) -> None:
    coord = client.CoordinationV1Api(api)
    lease = raw(
        coord.create_namespaced_lease(
            "kube-system",
            {"metadata": {"name": "hami"}, "spec": {"holderIdentity": "a"}},
            _preload_content=False,
        )
    )
    lease["spec"]["holderIdentity"] = "b"
    updated = raw(coord.replace_namespaced_lease("hami", "kube-system", lease, _preload_content=False))
    assert updated["spec"]["holderIdentity"] == "b"
    with pytest.raises(client.ApiException) as exc:
        coord.replace_namespaced_lease("hami", "kube-system", lease, _preload_content=False)  # stale now
    assert error_body(exc)["message"].startswith(
        'Operation cannot be fulfilled on leases.coordination.k8s.io "hami"'
    )
    assert error_body(exc)["details"] == {"name": "hami", "group": "coordination.k8s.io", "kind": "leases"}
    v1 = client.CoreV1Api(api)
    v1.create_namespaced_event(
        "default",
        {
            "metadata": {"name": "p.1"},
            "involvedObject": {"kind": "Pod", "name": "p"},
            "reason": "BindingFailed",
            "type": "Warning",
        },
    )
    events = fake_apiserver.store.list("events", field_selector="involvedObject.name=p,reason=BindingFailed")
    assert [e["metadata"]["name"] for e in events] == ["p.1"]


def post(url: str, body: object = None) -> dict:
    data = json.dumps(body).encode() if body is not None else b""
    req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as resp:
        return json.loads(resp.read())


def test_command_line_seeds_serves_and_takes_control_requests(tmp_path) -> None:
    out = tmp_path / "kubeconfig"
    seed = tmp_path / "seed.json"
    seed.write_text(
        json.dumps([{"kind": "Node", **make_node("n1")}, {"kind": "Pod", **make_pod("p", phase="Running")}])
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubefakes.apiserver",
            "--port",
            "0",
            "--kubeconfig-out",
            str(out),
            "--seed",
            str(seed),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert json.loads(out.read_text())["clusters"][0]["cluster"]["server"] == url
        v1 = client.CoreV1Api(config.new_client_from_config(config_file=str(out)))
        assert [n.metadata.name for n in v1.list_node().items] == ["n1"]
        assert v1.read_namespaced_pod("p", "default").status.phase == "Running"  # seeded status kept
        assert post(url + "/_fake/objects", {"kind": "Node", **make_node("n2")}) == {"created": 1}
        assert post(url + "/_fake/faults", {"verb": "get", "resource": "nodes", "status": 500}) == {
            "added": 1
        }
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(url + "/api/v1/nodes/n2")
        assert exc.value.code == 500
        with urllib.request.urlopen(url + "/api/v1/nodes/n2") as resp:
            assert json.loads(resp.read())["metadata"]["name"] == "n2"
        assert post(url + "/_fake/compact") == {"compacted": True}
        lines = v1.list_node(watch=True, resource_version="1", timeout_seconds=1, _preload_content=False).data
        assert json.loads(lines.splitlines()[0])["object"]["code"] == 410
        assert post(url + "/_fake/drop-watches?abrupt=true") == {"dropped": 0}
    finally:
        proc.terminate()
        proc.wait(10)


def test_watch_ends_after_timeout_seconds(fake_apiserver: FakeApiServer, v1) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    start = time.monotonic()
    resp = v1.list_node(watch=True, resource_version="1", timeout_seconds=1, _preload_content=False)
    assert resp.data == b""
    assert 0.9 <= time.monotonic() - start < 2.5


def test_list_pagination_with_limit_and_continue(fake_apiserver: FakeApiServer, v1) -> None:
    for i in range(5):
        fake_apiserver.store.create("nodes", make_node(f"n{i}"))
    first = v1.list_node(limit=2)
    assert [n.metadata.name for n in first.items] == ["n0", "n1"] and first.metadata._continue
    rest = v1.list_node(limit=10, _continue=first.metadata._continue)
    assert [n.metadata.name for n in rest.items] == ["n2", "n3", "n4"] and not rest.metadata._continue
    assert rest.metadata.resource_version == first.metadata.resource_version


def test_namespaces_minimal(v1) -> None:
    ns = raw(v1.create_namespace({"metadata": {"name": "gpu-system"}}, _preload_content=False))
    assert ns["status"] == {"phase": "Active"}
    assert ns["metadata"]["labels"] == {"kubernetes.io/metadata.name": "gpu-system"}
    assert [n.metadata.name for n in v1.list_namespace().items] == ["gpu-system"]
    with pytest.raises(client.ApiException) as exc:
        v1.create_namespace({"metadata": {"name": "Not.A.Label"}})
    assert exc.value.status == 422


def _demo_process(tmp_path, *extra: str) -> tuple[subprocess.Popen, str]:
    out = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubefakes.apiserver", "--kubeconfig-out", str(out), "--demo", *extra],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    proc.stdout.readline()
    return proc, str(out)


@pytest.mark.parametrize("now", [None, "2026-05-04T10:00:00Z"], ids=["clock-now", "docs-clock"])
def test_demo_serves_the_operations_docs_cluster(tmp_path, now: str | None) -> None:
    # docs/operations.md: `python -m kubefakes.apiserver --demo`, then `hami inspect` against it.
    from hami import annotations as A

    before = time.time()
    proc, kubeconfig = _demo_process(tmp_path, *(["--now", now] if now else []))
    try:
        r = subprocess.run([sys.executable, "-m", "hami.cli", "inspect", "--kubeconfig", kubeconfig, "-o", "json",
                            "--now", now or "2026-05-04T10:00:00Z"], capture_output=True, text=True, timeout=60)  # fmt: skip
        assert r.returncode == 0 and r.stderr == "", r.stderr
        nodes = {n["name"]: n for n in json.loads(r.stdout)["nodes"]}
        assert sorted(nodes) == [
            "cpu-1",
            "gpu-a100-1",
            "gpu-a100-2",
            "gpu-t4-1",
            "gpu-t4-2",
            "gpu-v100-1",
            "gpu-v100-2",
        ]
        v1 = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        node = v1.read_node("gpu-a100-2")
        taken = A.decode_node_lock(node.metadata.annotations[A.NODE_LOCK]).time.timestamp()
        if now:
            assert taken == datetime(2026, 5, 4, 9, 57, 50, tzinfo=UTC).timestamp()
        else:
            # The clock is now: the lock was taken 130 s before the server started.
            assert before - 130 - 5 <= taken <= time.time() - 130 + 1
        assert v1.read_namespaced_config_map("hami-scheduler-device", "hami-system").data[
            "device-config.yaml"
        ]
    finally:
        proc.terminate()
        proc.wait(10)


def test_demo_clock_errors() -> None:
    for argv, msg in ((["--now", "2026-05-04T10:00:00Z"], "--now: only with --demo"),
                      (["--demo", "--now", "tomorrow"], "want an RFC 3339 time")):  # fmt: skip
        r = subprocess.run([sys.executable, "-m", "kubefakes.apiserver", *argv], capture_output=True, text=True,
                           timeout=30)  # fmt: skip
        assert r.returncode == 2 and msg in r.stderr, r.stderr
