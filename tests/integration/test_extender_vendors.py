"""The real extender against the in-memory API server with one node of every vendor HAMi schedules:
each vendor's pod through /filter and /bind with the exact annotations its device plugin reads, the
node lock only for vendors whose plugins use it, a pod asking two vendors, and quota per vendor."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest

from hami import annotations as A
from hami.vendors import build_vendors
from kubefakes.apiserver import FakeApiServer
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready
from tests.vendor_fleet import CONFIG, EXPECTED, ONE_SHARE, container, fleet, node, pod

FLEET = fleet()
MIX = node(
    "mix", annotations=FLEET["NVIDIA"]["metadata"]["annotations"], capacity=FLEET["MLU"]["status"]["capacity"]
)
NAMES = [n["metadata"]["name"] for n in FLEET.values()]  # one node per vendor; "mix" only for the mixed pod
VENDORS = build_vendors(CONFIG)


@pytest.fixture
async def extender(fake_apiserver: FakeApiServer, tmp_path):
    api = fake_apiserver
    for n in (*FLEET.values(), MIX):
        api.store.create("nodes", copy.deepcopy(n))
    cfg = tmp_path / "device-config.yaml"
    cfg.write_text("scheduler:\n  enableAscend: true\n  enableIluvatar: true\n")
    server = await start_extender(api, "--config", str(cfg))
    await wait_ready(server)
    try:
        yield server
    finally:
        await server.stop()


async def test_every_vendor_filters_and_binds_with_its_exact_annotations(
    fake_apiserver, extender, session
) -> None:
    api = fake_apiserver
    sched = Scheduler(session, extender.url)
    for cw, (pins, expected) in EXPECTED.items():
        name = f"p-{cw.lower()}"
        p = create_pod(api, pod(name, container("c", ONE_SHARE[cw][0]), annotations=pins, uid=None))
        result = await sched.filter(p, NAMES)
        target = FLEET[cw]["metadata"]["name"]
        assert result["Error"] == "" and result["NodeNames"] == [target], (cw, result)
        stored = api.store.get("pods", name, namespace="default")["metadata"]["annotations"]
        assert {k: stored.get(k) for k in expected} == expected, cw
        assert stored[A.ASSIGNED_NODE] == target
        assert await sched.bind(p, target) == {"Error": ""}
        bound = api.store.get("pods", name, namespace="default")
        assert bound["spec"]["nodeName"] == target
        lock = (api.store.get("nodes", target)["metadata"].get("annotations") or {}).get(A.NODE_LOCK)
        if VENDORS[cw].uses_node_lock:
            assert lock is not None and lock.endswith(f",default,{name}"), cw
        else:
            assert lock is None, (cw, lock)  # its plugin never releases HAMi's lock


async def test_a_pod_the_watch_has_not_delivered_yet_takes_the_lock_only_for_lock_vendors(
    fake_apiserver, extender, session
) -> None:
    # Under a slow pod watch, bind comes before the pod is in the watch cache: the filter's own
    # decision says which plugins serve it. A lock taken for a plugin that never releases it held
    # the node's next bind until the lock expired.
    api = fake_apiserver
    sched = Scheduler(session, extender.url)
    extender.extender.pod_lookup = lambda _ns, _name: None  # the watch has delivered none of these pods
    for cw in ("AWSNeuron", "NVIDIA"):
        name = f"unwatched-{cw.lower()}"
        p = create_pod(api, pod(name, container("c", ONE_SHARE[cw][0]), uid=None))
        target = FLEET[cw]["metadata"]["name"]
        assert (await sched.filter(p, NAMES))["NodeNames"] == [target]
        assert await sched.bind(p, target) == {"Error": ""}
        lock = (api.store.get("nodes", target)["metadata"].get("annotations") or {}).get(A.NODE_LOCK)
        assert VENDORS[cw].uses_node_lock is (cw == "NVIDIA")
        if cw == "NVIDIA":
            assert lock is not None and lock.endswith(f",default,{name}")
        else:
            assert lock is None, lock


async def test_timestamps_written_for_the_vendor_plugins(fake_apiserver, extender, session) -> None:
    api = fake_apiserver
    sched = Scheduler(session, extender.url)
    p = create_pod(api, pod("aws", container("c", ONE_SHARE["AWSNeuron"][0])))
    assert (await sched.filter(p, NAMES))["NodeNames"] == ["trn-a"]
    a = api.store.get("pods", "aws", namespace="default")["metadata"]["annotations"]
    assert re.fullmatch(r"\d{19}", a["NEURON_ALLOC_TIME"])
    p = create_pod(api, pod("npu", container("c", ONE_SHARE["Ascend910B3"][0])))
    assert (await sched.filter(p, NAMES))["NodeNames"] == ["npu-a"]
    a = api.store.get("pods", "npu", namespace="default")["metadata"]["annotations"]
    assert re.fullmatch(r"\d{10}", a["predicate-time"])


async def test_a_pod_asking_two_vendors(fake_apiserver, extender, session) -> None:
    api = fake_apiserver
    sched = Scheduler(session, extender.url)
    p = create_pod(
        api, pod("mixed", container("a", ONE_SHARE["NVIDIA"][0]), container("b", ONE_SHARE["MLU"][0]))
    )
    result = await sched.filter(p, [*NAMES, "mix"])
    assert result["NodeNames"] == ["mix"]
    assert result["FailedNodes"]["nv-a"] == "NodeInsufficientDevice: no MLU device"
    a = api.store.get("pods", "mixed", namespace="default")["metadata"]["annotations"]
    assert a["hami.io/vgpu-devices-to-allocate"] == "GPU-nv-0,NVIDIA,1000,10:;;"
    assert a["hami.io/cambricon-mlu-devices-to-allocate"] == ";mix-cambricon-mlu-0,MLU,5120,30:;"
    assert a["CAMBRICON_DSMLU_PROFILE"] == "0_30_20"
    assert await sched.bind(p, "mix") == {"Error": ""}
    lock = api.store.get("nodes", "mix")["metadata"]["annotations"][A.NODE_LOCK]
    assert lock.endswith(",default,mixed")  # NVIDIA's plugin needs the lock


@pytest.mark.parametrize(("cw", "resource", "limit"), [
    ("MLU", "cambricon.com/mlu.smlu.vmemory", "20"),
    ("AMD", "amd.com/gpumem", "49152"),
    ("Mthreads", "mthreads.com/sgpu-memory", "8"),
], ids=["cambricon", "amd", "mthreads"])  # fmt: skip
async def test_quota_per_vendor(fake_apiserver, extender, session, cw, resource, limit) -> None:
    api = fake_apiserver
    api.store.create(
        "resourcequotas",
        {"metadata": {"name": "q", "namespace": "team"}, "spec": {"hard": {f"limits.{resource}": limit}}},
    )
    await eventually(
        lambda: any(r == resource for _, r, _, _ in extender.state.quota_stats()), what="quota seen"
    )
    sched = Scheduler(session, extender.url)
    target = FLEET[cw]["metadata"]["name"]
    first = create_pod(api, pod("a", container("c", ONE_SHARE[cw][0]), ns="team"))
    assert (await sched.filter(first, NAMES))["NodeNames"] == [target]
    second = create_pod(api, pod("b", container("c", ONE_SHARE[cw][0]), ns="team"))
    result = await sched.filter(second, NAMES)
    assert result["NodeNames"] == []
    assert "ResourceQuotaNotFit" in result["FailedNodes"][target]


async def nv2_waiting_for_mix(api: FakeApiServer, sched: Scheduler, extender) -> asyncio.Task:  # type: ignore[no-untyped-def]
    """On "mix" an NVIDIA pod (nv1) holds the node lock, its Allocate not run, and nv2's bind waits
    for it; returns that bind's task (end it with `nv2_deleted`)."""
    holder, waiter = (create_pod(api, pod(n, container("c", ONE_SHARE["NVIDIA"][0]))) for n in ("nv1", "nv2"))
    for p in (holder, waiter):
        assert (await sched.filter(p, ["mix"]))["NodeNames"] == ["mix"]
    assert await sched.bind(holder, "mix") == {"Error": ""}
    waiting = asyncio.create_task(sched.bind(waiter, "mix"))
    await eventually(lambda: extender.lock_queues.waiting("mix") == 1, what="nv2 waiting for the lock")
    return waiting


