"""The real extender against the in-memory API server, driven with the JSON kube-scheduler sends.

Happy path in both cache modes (a pod goes from unscheduled to bound with HAMi's annotation strings),
pass-through of device-less pods, request-level errors, forged annotations, metrics, TLS.
"""

from __future__ import annotations

import re
import ssl

import pytest

from hami import annotations as A
from hami.model import Device
from kubefakes.apiserver import FakeApiServer
from tests.builders import UUID_A, UUID_B, V100, gpu_node, gpu_pod
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready

V100_CARDS = [Device(UUID_A, 0, 10, 32768, 100, V100), Device(UUID_B, 1, 10, 32768, 100, V100, numa=1)]


@pytest.fixture
async def extender(fake_apiserver: FakeApiServer):
    api = fake_apiserver
    api.store.create("nodes", gpu_node("node1", V100_CARDS))
    api.store.create("nodes", gpu_node("node2", [Device("GPU-small", 0, 10, 4096, 100, "NVIDIA-Tesla T4")]))
    api.store.create("nodes", {"metadata": {"name": "cpu1"}, "spec": {}, "status": {}})
    server = await start_extender(api)
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


def events_for(api: FakeApiServer, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["reason"], e["type"], e["message"])
        for e in api.store.list("events", namespace="default")
        if e["involvedObject"]["name"] == name
    ]


@pytest.mark.parametrize("cache_capable", [True, False], ids=["node-names", "node-objects"])
async def test_pod_goes_from_unscheduled_to_bound_with_hami_annotations(
    fake_apiserver: FakeApiServer,
    extender,
    session,
    cache_capable: bool,
) -> None:
    api = fake_apiserver
    pod = create_pod(api, gpu_pod("gpu-pod", mem=8000, cores=10))
    sched = Scheduler(session, extender.url, cache_capable=cache_capable)
    nodes = [api.store.get("nodes", n) for n in ("node1", "node2", "cpu1")]
    result = await sched.filter(pod, nodes)

    assert result["Error"] == ""
    if cache_capable:
        assert result["NodeNames"] == ["node1"] and result["Nodes"] is None
    else:
        # The very Node object that was sent comes back, nothing else.
        assert result["NodeNames"] is None
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["node1"]
        assert result["Nodes"]["items"][0]["metadata"]["annotations"] == nodes[0]["metadata"]["annotations"]
    assert set(result["FailedNodes"]) == {"node2", "cpu1"}
    assert result["FailedNodes"]["cpu1"] == "node unregistered: no device registration annotation"
    # node2's only card has 4096 MiB: rejected by the core's pre-screen or its per-card fit.
    assert "CardInsufficientMemory" in result["FailedNodes"]["node2"] or result["FailedNodes"][
        "node2"
    ].startswith("node node1 preferred by node policy")

    stored = api.store.get("pods", "gpu-pod", namespace="default")
    annos = stored["metadata"]["annotations"]
    # HAMi's spread card policy puts the first pod on the emptiest card; both are empty -> the tie
    # goes to the card HAMi's reverse iteration reaches first.
    (uuid,) = re.findall(r"^(GPU-[0-9a-f-]+),NVIDIA,8000,10:;$", annos[A.NVIDIA_TO_ALLOCATE])
    assert uuid in (UUID_A, UUID_B)
    assert annos[A.NVIDIA_ALLOCATED] == f"{uuid},NVIDIA,8000,10:;"
    assert annos[A.ASSIGNED_NODE] == "node1"
    assert re.fullmatch(r"\d{10}", annos[A.ASSIGNED_TIME])
    assert stored["metadata"]["labels"][A.ASSIGNED_NODE] == "node1"
    assert extender.state.pod_node(pod["metadata"]["uid"]) == "node1"

    bound = await sched.bind(pod, "node1")
    assert bound == {"Error": ""}
    stored = api.store.get("pods", "gpu-pod", namespace="default")
    assert stored["spec"]["nodeName"] == "node1"
    assert stored["metadata"]["annotations"][A.BIND_PHASE] == "allocating"
    assert re.fullmatch(r"\d{10}", stored["metadata"]["annotations"][A.BIND_TIME])
    lock = api.store.get("nodes", "node1")["metadata"]["annotations"][A.NODE_LOCK]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(Z|[+-]\d\d:\d\d),default,gpu-pod", lock)

    await extender.events.drain()
    evs = events_for(api, "gpu-pod")
    assert (
        "FilteringSucceed",
        "Normal",
        f"find fit node(node1), cards {uuid}; 2 other candidate nodes not chosen",
    ) in evs
    assert ("BindingSucceed", "Normal", "Successfully binding node [node1] to default/gpu-pod") in evs


