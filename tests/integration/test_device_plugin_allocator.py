"""Allocate end to end: the real plugin (fake backend) with the fake kubelet and the fake API server.

Pods are prepared exactly as the scheduler extender leaves them after Filter and Bind (hami-legacy-spec
§2.11): annotations ``hami.io/vgpu-node``, ``vgpu-time``, ``vgpu-devices-to-allocate`` / ``-allocated``,
label ``hami.io/vgpu-node``, the node lock taken with `hami.nodelock.lock_node`, bind-phase
``allocating`` + bind-time, and the Binding (spec.nodeName). Then the fake kubelet admits the pod
container by container, as kubelet does.
"""

from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from device_plugin.app import DevicePluginApp, PluginOptions
from device_plugin.backends.fake import FakeBackend
from hami import annotations as ann
from hami.config import load_config
from hami.errors import NodeLockContention
from hami.kube import KubeClient
from hami.model import ContainerDevice
from hami.nodelock import lock_node
from hami.registration import decode_node_devices_json
from kubefakes.apiserver import FakeApiServer
from kubefakes.kubelet import AdmissionError, FakeKubelet, env_of, mounts_of

RESOURCE = "nvidia.com/gpu"
NODE = "node1"
A, B = "GPU-aaaa", "GPU-bbbb"
CARDS = [
    {"uuid": A, "index": 0, "model": "Tesla V100-PCIE-32GB", "memory_mib": 32768, "numa": 0},
    {"uuid": B, "index": 1, "model": "Tesla V100-PCIE-32GB", "memory_mib": 32768, "numa": 1},
]


def write_cards(path: Path, cards: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump({"cards": cards}))
    os.replace(tmp, path)


@pytest.fixture(scope="module")
def apiserver():
    with FakeApiServer() as server:
        yield server


@pytest.fixture
def kube(apiserver):
    store = apiserver.store
    for pod in store.list("pods"):
        store.delete("pods", pod["metadata"]["name"], namespace=pod["metadata"]["namespace"])
    if store.get("nodes", NODE) is not None:
        store.delete("nodes", NODE)
    store.create(
        "nodes",
        {"metadata": {"name": NODE, "labels": {"gpu": "on"}}, "status": {"nodeInfo": {"bootID": "boot-1"}}},
    )
    return KubeClient.from_kubeconfig(apiserver.kubeconfig_path)


@pytest.fixture
def hook(tmp_path):
    vgpu = tmp_path / "hook" / "vgpu"
    vgpu.mkdir(parents=True)
    (vgpu / "libvgpu.so").write_text("fake library")
    (vgpu / "ld.so.preload").write_text(f"{vgpu}/libvgpu.so\n")
    return tmp_path / "hook"


@pytest.fixture
async def kubelet(tmp_path):
    k = FakeKubelet(tmp_path / "device-plugins")
    await k.start()
    yield k
    await k.stop()


@pytest.fixture
async def plugin(tmp_path, kubelet, kube, hook):
    cards = tmp_path / "cards.yaml"
    write_cards(cards, CARDS)
    app = DevicePluginApp(
        PluginOptions(
            node_name=NODE,
            socket_dir=str(kubelet.socket_dir),
            hook_path=str(hook),
            register_interval_s=0.5,
        ),
        FakeBackend(cards, poll_s=0.05),
        kube,
    )
    await app.start()
    app.cards_file = cards
    await kubelet.wait_registered(RESOURCE)
    yield app
    await app.stop()


def dev(uuid: str, mem: int, cores: int) -> ContainerDevice:
    return ContainerDevice(uuid=uuid, type="NVIDIA", usedmem=mem, usedcores=cores)


def container(name: str, devices: list[ContainerDevice], env: dict[str, str] | None = None) -> dict:
    ctr: dict = {"name": name, "image": "cuda:12"}
    if devices:
        ctr["resources"] = {
            "limits": {
                RESOURCE: str(len(devices)),
                "nvidia.com/gpumem": str(devices[0].usedmem),
                "nvidia.com/gpucores": str(devices[0].usedcores),
            }
        }
    if env:
        ctr["env"] = [{"name": k, "value": v} for k, v in env.items()]
    return ctr


def schedule(
    apiserver: FakeApiServer,
    kube: KubeClient,
    name: str,
    containers: list[tuple[str, list[ContainerDevice]]],
    *,
    init: list[tuple[str, list[ContainerDevice]]] = (),
    env: dict[str, dict[str, str]] | None = None,
    scheduler: str = "hami-scheduler",
    take_lock: bool = True,
    to_allocate: str | None = None,
) -> dict:
    """Create a pod and do what the extender's Filter and Bind do; returns the pod."""
    env = env or {}
    entries = [devs for _, devs in init] + [devs for _, devs in containers]
    value = ann.encode_pod_devices(entries) if to_allocate is None else to_allocate
    pod = {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {ann.ASSIGNED_NODE: NODE},
            "annotations": {
                ann.ASSIGNED_NODE: NODE,
                ann.ASSIGNED_TIME: str(int(time.time())),
                ann.NVIDIA_TO_ALLOCATE: value,
                ann.NVIDIA_ALLOCATED: value,
            },
        },
        "spec": {
            "schedulerName": scheduler,
            "initContainers": [container(n, d, env.get(n)) for n, d in init],
            "containers": [container(n, d, env.get(n)) for n, d in containers],
        },
    }
    if not init:
        del pod["spec"]["initContainers"]
    created = apiserver.store.create("pods", pod, keep_status=False)
    if take_lock:
        lock_node(kube, NODE, namespace="default", pod_name=name)
    kube.patch_pod_metadata(
        "default", name, annotations={ann.BIND_PHASE: "allocating", ann.BIND_TIME: str(int(time.time()))}
    )
    kube.bind_pod("default", name, uid=created["metadata"]["uid"], node=NODE)
    return apiserver.store.get("pods", name, namespace="default")