async def nv2_deleted(api: FakeApiServer, waiting: asyncio.Task) -> None:
    """nv2 leaves the queue at once when deleted (cancelling the request would leave the extender's
    bind waiting out its 25 s, and the fixture's stop with it)."""
    api.store.delete("pods", "nv2", namespace="default")
    assert await asyncio.wait_for(waiting, 10) == {
        "Error": "binding pod default/nv2 to mix failed: the pod was deleted while waiting for the node lock"
    }


async def test_a_pod_that_takes_no_node_lock_binds_at_once_while_others_wait_for_it(
    fake_apiserver, extender, session
) -> None:
    # On "mix" an NVIDIA pod holds the node lock (its Allocate has not run) and another waits for
    # it; a Cambricon pod's plugin takes no lock, so its bind neither waits nor queues behind them.
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    waiting = await nv2_waiting_for_mix(api, sched, extender)
    mlu = create_pod(api, pod("mlu", container("c", ONE_SHARE["MLU"][0])))
    assert (await sched.filter(mlu, ["mix"]))["NodeNames"] == ["mix"]
    # Within the 25 s --bind-lock-wait by far: a bind that queued would still be waiting here.
    assert await asyncio.wait_for(sched.bind(mlu, "mix"), 10) == {"Error": ""}
    assert api.store.get("pods", "mlu", namespace="default")["spec"]["nodeName"] == "mix"
    assert extender.lock_queues.waiting("mix") == 1 and not waiting.done()
    await nv2_deleted(api, waiting)


async def test_a_pod_that_takes_no_node_lock_binds_at_once_before_the_watch_delivers_it(
    fake_apiserver, extender, session
) -> None:
    # A slow pod watch: the Cambricon pod is filtered and bound before its creation event arrives, so
    # the watch cache does not have it; its bind must still take no lock, not queue behind nv2.
    api, sched = fake_apiserver, Scheduler(session, extender.url)
    waiting = await nv2_waiting_for_mix(api, sched, extender)
    sync = extender.runtime.sync
    sync._lock.acquire()  # the pod watch stalls in the callback of the next pod event
    try:
        create_pod(api, pod("first", container("c", ONE_SHARE["MLU"][0])))
        await eventually(lambda: sync.cached_pod("default", "first") is not None, what="the watch stalled")
        mlu = create_pod(api, pod("mlu", container("c", ONE_SHARE["MLU"][0])))
        assert (await sched.filter(mlu, ["mix"]))["NodeNames"] == ["mix"]
        assert sync.cached_pod("default", "mlu") is None
        # Within the 25 s --bind-lock-wait by far: a bind that queued would still be waiting here.
        assert await asyncio.wait_for(sched.bind(mlu, "mix"), 10) == {"Error": ""}
        assert api.store.get("pods", "mlu", namespace="default")["spec"]["nodeName"] == "mix"
        assert extender.lock_queues.waiting("mix") == 1 and not waiting.done()
    finally:
        sync._lock.release()
    await nv2_deleted(api, waiting)