async def test_pod_without_managed_device_passes_every_node(
    fake_apiserver: FakeApiServer,
    extender,
    session,
) -> None:
    pod = create_pod(fake_apiserver, gpu_pod("web", gpus=0))
    sched = Scheduler(session, extender.url)
    result = await sched.filter(pod, ["cpu1", "node1", "node2"])
    assert result == {
        "Nodes": None,
        "NodeNames": ["cpu1", "node1", "node2"],
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": None,
        "Error": "",
    }
    assert (
        "annotations" not in fake_apiserver.store.get("pods", "web", namespace="default")["metadata"]
        or not (fake_apiserver.store.get("pods", "web", namespace="default")["metadata"]["annotations"])
    )


async def test_nothing_fits_lists_every_node_with_its_reason_and_records_an_event(
    fake_apiserver: FakeApiServer,
    extender,
    session,
) -> None:
    pod = create_pod(fake_apiserver, gpu_pod("huge", mem=40000, cores=10))
    result = await Scheduler(session, extender.url).filter(pod, ["node1", "node2", "ghost"])
    assert result["NodeNames"] == [] and result["Error"] == ""
    # The reasons in the words of the event below (kube-scheduler shows FailedNodes to the user).
    assert result["FailedNodes"] == {
        "node1": "2/2 CardInsufficientMemory (no card has 40000 MiB free)",
        "node2": "1/1 CardInsufficientMemory (no card has 40000 MiB free)",
        "ghost": "node unregistered",
    }
    await extender.events.drain()
    (ev,) = [e for e in events_for(fake_apiserver, "huge") if e[0] == "FilteringFailed"]
    assert ev[1] == "Warning"
    assert ev[2] == (
        "no available node, 3 nodes do not meet: 1 node 1/1 CardInsufficientMemory (no card has 40000 MiB free) "
        "(node2); 1 node 2/2 CardInsufficientMemory (no card has 40000 MiB free) (node1); 1 node node unregistered "
        "(ghost)"
    )


@pytest.mark.parametrize(
    ("body", "error"),
    [
        (b"", "ExtenderArgs: empty body; want a JSON object"),
        (b"{not json", "ExtenderArgs: body is not valid JSON"),
        (b"[]", "ExtenderArgs: the body must be a JSON object, got list"),
        (b'{"Pod": null, "NodeNames": ["node1"]}', "ExtenderArgs.Pod: missing or not an object"),
        (
            b'{"Pod": {"metadata": {"name": "p", "uid": "u"}}, "Nodes": null, "NodeNames": null}',
            "ExtenderArgs: NodeNames and Nodes are both missing or null",
        ),
        (
            b'{"Pod": {"metadata": {"name": "p", "uid": "u"}}, "NodeNames": []}',
            "ExtenderArgs: the candidate node list is empty",
        ),
        (
            b'{"Pod": {"metadata": {"name": "p"}}, "NodeNames": ["n"]}',
            "ExtenderArgs.Pod.metadata.uid: missing",
        ),
        (
            b'{"Pod": {"metadata": {"name": "p", "uid": "u"}}, "NodeNames": [1]}',
            "ExtenderArgs.NodeNames: want an array of non-empty node names",
        ),
    ],
)
async def test_bad_filter_requests_get_a_clear_error_and_http_200(
    extender, session, body: bytes, error: str
) -> None:
    status, result = await Scheduler(session, extender.url).post("filter", body)
    assert status == 200
    assert result["Error"].startswith(error), result["Error"]
    assert result["NodeNames"] is None and result["Nodes"] is None


async def test_oversized_body_is_refused_and_the_server_stays_up(extender, session) -> None:
    big = b'{"Pod": {"metadata": {"name": "p", "uid": "u"}}, "NodeNames": ["' + b"n" * (1 << 20) + b'"]}'
    sched = Scheduler(session, extender.url)
    status, result = await sched.post("filter", big)
    assert status == 200
    assert result["Error"] == (
        "ExtenderArgs: request body larger than 1048576 bytes; use nodeCacheCapable: true (names instead of "
        "full Node objects) or raise --max-request-bytes"
    )
    status, result = await sched.post("bind", b'{"PodName": "' + b"x" * (1 << 20) + b'"}')
    assert status == 200 and result["Error"].startswith("ExtenderBindingArgs: request body larger than")
    async with session.get(f"{extender.url}/healthz") as r:
        assert r.status == 200 and await r.text() == "ok\n"