def pod_annos(apiserver: FakeApiServer, name: str) -> dict[str, str]:
    return ann.pod_annotations(apiserver.store.get("pods", name, namespace="default"))


def node_annos(apiserver: FakeApiServer) -> dict[str, str]:
    return ann.pod_annotations(apiserver.store.get("nodes", NODE))


def cards_of(ids: list[str]) -> list[str]:
    return [i.rsplit("-", 1)[0] for i in ids]


# ----- the happy paths


async def test_extender_pod_gets_exactly_the_recorded_card_and_limits(
    apiserver, kube, kubelet, plugin, hook, tmp_path
):
    pod = schedule(apiserver, kube, "gpu-pod", [("main", [dev(B, 3000, 30)])])
    ids, resp = await kubelet.admit_container(RESOURCE, 1)
    assert cards_of(ids) == [B]  # kubelet followed the preferred allocation onto the scheduler's card
    env = env_of(resp)
    cache = env.pop("CUDA_DEVICE_MEMORY_SHARED_CACHE")
    assert re.fullmatch(rf"{hook}/vgpu/[0-9a-f-]{{36}}\.cache", cache)
    assert env == {
        "NVIDIA_VISIBLE_DEVICES": B,
        "CUDA_DEVICE_MEMORY_LIMIT_0": "3000m",
        "CUDA_DEVICE_SM_LIMIT": "30",
        "LIBCUDA_LOG_LEVEL": "1",
        "LIBVGPU_CARD_DIR": f"{hook}/vgpu/cards",
    }
    uid = pod["metadata"]["uid"]
    cache_dir = hook / "vgpu" / "containers" / f"{uid}_main"
    assert mounts_of(resp) == [
        (f"{hook}/vgpu/libvgpu.so", f"{hook}/vgpu/libvgpu.so", True),
        (f"{hook}/vgpu", str(cache_dir), False),
        ("/etc/ld.so.preload", f"{hook}/vgpu/ld.so.preload", True),
        (f"{hook}/vgpu/vgpu.config", str(cache_dir / "vgpu.config"), True),  # libvgpu's config file
        (f"{hook}/vgpu/cards/{B}.card", f"{hook}/vgpu/cards/{B}.card", False),  # the card's shared region
    ]  # no node-wide writable lock directory (HAMi's /tmp/vgpulock): libvgpu reads none
    assert stat.S_IMODE(cache_dir.stat().st_mode) == 0o777
    annos = pod_annos(apiserver, "gpu-pod")
    assert annos[ann.NVIDIA_TO_ALLOCATE] == ";"
    assert annos[ann.NVIDIA_ALLOCATED] == f"{B},NVIDIA,3000,30:;"
    assert annos[ann.BIND_PHASE] == "success"
    assert ann.NODE_LOCK not in node_annos(apiserver)
    assert "hami_device_plugin_allocations_total 1.0" in plugin.metrics.render().decode()


async def test_init_and_multi_card_containers_in_order_with_disable_control_by_value(
    apiserver, kube, kubelet, plugin, hook
):
    schedule(
        apiserver,
        kube,
        "multi",
        init=[("setup", [])],
        # c2 opts out by value: the scheduler gives it whole, exclusive cards (100 % each).
        containers=[("c1", [dev(A, 1000, 10)]), ("c2", [dev(A, 2000, 100), dev(B, 2000, 100)])],
        env={"c1": {"CUDA_DISABLE_CONTROL": "false"}, "c2": {"CUDA_DISABLE_CONTROL": "true"}},
    )
    ids1, r1 = await kubelet.admit_container(RESOURCE, 1)
    assert cards_of(ids1) == [A]
    assert env_of(r1)["NVIDIA_VISIBLE_DEVICES"] == A
    assert env_of(r1)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1000m"
    assert ("/etc/ld.so.preload", f"{hook}/vgpu/ld.so.preload", True) in mounts_of(
        r1
    )  # "false" keeps control
    # After the first container: its entry consumed, lock kept for the next one.
    annos = pod_annos(apiserver, "multi")
    assert annos[ann.NVIDIA_TO_ALLOCATE] == f";;{A},NVIDIA,2000,100:{B},NVIDIA,2000,100:;"
    assert annos[ann.BIND_PHASE] == "allocating"
    assert node_annos(apiserver)[ann.NODE_LOCK].endswith(",default,multi")

    ids2, r2 = await kubelet.admit_container(RESOURCE, 2)
    assert sorted(cards_of(ids2)) == [A, B]
    env2 = env_of(r2)
    assert (
        env2["NVIDIA_VISIBLE_DEVICES"],
        env2["CUDA_DEVICE_MEMORY_LIMIT_0"],
        env2["CUDA_DEVICE_MEMORY_LIMIT_1"],
    ) == (f"{A},{B}", "2000m", "2000m")
    assert env2["CUDA_DEVICE_SM_LIMIT"] == "100"
    assert "/etc/ld.so.preload" not in [m[0] for m in mounts_of(r2)]
    uid = apiserver.store.get("pods", "multi", namespace="default")["metadata"]["uid"]
    assert (f"{hook}/vgpu", f"{hook}/vgpu/containers/{uid}_c2", False) in mounts_of(r2)
    annos = pod_annos(apiserver, "multi")
    assert (annos[ann.NVIDIA_TO_ALLOCATE], annos[ann.BIND_PHASE]) == (";;;", "success")
    assert ann.NODE_LOCK not in node_annos(apiserver)


