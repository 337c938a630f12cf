"""`KubeClient`'s coroutine calls (`hami.kube.aio.AsyncTransport`) over real HTTP against the in-memory API
server: the same answers, errors and retry policy as the synchronous calls (409 with and without a
precondition, 404, 5xx and 429 retried, timeouts), the Binding's idempotence and events' repeat counting."""

from __future__ import annotations

import asyncio
import ssl
import threading

import pytest
from kubernetes import client as k8s

from hami.errors import Conflict, NotFound
from hami.kube import ApiError, KubeClient
from hami.kube.aio import ssl_context
from kubefakes.apiserver import FakeApiServer
from tests.builders import make_node, make_pod


@pytest.fixture
async def aclient(kube_client: KubeClient):  # type: ignore[no-untyped-def]
    yield kube_client
    await kube_client.aclose()


async def test_coroutines_return_the_plain_dicts_of_the_sync_calls(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    store = fake_apiserver.store
    store.create("nodes", make_node("n1", annotations={"keep": "1", "drop": "2"}))
    store.create("pods", make_pod("p", "ml"))
    assert aclient.async_native
    assert await aclient.aget("nodes", "n1") == aclient.get_node("n1")
    assert await aclient.aget("nodes", "missing") is None
    node = await aclient.apatch_node_annotations("n1", {"drop": None, "x": "y"})
    assert node["metadata"]["annotations"] == {"keep": "1", "x": "y"}
    pod = await aclient.apatch_pod_metadata("ml", "p", annotations={"a": "b"}, labels={"l": "v"})
    assert (pod["metadata"]["annotations"], pod["metadata"]["labels"]) == ({"a": "b"}, {"l": "v"})
    assert store.get("pods", "p", namespace="ml")["metadata"]["annotations"] == {"a": "b"}
    lease = await aclient.acreate("leases", {"metadata": {"name": "l", "namespace": "kube-system"}, "spec": {}})
    assert lease["kind"] == "Lease"
    with pytest.raises(Conflict, match='leases.coordination.k8s.io "l" already exists'):
        await aclient.acreate("leases", {"metadata": {"name": "l", "namespace": "kube-system"}, "spec": {}})
    with pytest.raises(NotFound, match='patch pods ml/ghost: pods "ghost" not found'):
        await aclient.apatch_pod_metadata("ml", "ghost", annotations={"a": "b"})


async def test_a_precondition_conflict_is_not_retried_and_one_without_is(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    store = fake_apiserver.store
    store.create("nodes", make_node("n1"))
    store.patch("nodes", "n1", {"metadata": {"labels": {"x": "y"}}})
    before = fake_apiserver.request_count
    with pytest.raises(Conflict, match="the object has been modified") as exc:
        await aclient.apatch_node_annotations("n1", {"a": "b"}, resource_version="1")
    assert exc.value.status == 409 and fake_apiserver.request_count - before == 1
    uid = store.create("pods", make_pod("p"))["metadata"]["uid"]
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: old"):
        await aclient.apatch_pod_metadata("default", "p", annotations={"a": "b"}, uid="old")
    fault = fake_apiserver.faults.add(verb="patch", resource="pods", status=409, times=1)
    await aclient.apatch_pod_metadata("default", "p", annotations={"a": "b"})
    assert fault.hits == 1
    assert store.get("pods", "p", namespace="default")["metadata"]["annotations"] == {"a": "b"}
    await aclient.apatch_pod_metadata("default", "p", annotations={"c": "d"}, uid=uid)


async def test_5xx_and_429_are_retried_until_the_retries_run_out(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    f500 = fake_apiserver.faults.add(verb="patch", resource="nodes", status=500, times=2)
    f429 = fake_apiserver.faults.add(verb="get", resource="nodes", status=429, times=1, retry_after_s=0)
    assert (await aclient.apatch_node_annotations("n1", {"a": "1"}))["metadata"]["annotations"] == {"a": "1"}
    assert (await aclient.aget("nodes", "n1"))["metadata"]["name"] == "n1"
    assert (f500.hits, f429.hits) == (2, 1)
    fault = fake_apiserver.faults.add(verb="get", resource="nodes", status=503, times=100)
    with pytest.raises(ApiError, match="get nodes n1: ") as exc:
        await aclient.aget("nodes", "n1")
    assert exc.value.status == 503 and fault.hits == aclient.retries + 1
    fake_apiserver.faults.clear()
    bad = fake_apiserver.faults.add(verb="get", resource="nodes", status=422, times=3)
    with pytest.raises(Exception, match="get nodes n1"):
        await aclient.aget("nodes", "n1")
    assert bad.hits == 1  # an answer, not an accident: never retried


async def test_a_timeout_is_retried_and_then_is_an_api_error(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    aclient.timeout_s = 0.3
    await aclient.aclose()  # the session takes its timeouts when it opens
    stall = fake_apiserver.faults.add(verb="get", resource="nodes", hang_s=2.0, times=1)
    assert (await aclient.aget("nodes", "n1"))["metadata"]["name"] == "n1"
    assert stall.hits == 1
    fake_apiserver.faults.add(verb="get", resource="nodes", hang_s=2.0, times=100)
    aclient.retries = 1
    with pytest.raises(ApiError, match="get nodes n1: cannot reach the API server") as exc:
        await aclient.aget("nodes", "n1")
    assert exc.value.reason == "Transport"


async def test_an_unreachable_server_is_an_api_error(fake_apiserver: FakeApiServer, kubeconfig: str) -> None:
    client = KubeClient.from_kubeconfig(kubeconfig, retries=1, retry_initial_wait_s=0.01, timeout_s=1.0)
    fake_apiserver.stop()
    try:
        with pytest.raises(ApiError, match="get nodes n1: cannot reach the API server"):
            await client.aget("nodes", "n1")
    finally:
        await client.aclose()


async def test_abind_pod_is_the_bind_pod_of_the_sync_client(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    store = fake_apiserver.store
    uid = store.create("pods", make_pod("p"))["metadata"]["uid"]
    fault = fake_apiserver.faults.add(verb="create", subresource="binding", status=500, times=1)
    annos = {"hami.io/bind-phase": "allocating"}
    await aclient.abind_pod("default", "p", uid=uid, node="n1", annotations=annos)
    bound = store.get("pods", "p", namespace="default")
    assert fault.hits == 1 and bound["spec"]["nodeName"] == "n1"
    assert bound["metadata"]["annotations"] == annos
    # A retry of an applied Binding succeeds and adds what the pod lacks.
    await aclient.abind_pod("default", "p", uid=uid, node="n1", annotations={**annos, "hami.io/bind-time": "1"})
    assert store.get("pods", "p", namespace="default")["metadata"]["annotations"]["hami.io/bind-time"] == "1"
    with pytest.raises(Conflict):
        await aclient.abind_pod("default", "p", uid=uid, node="n2")
    with pytest.raises(NotFound, match='bind pod default/ghost to node n1: pods "ghost" not found'):
        await aclient.abind_pod("default", "ghost", uid=None, node="n1")
    store.create("pods", make_pod("q"))
    with pytest.raises(Conflict, match="Precondition failed: UID in precondition: old-uid"):
        await aclient.abind_pod("default", "q", uid="old-uid", node="n1")


async def test_acreate_event_counts_repeats_and_is_best_effort(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    pod = fake_apiserver.store.create("pods", make_pod("p", "ml"))
    ev = await aclient.acreate_event(pod, reason="FilteringFailed", message="m", type="Warning")
    assert (ev["reason"], ev["type"], ev["count"], ev["involvedObject"]["name"]) == ("FilteringFailed", "Warning", 1, "p")
    again = await aclient.acreate_event(pod, reason="FilteringFailed", message="m", type="Warning")
    assert again["metadata"]["name"] == ev["metadata"]["name"] and again["count"] == 2
    # The sync and the async calls share the repeat log.
    third = aclient.create_event(pod, reason="FilteringFailed", message="m", type="Warning")
    assert third["count"] == 3 and len(fake_apiserver.store.list("events", namespace="ml")) == 1
    fake_apiserver.faults.add(verb="create", resource="events", status=403, times=10)
    assert await aclient.acreate_event(pod, reason="Other", message="refused") is None


async def test_calls_from_a_second_event_loop_open_their_own_session(
    fake_apiserver: FakeApiServer, aclient: KubeClient
) -> None:
    fake_apiserver.store.create("nodes", make_node("n1"))
    assert (await aclient.aget("nodes", "n1"))["metadata"]["name"] == "n1"
    seen: list[str] = []

    def other_loop() -> None:
        async def go() -> None:
            seen.append((await aclient.aget("nodes", "n1"))["metadata"]["name"])
            await aclient.aclose()

        asyncio.run(go())

    t = threading.Thread(target=other_loop)
    t.start()
    t.join(10)
    assert seen == ["n1"]
    assert (await aclient.aget("nodes", "n1"))["metadata"]["name"] == "n1"


async def test_with_a_proxy_the_coroutines_use_the_sync_path(fake_apiserver: FakeApiServer, kubeconfig: str) -> None:
    client = KubeClient.from_kubeconfig(kubeconfig)
    client.api_client.configuration.proxy = "http://proxy.invalid:3128"
    proxied = KubeClient(client.api_client)
    assert not proxied.async_native
    calls: list[str] = []
    proxied._send = lambda req: calls.append(req.what) or {"ok": True}  # type: ignore[method-assign]
    assert await proxied.aget("nodes", "n1") == {"ok": True}
    assert calls == ["get nodes n1"]
    await proxied.aclose()


def test_tls_context_follows_the_configuration(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = k8s.Configuration()
    cfg.host = "http://127.0.0.1:1"
    assert ssl_context(cfg) is None
    cfg.host = "https://127.0.0.1:1"
    ctx = ssl_context(cfg)
    assert ctx is not None and ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    cfg.verify_ssl = False
    insecure = ssl_context(cfg)
    assert insecure is not None and insecure.verify_mode == ssl.CERT_NONE and not insecure.check_hostname