async def test_bad_bind_requests(extender, session) -> None:
    sched = Scheduler(session, extender.url)
    status, result = await sched.post("bind", b'{"PodName": "p", "Node": "node1"}')
    assert status == 200
    assert result == {
        "Error": "ExtenderBindingArgs: PodName, PodNamespace and Node must be non-empty strings (PodUID a "
        "string); 'podnamespace' is None"
    }
    status, result = await sched.post("bind", b"nope")
    assert result["Error"].startswith("ExtenderBindingArgs: body is not valid JSON")


async def test_bind_without_reservation_is_refused(fake_apiserver, extender, session) -> None:
    pod = create_pod(fake_apiserver, gpu_pod("never-filtered"))
    result = await Scheduler(session, extender.url).bind(pod, "node1")
    assert result["Error"] == (
        "pod default/never-filtered has no device reservation on node node1 (reservation expired or the "
        "extender restarted before recording it); it will be filtered again"
    )
    assert A.NODE_LOCK not in fake_apiserver.store.get("nodes", "node1")["metadata"]["annotations"]


async def test_forged_allocation_of_another_scheduler_is_never_counted(
    fake_apiserver: FakeApiServer,
    extender,
    session,
) -> None:
    api = fake_apiserver
    forged = f"{UUID_A},NVIDIA,32768,100:;"
    annotations = {A.ASSIGNED_NODE: "node1", A.NVIDIA_ALLOCATED: forged, A.NVIDIA_TO_ALLOCATE: forged}
    for i, card in enumerate((UUID_A, UUID_B)):
        value = f"{card},NVIDIA,32768,100:;"
        other = gpu_pod(f"forged-{i}", scheduler="default-scheduler",
                        annotations={**annotations, A.NVIDIA_ALLOCATED: value})  # fmt: skip
        other["spec"]["nodeName"] = "node1"
        other["status"] = {"phase": "Running"}
        api.store.create("pods", other)
    await eventually(lambda: len(extender.runtime.sync.pods.items()) == 2, what="pods seen")
    assert extender.state.usage_snapshot()["node1"] == {}
    pod = create_pod(api, gpu_pod("mine", mem=32768, cores=100))
    result = await Scheduler(session, extender.url).filter(pod, ["node1"])
    assert result["NodeNames"] == ["node1"], result


async def test_pod_of_another_scheduler_asking_devices_is_an_error(fake_apiserver, extender, session) -> None:
    pod = create_pod(fake_apiserver, gpu_pod("stray", scheduler="default-scheduler"))
    result = await Scheduler(session, extender.url).filter(pod, ["node1"])
    assert result["Error"] == (
        "pod default/stray asks for devices but has spec.schedulerName 'default-scheduler'; this extender "
        "places pods of scheduler 'hami-scheduler' (let the webhook set it, or run the extender with "
        "--scheduler-name matching the kube-scheduler profile)"
    )