async def test_two_pods_bound_in_a_row_are_served_in_order(apiserver, kube, kubelet, plugin):
    schedule(apiserver, kube, "first", [("main", [dev(A, 4000, 20)])])
    # The lock serialises pods per node: the extender cannot bind the second one yet.
    apiserver.store.create(
        "pods", {"metadata": {"name": "second", "namespace": "default"}, "spec": {"containers": []}}
    )
    with pytest.raises(NodeLockContention):
        lock_node(kube, NODE, namespace="default", pod_name="second")
    apiserver.store.delete("pods", "second", namespace="default")
    _, r1 = await kubelet.admit_container(RESOURCE, 1)
    schedule(apiserver, kube, "second", [("main", [dev(B, 6000, 50)])])
    _, r2 = await kubelet.admit_container(RESOURCE, 1)
    e1, e2 = env_of(r1), env_of(r2)
    assert (e1["NVIDIA_VISIBLE_DEVICES"], e1["CUDA_DEVICE_MEMORY_LIMIT_0"], e1["CUDA_DEVICE_SM_LIMIT"]) == (
        A,
        "4000m",
        "20",
    )
    assert (e2["NVIDIA_VISIBLE_DEVICES"], e2["CUDA_DEVICE_MEMORY_LIMIT_0"], e2["CUDA_DEVICE_SM_LIMIT"]) == (
        B,
        "6000m",
        "50",
    )
    assert e1["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != e2["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    assert pod_annos(apiserver, "first")[ann.BIND_PHASE] == "success"
    assert pod_annos(apiserver, "second")[ann.BIND_PHASE] == "success"


# ----- refusals


async def test_lock_owner_that_vanished_is_refused_and_its_lock_released(apiserver, kube, kubelet, plugin):
    schedule(apiserver, kube, "gone", [("main", [dev(A, 1000, 0)])])
    apiserver.store.delete("pods", "gone", namespace="default")
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit_container(RESOURCE, 1)
    assert str(err.value) == (
        "Allocate failed due to pod default/gone holding the node lock on node1 no longer exists; "
        "released its lock, which is unexpected"
    )
    assert ann.NODE_LOCK not in node_annos(apiserver)
    assert 'allocation_errors_total{reason="lock_owner_gone"} 1.0' in plugin.metrics.render().decode()


async def test_no_lock_means_no_allocation(apiserver, kube, kubelet, plugin):
    schedule(apiserver, kube, "unlocked", [("main", [dev(A, 1000, 0)])], take_lock=False)
    with pytest.raises(AdmissionError, match="no pod holds the node lock hami.io/mutex.lock on node node1"):
        await kubelet.admit_container(RESOURCE, 1)


def warnings_of(apiserver: FakeApiServer, pod: str) -> list[tuple[str, str, str]]:
    """(reason, source component, message) of the Warning events on `pod`."""
    return [
        (e["reason"], e["source"]["component"], e["message"])
        for e in apiserver.store.list("events", namespace="default")
        if e["involvedObject"]["name"] == pod and e["type"] == "Warning"
    ]


async def test_kubelet_ignoring_the_preference_gets_the_recorded_cards_with_a_warning(
    apiserver, kube, kubelet, plugin
):
    # User bug log D03: kubelet (its Topology Manager, or no preference) picks ids on other cards than
    # the scheduler recorded. The recorded cards are what the scheduler accounted, so they are served.
    schedule(apiserver, kube, "two-cards", [("main", [dev(A, 1000, 0), dev(B, 1000, 0)])])
    # Without the preference kubelet takes the first free ids: two replicas of card A.
    ids, resp = await kubelet.admit_container(RESOURCE, 2, use_preferred=False)
    assert ids == [f"{A}-0", f"{A}-1"]
    env = env_of(resp)
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_MEMORY_LIMIT_1"]) == (
        f"{A},{B}", "1000m", "1000m",
    )  # fmt: skip
    annos = pod_annos(apiserver, "two-cards")
    assert (annos[ann.BIND_PHASE], annos[ann.NVIDIA_TO_ALLOCATE]) == ("success", ";")
    assert ann.NODE_LOCK not in node_annos(apiserver)
    assert warnings_of(apiserver, "two-cards") == [
        (
            "CardMismatch",
            "hami-device-plugin",
            f"container main: kubelet's devices ['{A}-0', '{A}-1'] are on card(s) ['{A}'] but the scheduler "
            f"recorded ['{A}', '{B}']; the container gets the recorded card(s), which the scheduler accounted. "
            "kubelet did not follow the preferred allocation (its Topology Manager, for example), so what kubelet "
            "reports for this container differs from the card(s) it uses",
        )
    ]
    text = plugin.metrics.render().decode()
    assert "hami_device_plugin_allocation_card_mismatches_total 1.0" in text
    assert "hami_device_plugin_allocations_total 1.0" in text


async def test_a_card_mismatch_whose_event_is_refused_still_serves_the_recorded_card(
    apiserver, kube, kubelet, plugin
):
    apiserver.faults.add(verb="create", resource="events", status=500, times=1000)
    try:
        schedule(apiserver, kube, "no-events", [("main", [dev(B, 1000, 10)])])
        ids, resp = await kubelet.admit_container(RESOURCE, 1, use_preferred=False)
    finally:
        apiserver.faults.clear()
    assert cards_of(ids) == [A]
    assert env_of(resp)["NVIDIA_VISIBLE_DEVICES"] == B
    assert pod_annos(apiserver, "no-events")[ann.BIND_PHASE] == "success"
    assert "hami_device_plugin_allocation_card_mismatches_total 1.0" in plugin.metrics.render().decode()


async def test_preferred_allocation_corrects_kubelet_onto_the_recorded_cards(
    apiserver, kube, kubelet, plugin
):
    schedule(apiserver, kube, "two-cards", [("main", [dev(A, 1000, 0), dev(B, 1000, 0)])])
    ids, resp = await kubelet.admit_container(RESOURCE, 2)
    assert sorted(cards_of(ids)) == [A, B]
    pref = kubelet.preferred_requests[-1].container_requests[0]
    assert pref.allocation_size == 2 and len(pref.available_deviceIDs) == 20
    assert env_of(resp)["NVIDIA_VISIBLE_DEVICES"] == f"{A},{B}"


async def test_forged_annotations_on_a_pod_of_another_scheduler_are_refused(apiserver, kube, kubelet, plugin):
    # User bug log W05: everything forged, even the node lock; only schedulerName tells.
    schedule(apiserver, kube, "forged", [("main", [dev(A, 20000, 100)])], scheduler="default-scheduler")
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit_container(RESOURCE, 1)
    assert str(err.value) == (
        "Allocate failed due to pod default/forged was scheduled by 'default-scheduler', not 'hami-scheduler'; "
        "its HAMi annotations are not ours, which is unexpected"
    )
    assert pod_annos(apiserver, "forged")[ann.BIND_PHASE] == "failed"
    assert ann.NODE_LOCK not in node_annos(apiserver)
    # Without the lock the forgery gets nowhere either.
    schedule(apiserver, kube, "forged2", [("main", [dev(A, 20000, 100)])], scheduler="default-scheduler",
             take_lock=False)  # fmt: skip
    with pytest.raises(AdmissionError, match="no pod holds the node lock"):
        await kubelet.admit_container(RESOURCE, 1)


async def test_device_count_must_equal_the_recorded_cards(apiserver, kube, kubelet, plugin):
    # The container asks kubelet for 2 devices, but the scheduler recorded one card for it.
    pod = schedule(apiserver, kube, "short", [("main", [dev(A, 1000, 0)])])
    assert pod["spec"]["containers"][0]["resources"]["limits"][RESOURCE] == "1"
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit_container(RESOURCE, 2)
    assert "pod default/short container main: kubelet asked for 2 device(s) [" in str(err.value)
    assert f"but the scheduler recorded 1 card(s) ['{A}']" in str(err.value)
    assert pod_annos(apiserver, "short")[ann.BIND_PHASE] == "failed"


async def test_entries_not_matching_the_containers_are_refused(apiserver, kube, kubelet, plugin):
    # Two containers but only one entry (HAMi's padding regression, spec §8.2): whose is it?
    schedule(
        apiserver, kube, "padding", [("sidecar", []), ("main", [dev(A, 1000, 0)])],
        to_allocate=f"{A},NVIDIA,1000,0:;",
    )  # fmt: skip
    with pytest.raises(AdmissionError, match=r"has 1 container entries but the pod has 2 containers"):
        await kubelet.admit_container(RESOURCE, 1)


async def test_wrong_bind_phase_is_refused(apiserver, kube, kubelet, plugin):
    schedule(apiserver, kube, "done", [("main", [dev(A, 1000, 0)])])
    kube.patch_pod_metadata("default", "done", annotations={ann.BIND_PHASE: "success"})
    with pytest.raises(AdmissionError, match=r"has hami.io/bind-phase='success', want 'allocating'"):
        await kubelet.admit_container(RESOURCE, 1)
    # A served pod keeps its phase; only its stale lock goes.
    assert pod_annos(apiserver, "done")[ann.BIND_PHASE] == "success"
    assert ann.NODE_LOCK not in node_annos(apiserver)