async def test_metrics_use_hami_names_labels_and_units(fake_apiserver, extender, session) -> None:
    api = fake_apiserver
    api.store.create(
        "resourcequotas",
        {
            "metadata": {"name": "gpu", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "64000"}},
        },
    )
    await eventually(
        lambda: extender.state.quota.limit("default", "nvidia.com/gpumem") == 64000, what="quota"
    )
    pod = create_pod(api, gpu_pod("m", mem=8000, cores=10))
    result = await Scheduler(session, extender.url).filter(pod, ["node1"])
    uuid = api.store.get("pods", "m", namespace="default")["metadata"]["annotations"][
        A.NVIDIA_ALLOCATED
    ].split(",")[0]
    idx = "0" if uuid == UUID_A else "1"
    assert result["NodeNames"] == ["node1"]
    async with session.get(f"{extender.url}/metrics") as r:
        got = samples(await r.text())
    card = {"node": "node1", "device_uuid": uuid, "device_index": idx, "zone": "vGPU"}
    typed = {**card, "device_type": V100}
    assert got["hami_gpu_memory_limit_bytes", key(typed)] == 32768 * 1048576
    assert got["hami_gpu_core_limit_ratio", key(typed)] == 100
    assert got["hami_gpu_memory_allocated_bytes", key({**typed, "device_cores": "100"})] == 8000 * 1048576
    assert got["hami_gpu_shared_count", key(typed)] == 1
    assert got["hami_gpu_core_allocated_ratio", key(typed)] == 10
    overview = {**typed, "device_cores": "100", "device_memory_limit": "32768"}
    assert got["hami_node_gpu_overview", key(overview)] == 8000 * 1048576
    assert got["hami_node_gpu_memory_allocated_ratio", key(card)] == 8000 / 32768
    per_pod = {"namespace": "default", "node": "node1", "pod": "m", "container_index": "0",
               "device_uuid": uuid, "zone": "vGPU"}  # fmt: skip
    assert got["hami_vgpu_memory_allocated_bytes", key(per_pod)] == 8000 * 1048576
    assert got["hami_vgpu_core_allocated_ratio", key(per_pod)] == 10
    quota = {"namespace": "default", "quota_name": "nvidia.com/gpumem", "zone": "vGPU"}
    assert got["hami_resource_quota_used", key({**quota, "limit": "64000"})] == 8000
    assert got["hami_resource_quota_limit", key(quota)] == 64000
    assert got["hami_scheduler_filter_total", key({"result": "placed"})] == 1
    assert got["hami_scheduler_filter_duration_seconds_count", key({})] == 1
    assert got["hami_scheduler_is_leader", key({})] == 1
    assert got["hami_scheduler_cache_synced", key({})] == 1


def key(labels: dict[str, str]) -> frozenset[tuple[str, str]]:
    return frozenset(labels.items())


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, key(s.labels)): s.value for fam in text_string_to_metric_families(text) for s in fam.samples
    }


async def test_https_with_tls_files(fake_apiserver, tmp_path, session) -> None:
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "tls.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    server = await start_extender(
        fake_apiserver,
        "--tls-cert-file",
        str(tmp_path / "tls.crt"),
        "--tls-private-key-file",
        str(tmp_path / "tls.key"),
    )
    try:
        assert server.url.startswith("https://")
        ctx = ssl.create_default_context(cafile=str(tmp_path / "tls.crt"))
        ctx.check_hostname = False
        await wait_ready(server)
        async with session.get(f"{server.url}/readyz", ssl=ctx) as r:
            assert r.status == 200
        async with session.post(f"{server.url}/filter", data=b"{}", ssl=ctx) as r:
            assert r.status == 200
            assert (await r.json())["Error"].startswith("ExtenderArgs.Pod: missing")
    finally:
        await server.stop()


def test_pod_updates_that_change_nothing_counted_skip_the_state() -> None:
    from hami.cluster import ClusterState
    from scheduler_extender.sync import ClusterSync

    state = ClusterState()
    sync = ClusterSync(None, state)  # type: ignore[arg-type]  # reflectors never started
    applied: list[str] = []
    state.upsert_pod = lambda pod: applied.append(pod["metadata"]["resourceVersion"])  # type: ignore[method-assign]
    base = gpu_pod(
        "p",
        annotations={A.ASSIGNED_NODE: "node1", "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,8000,10:;"},
    )
    base["metadata"].update(uid="u1", resourceVersion="1")
    bound = {**base, "metadata": {**base["metadata"], "resourceVersion": "2",
             "annotations": {**base["metadata"]["annotations"], A.BIND_PHASE: "allocating", A.BIND_TIME: "1"}},
             "spec": {**base["spec"], "nodeName": "node1"}}  # fmt: skip
    sync._pod_updated(base, bound)  # the Binding: same allocation
    assert applied == []
    moved = {**bound, "metadata": {**bound["metadata"], "resourceVersion": "3",
             "annotations": {**bound["metadata"]["annotations"], "hami.io/vgpu-devices-allocated": "GPU-1,NVIDIA,8000,10:;"}}}  # fmt: skip
    sync._pod_updated(bound, moved)
    done = {
        **moved,
        "metadata": {**moved["metadata"], "resourceVersion": "4"},
        "status": {"phase": "Succeeded"},
    }
    sync._pod_updated(moved, done)
    assert applied == ["3", "4"]
    # While a write of ours is pending, every event goes through the Inflight check.
    sync.inflight.expect("u1", {A.ASSIGNED_NODE: "node2"})
    sync._pod_updated(done, {**done, "metadata": {**done["metadata"], "resourceVersion": "5"}})
    assert applied == ["3", "4", "5"]