async def test_lock_held_by_a_pod_bound_elsewhere_is_released_without_touching_the_pod(
    apiserver, kube, kubelet, plugin
):
    schedule(apiserver, kube, "moved", [("main", [dev(A, 1000, 0)])])
    # Re-create it bound to another node, still named by this node's lock.
    old = apiserver.store.get("pods", "moved", namespace="default")
    apiserver.store.delete("pods", "moved", namespace="default")
    old["spec"]["nodeName"] = "node2"
    old["metadata"]["annotations"][ann.ASSIGNED_NODE] = "node2"
    for key in ("uid", "resourceVersion", "creationTimestamp"):
        old["metadata"].pop(key, None)
    apiserver.store.create("pods", old)
    with pytest.raises(
        AdmissionError, match=r"pod default/moved is bound to 'node2', not to this node node1"
    ):
        await kubelet.admit_container(RESOURCE, 1)
    assert pod_annos(apiserver, "moved")[ann.BIND_PHASE] == "allocating"
    assert ann.NODE_LOCK not in node_annos(apiserver)


async def test_unknown_card_is_refused(apiserver, kube, kubelet, plugin):
    schedule(apiserver, kube, "elsewhere", [("main", [dev("GPU-zzzz", 1000, 0)])])
    with pytest.raises(
        AdmissionError, match=r"recorded card\(s\) \['GPU-zzzz'\] are not cards of node node1"
    ):
        await kubelet.admit_container(RESOURCE, 1)


async def test_missing_libvgpu_is_refused_with_the_path(apiserver, kube, kubelet, plugin, hook):
    (hook / "vgpu" / "libvgpu.so").unlink()
    schedule(apiserver, kube, "nolib", [("main", [dev(A, 1000, 0)])])
    with pytest.raises(AdmissionError, match=rf"{hook}/vgpu/libvgpu.so missing on node node1"):
        await kubelet.admit_container(RESOURCE, 1)


# ----- node registration annotation


async def wait_annotation(apiserver, kubelet, predicate, timeout=5.0):
    await kubelet.wait_for(lambda: predicate(node_annos(apiserver)), timeout)
    return node_annos(apiserver)


async def test_registration_annotation_and_handshake(apiserver, kube, kubelet, plugin):
    annos = await wait_annotation(apiserver, kubelet, lambda a: ann.NVIDIA_REGISTER in a)
    assert annos[ann.NVIDIA_REGISTER] == (
        '[{"id":"GPU-aaaa","count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
        '"mode":"hami-core","health":true},'
        '{"id":"GPU-bbbb","index":1,"count":10,"devmem":32768,"devcore":100,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
        '"numa":1,"mode":"hami-core","health":true}]'
    )
    assert re.fullmatch(r"Reported_\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", annos[ann.NVIDIA_HANDSHAKE])
    # Unchanged inventory: the 30 s re-check (0.5 s here) does not patch again.
    rv = apiserver.store.get("nodes", NODE)["metadata"]["resourceVersion"]
    # Not time.sleep: that would block the event loop the plugin runs on, so no re-check could happen
    # and the assertion below could never fail (QA finding).
    await asyncio.sleep(1.2)
    assert apiserver.store.get("nodes", NODE)["metadata"]["resourceVersion"] == rv
    # The scheduler asks again (Requesting_...): answered with Reported_.
    kube.patch_node_annotations(NODE, {ann.NVIDIA_HANDSHAKE: "Requesting_2026-01-01 00:00:00"})
    await wait_annotation(apiserver, kubelet, lambda a: a[ann.NVIDIA_HANDSHAKE].startswith("Reported_"))


async def test_unhealthy_card_reaches_kubelet_and_the_registration(apiserver, kube, kubelet, plugin):
    await wait_annotation(apiserver, kubelet, lambda a: ann.NVIDIA_REGISTER in a)
    write_cards(plugin.cards_file, [CARDS[0], {**CARDS[1], "healthy": False}])
    ep = kubelet.endpoints[RESOURCE]
    await kubelet.wait_for(lambda: ep.unhealthy() == {f"{B}-{i}" for i in range(10)}, timeout=5)
    annos = await wait_annotation(
        apiserver, kubelet, lambda a: '"health":true}]' not in a[ann.NVIDIA_REGISTER]
    )
    devices = decode_node_devices_json(annos[ann.NVIDIA_REGISTER])
    assert [(d.uuid, d.health) for d in devices] == [(A, True), (B, False)]


async def test_kubelet_restart_keeps_serving_allocations(apiserver, kube, kubelet, plugin):
    await kubelet.restart()
    await kubelet.wait_registered(RESOURCE, count=2, timeout=5)
    schedule(apiserver, kube, "after-restart", [("main", [dev(B, 500, 5)])])
    _, resp = await kubelet.admit_container(RESOURCE, 1)
    assert env_of(resp)["NVIDIA_VISIBLE_DEVICES"] == B


async def test_per_node_overrides_split_and_scaling(apiserver, kube, kubelet, tmp_path, hook):
    cards = tmp_path / "cards.yaml"
    write_cards(cards, CARDS[:1])
    config = load_config(
        {"nvidia": {"deviceSplitCount": 10},
         "nodeconfig": [{"name": NODE, "devicesplitcount": 4, "devicememoryscaling": 2, "devicecorescaling": 1.5}]}
    )  # fmt: skip
    app = DevicePluginApp(
        PluginOptions(node_name=NODE, config=config, socket_dir=str(kubelet.socket_dir), hook_path=str(hook)),
        FakeBackend(cards),
        kube,
    )  # fmt: skip
    await app.start()
    try:
        ep = await kubelet.wait_registered(RESOURCE)
        assert sorted(ep.devices) == [f"{A}-{i}" for i in range(4)]
        annos = await wait_annotation(apiserver, kubelet, lambda a: ann.NVIDIA_REGISTER in a)
        assert annos[ann.NVIDIA_REGISTER] == (
            '[{"id":"GPU-aaaa","count":4,"devmem":65536,"devcore":150,"type":"NVIDIA-Tesla V100-PCIE-32GB",'
            '"mode":"hami-core","health":true}]'
        )
        schedule(apiserver, kube, "oversub", [("main", [dev(A, 40000, 0)])])
        _, resp = await kubelet.admit_container(RESOURCE, 1)
        assert env_of(resp)["CUDA_OVERSUBSCRIBE"] == "true"
        assert env_of(resp)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40000m"
    finally:
        await app.stop()


async def test_console_script_with_api_server_writes_the_registration(apiserver, kube, kubelet, tmp_path):
    cards = tmp_path / "cards.yaml"
    write_cards(cards, CARDS)
    proc = subprocess.Popen(
        [sys.executable, "-m", "device_plugin", "--backend", "fake", "--fake-config", str(cards),
         "--node-name", NODE, "--socket-dir", str(kubelet.socket_dir), "--kubeconfig", apiserver.kubeconfig_path,
         "--metrics-port", "-1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        await kubelet.wait_registered(RESOURCE, timeout=20)
        annos = await wait_annotation(apiserver, kubelet, lambda a: ann.NVIDIA_REGISTER in a, timeout=20)
        assert [d.uuid for d in decode_node_devices_json(annos[ann.NVIDIA_REGISTER])] == [A, B]
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0, out


async def test_init_container_devices_reused_by_kubelet_for_an_app_container_on_another_card(
    apiserver, kube, kubelet, plugin
):
    # kubelet gives the app container the init container's device (GPU-aaaa-x) without asking for a
    # preference; the scheduler recorded card B for it. The container must still get card B.
    pod = schedule(
        apiserver, kube, "reuse", init=[("init", [dev(A, 1000, 0)])], containers=[("app", [dev(B, 2000, 20)])]
    )
    responses = await kubelet.admit_pod(pod, RESOURCE)
    assert env_of(responses["init"])["NVIDIA_VISIBLE_DEVICES"] == A
    app = env_of(responses["app"])
    assert (app["NVIDIA_VISIBLE_DEVICES"], app["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (B, "2000m")
    # kubelet asked for a preference only for the init container
    assert len(kubelet.preferred_requests) == 1
    last = kubelet.allocate_requests[-1].container_requests[0].devices_ids
    assert cards_of(list(last)) == [A]
    assert pod_annos(apiserver, "reuse")[ann.BIND_PHASE] == "success"
    assert plugin.allocator._init_ids == {}
    # kubelet's own reuse of the pod's devices is no mismatch: no warning, no count.
    assert warnings_of(apiserver, "reuse") == []
    assert "hami_device_plugin_allocation_card_mismatches_total 0.0" in plugin.metrics.render().decode()


async def test_ids_never_served_to_an_init_container_are_a_card_mismatch_not_reuse(
    apiserver, kube, kubelet, plugin
):
    schedule(
        apiserver,
        kube,
        "noreuse",
        init=[("init", [dev(A, 1000, 0)])],
        containers=[("app", [dev(B, 2000, 20)])],
    )
    ids, _ = await kubelet.admit_container(RESOURCE, 1)
    assert cards_of(ids) == [A]
    assert warnings_of(apiserver, "noreuse") == []  # the init container got what was recorded
    resp = await kubelet.allocate(RESOURCE, [f"{A}-9"])
    assert env_of(resp)["NVIDIA_VISIBLE_DEVICES"] == B
    assert [w[0] for w in warnings_of(apiserver, "noreuse")] == ["CardMismatch"]
    assert "hami_device_plugin_allocation_card_mismatches_total 1.0" in plugin.metrics.render().decode()


# ----- QA regressions: concurrency and which container an Allocate is for


async def test_concurrent_allocate_calls_for_one_pod_get_distinct_entries(apiserver, kube, kubelet, plugin):
    # Both containers on card A, so whichever call the plugin takes first is a valid first container;
    # serialisation must still hand out each entry exactly once.
    schedule(apiserver, kube, "pair", [("c1", [dev(A, 1000, 10)]), ("c2", [dev(A, 2000, 20)])])
    r1, r2 = await asyncio.gather(
        kubelet.allocate(RESOURCE, [f"{A}-0"]), kubelet.allocate(RESOURCE, [f"{A}-1"])
    )
    got = sorted(
        (env_of(r)["NVIDIA_VISIBLE_DEVICES"], env_of(r)["CUDA_DEVICE_MEMORY_LIMIT_0"]) for r in (r1, r2)
    )
    assert got == [(A, "1000m"), (A, "2000m")]
    assert env_of(r1)["CUDA_DEVICE_MEMORY_SHARED_CACHE"] != env_of(r2)["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    annos = pod_annos(apiserver, "pair")
    assert (annos[ann.NVIDIA_TO_ALLOCATE], annos[ann.BIND_PHASE]) == (";;", "success")
    assert ann.NODE_LOCK not in node_annos(apiserver)


async def test_a_device_container_without_a_recorded_entry_is_refused_not_given_the_next_one(
    apiserver, kube, kubelet, plugin
):
    # Both containers limit nvidia.com/gpu: 1 but the record has an entry only for the second. kubelet's
    # Allocate for the first container used to be served with the second container's card and limits.
    value = f";{B},NVIDIA,2000,20:;"
    schedule(
        apiserver, kube, "gap", [("c1", [dev(A, 1000, 10)]), ("c2", [dev(B, 2000, 20)])], to_allocate=value
    )
    with pytest.raises(AdmissionError) as err:
        await kubelet.allocate(RESOURCE, [f"{B}-0"])
    assert str(err.value) == (
        "Allocate failed due to pod default/gap container c1: limits nvidia.com/gpu=1 but the scheduler "
        "recorded no card for it in hami.io/vgpu-devices-to-allocate; refusing to guess whose cards it gets, "
        "which is unexpected"
    )
    assert pod_annos(apiserver, "gap")[ann.BIND_PHASE] == "failed"
    assert ann.NODE_LOCK not in node_annos(apiserver)
    assert 'allocation_errors_total{reason="bad_annotation"} 1.0' in plugin.metrics.render().decode()


async def test_cards_recorded_for_a_container_without_the_limit_are_refused(apiserver, kube, kubelet, plugin):
    # kubelet never calls Allocate for a container without the limit, so the pod could never reach
    # bind-phase success and its lock would block the node until it expires.
    pod = schedule(apiserver, kube, "nolimit", [("c1", [dev(A, 1000, 10)]), ("c2", [])],
                   to_allocate=f"{A},NVIDIA,1000,10:;{B},NVIDIA,500,5:;")  # fmt: skip
    assert "resources" not in pod["spec"]["containers"][1]
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit_container(RESOURCE, 1)
    assert str(err.value) == (
        "Allocate failed due to pod default/nolimit container c2: the scheduler recorded card(s) "
        "['GPU-bbbb'] but the container does not limit nvidia.com/gpu, so kubelet will never allocate them, "
        "which is unexpected"
    )
    assert ann.NODE_LOCK not in node_annos(apiserver)


async def test_served_containers_still_count_as_recorded_for_the_next_allocate(
    apiserver, kube, kubelet, plugin
):
    # The check above must not mistake a served (emptied) entry for a missing one.
    schedule(apiserver, kube, "three", [("c1", [dev(A, 100, 1)]), ("web", []), ("c3", [dev(B, 300, 3)])])
    _, r1 = await kubelet.admit_container(RESOURCE, 1)
    assert pod_annos(apiserver, "three")[ann.NVIDIA_TO_ALLOCATE] == f";;{B},NVIDIA,300,3:;"
    _, r3 = await kubelet.admit_container(RESOURCE, 1)
    assert [env_of(r)["CUDA_DEVICE_MEMORY_LIMIT_0"] for r in (r1, r3)] == ["100m", "300m"]
    assert pod_annos(apiserver, "three")[ann.BIND_PHASE] == "success"


async def test_recorded_card_turned_unhealthy_is_refused_with_that_reason(apiserver, kube, kubelet, plugin):
    # QA finding: the refusal blamed kubelet ("did not follow the preferred allocation") when the real
    # cause was that the scheduler's card went unhealthy between Filter and Allocate.
    write_cards(plugin.cards_file, [CARDS[0], {**CARDS[1], "healthy": False}])
    ep = kubelet.endpoints[RESOURCE]
    await kubelet.wait_for(lambda: ep.unhealthy() == {f"{B}-{i}" for i in range(10)}, timeout=5)
    schedule(apiserver, kube, "sick", [("main", [dev(B, 1000, 10)])])
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit_container(RESOURCE, 1)
    assert str(err.value) == (
        f"Allocate failed due to pod default/sick container main: the scheduler recorded card(s) ['{B}'] but "
        f"['{B}'] became unhealthy on node node1 after scheduling, so kubelet gave devices ['{A}-0'] on other "
        "cards, which is unexpected"
    )
    assert pod_annos(apiserver, "sick")[ann.BIND_PHASE] == "failed"
    assert 'allocation_errors_total{reason="unhealthy_card"} 1.0' in plugin.metrics.render().decode()


# ----- Allocate again after a node reboot


def running(apiserver: FakeApiServer, name: str) -> dict:
    apiserver.store.set_pod_phase("default", name, "Running")
    return apiserver.store.get("pods", name, namespace="default")


def reboot(kubelet: FakeKubelet, apiserver: FakeApiServer | None = None, boot_id: str = "boot-2") -> None:
    """The node rebooted (kubelet reports a new boot ID) and kubelet came back without the assignments
    of its checkpoint (the node-reboot race)."""
    kubelet.allocated.clear()
    kubelet.preferred_requests.clear()
    if apiserver is not None:
        apiserver.store.patch(
            "nodes", NODE, {"status": {"nodeInfo": {"bootID": boot_id}}}, subresource="status"
        )


async def test_after_a_reboot_kubelets_repeated_allocate_is_answered_from_the_records(
    apiserver, kube, kubelet, plugin
):
    pod = schedule(apiserver, kube, "trainer", [("c1", [dev(A, 3000, 30)]), ("c2", [dev(B, 5000, 50)])])
    first = await kubelet.admit_pod(pod, RESOURCE)
    pod = running(apiserver, "trainer")
    before = pod_annos(apiserver, "trainer")
    assert (before[ann.BIND_PHASE], before[ann.NVIDIA_TO_ALLOCATE]) == ("success", ";;")
    reboot(kubelet, apiserver)
    again = await kubelet.admit_pod(pod, RESOURCE)
    for name in ("c1", "c2"):
        e1, e2 = env_of(first[name]), env_of(again[name])
        assert {k: v for k, v in e2.items() if k != "CUDA_DEVICE_MEMORY_SHARED_CACHE"} == {
            k: v for k, v in e1.items() if k != "CUDA_DEVICE_MEMORY_SHARED_CACHE"
        }
    assert env_of(again["c1"])["NVIDIA_VISIBLE_DEVICES"] == A
    assert (env_of(again["c2"])["NVIDIA_VISIBLE_DEVICES"], env_of(again["c2"])["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (
        B, "5000m",
    )  # fmt: skip
    # The preference steered kubelet onto the recorded cards, and nothing was written.
    assert [cards_of(list(r.container_requests[0].devices_ids)) for r in kubelet.allocate_requests[-2:]] == [
        [A],
        [B],
    ]
    assert pod_annos(apiserver, "trainer") == before
    assert ann.NODE_LOCK not in node_annos(apiserver)
    text = plugin.metrics.render().decode()
    assert "hami_device_plugin_allocation_readmissions_total 2.0" in text
    assert "hami_device_plugin_allocations_total 4.0" in text
    # Every container was served again once; a third request has nothing left to be.
    with pytest.raises(AdmissionError, match=r"no pod holds the node lock .*; no pod on node node1 has a "
                       r"container of 1 card\(s\) served before the node's last boot"):  # fmt: skip
        await kubelet.admit_container(RESOURCE, 1)
    assert pod_annos(apiserver, "trainer")[ann.BIND_PHASE] == "success"


async def test_after_a_reboot_the_cards_of_kubelets_ids_tell_two_running_pods_apart(
    apiserver, kube, kubelet, plugin
):
    for name, card, mem in (("on-a", A, 1000), ("on-b", B, 7000)):
        pod = schedule(apiserver, kube, name, [("main", [dev(card, mem, 10)])])
        await kubelet.admit_pod(pod, RESOURCE)
        running(apiserver, name)
    reboot(kubelet, apiserver)
    # Two candidates of one card each that differ: no preference, so kubelet's own pick decides.
    resp = await kubelet.allocate(RESOURCE, [f"{B}-3"])
    assert (env_of(resp)["NVIDIA_VISIBLE_DEVICES"], env_of(resp)["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (
        B,
        "7000m",
    )
    ids, resp = await kubelet.admit_container(RESOURCE, 1)  # the only one left: preferred onto card A
    assert cards_of(ids) == [A]
    assert (env_of(resp)["NVIDIA_VISIBLE_DEVICES"], env_of(resp)["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (
        A,
        "1000m",
    )
    assert warnings_of(apiserver, "on-a") == warnings_of(apiserver, "on-b") == []


async def test_after_a_reboot_differing_candidates_on_other_cards_are_refused_not_guessed(
    apiserver, kube, kubelet, plugin
):
    for name, mem in (("small", 1000), ("large", 9000)):
        pod = schedule(apiserver, kube, name, [("main", [dev(A, mem, 10)])])
        await kubelet.admit_pod(pod, RESOURCE)
        running(apiserver, name)
    reboot(kubelet, apiserver)
    with pytest.raises(AdmissionError) as err:
        await kubelet.allocate(RESOURCE, [f"{B}-0"])
    assert str(err.value) == (
        "Allocate failed due to no pod holds the node lock hami.io/mutex.lock on node node1; only pods bound by "
        "the HAMi scheduler extender can use nvidia.com/gpu; containers that differ in cards or "
        f"limits could each be the one: default/large container main ({A} 9000 MiB 10 %); default/small "
        f"container main ({A} 1000 MiB 10 %), which is unexpected"
    )
    # Refusing a repeated Allocate never marks a running pod failed.
    assert (
        pod_annos(apiserver, "small")[ann.BIND_PHASE]
        == pod_annos(apiserver, "large")[ann.BIND_PHASE]
        == "success"
    )


async def test_without_a_new_boot_id_nothing_is_served_again(apiserver, kube, kubelet, plugin):
    # kubelet (or the plugin) restarted, the node did not: what kubelet asks for again is not proven to be
    # a container this plugin served, so nothing is.
    pod = schedule(apiserver, kube, "steady", [("main", [dev(A, 1000, 10)])])
    await kubelet.admit_pod(pod, RESOURCE)
    reboot(kubelet)  # kubelet forgot its assignments, but the boot ID is the same
    with pytest.raises(
        AdmissionError, match=r"no pod on node node1 has a container of 1 card\(s\) served before"
    ):
        await kubelet.admit_container(RESOURCE, 1)
    assert "hami_device_plugin_allocation_readmissions_total 0.0" in plugin.metrics.render().decode()
