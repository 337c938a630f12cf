"""A pod with ``nvidia.com/vgpu-mode: mig`` from filter to a MIG device in its container: the real extender
and the real device plugin (NVML backend over the fake NVML of `kubefakes.nvml`) against the in-memory
API server and the fake kubelet.

The annotations are compared by value with what HAMi writes for the same inputs: the scheduler's
reservation (``hami.io/vgpu-mig-allocations`` without runtime fields, the device lists with the
profile's memory and cores), then the device plugin's runtime identity added in HAMi's key order.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from device_plugin.app import DevicePluginApp, PluginOptions
from device_plugin.backends.nvidia import NvidiaBackend
from hami import annotations as A
from hami.config import load_config
from hami.kube import KubeClient
from kubefakes.apiserver import FakeApiServer
from kubefakes.kubelet import AdmissionError, FakeKubelet, env_of, mounts_of
from kubefakes.nvml import A100_40GB, FakeNvml, gpu
from tests.builders import make_node
from tests.integration.extender_harness import Scheduler, create_pod, eventually, start_extender, wait_ready

NODE = "mig-node"
RESOURCE = "nvidia.com/gpu"
CONFIG = {
    "nvidia": {
        "migProfileAllowlist": [
            {"models": ["A100-SXM4-40GB"], "profiles": ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]}
        ]
    },
    "nodeconfig": [{"name": NODE, "operatingmode": "mig"}],
}


@pytest.fixture
async def cluster(fake_apiserver: FakeApiServer, tmp_path):
    api = fake_apiserver
    node = make_node(NODE, labels={"gpu": "on"})
    node["status"]["nodeInfo"] = {"bootID": "boot-1"}  # kubelet reports it; a reboot changes it
    api.store.create("nodes", node)
    kube = KubeClient.from_kubeconfig(api.kubeconfig_path)
    nv = FakeNvml([gpu(A100_40GB, 0)])
    config = load_config(CONFIG)
    nvidia = config.nvidia_for_node(NODE)
    backend = NvidiaBackend(
        nvml=nv,
        env={},
        sysfs=tmp_path,
        operating_mode=nvidia.operatingMode,
        mig_allowlist=nvidia.migProfileAllowlist,
    )
    kubelet = FakeKubelet(tmp_path / "device-plugins")
    await kubelet.start()
    hook = tmp_path / "hook"
    (hook / "vgpu").mkdir(parents=True)
    options = PluginOptions(
        node_name=NODE, config=config, socket_dir=str(kubelet.socket_dir), hook_path=str(hook),
        register_interval_s=0.2,
        mig_apply_lock=str(tmp_path / "hami" / "hami-mig-apply.lock"), mig_reconcile_s=0.1,
    )  # fmt: skip
    plugin = DevicePluginApp(options, backend, kube)
    await plugin.start()
    await kubelet.wait_registered(RESOURCE)
    await eventually(
        lambda: A.NVIDIA_REGISTER in (api.store.get("nodes", NODE)["metadata"].get("annotations") or {})
    )
    extender = await start_extender(api)
    await wait_ready(extender)
    await eventually(
        lambda: extender.state.usage_snapshot().get(NODE) is not None, what="node in the extender"
    )
    try:
        yield api, nv, plugin, kubelet, extender
    finally:
        await extender.stop()
        await plugin.stop()
        await kubelet.stop()


def mig_pod(name: str, mem: int = 8000, gpus: int = 1) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default", "annotations": {"nvidia.com/vgpu-mode": "mig"}},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [
                {"name": "main", "image": "cuda:12",
                 "resources": {"limits": {RESOURCE: str(gpus), "nvidia.com/gpumem": str(mem)}}}
            ],
        },
    }  # fmt: skip


def annos(api: FakeApiServer, name: str) -> dict[str, str]:
    return api.store.get("pods", name, namespace="default")["metadata"]["annotations"]


async def schedule(api, sched, name: str, **kw) -> dict:
    pod = create_pod(api, mig_pod(name, **kw))
    result = await sched.filter(pod, [NODE])
    assert result["NodeNames"] == [NODE], result
    bound = await sched.bind(api.store.get("pods", name, namespace="default"), NODE)
    assert bound["Error"] == "", bound
    return api.store.get("pods", name, namespace="default")


async def test_mig_pod_goes_from_filter_to_a_mig_device_in_its_container(cluster, session):
    api, nv, plugin, kubelet, extender = cluster
    card = nv.gpus[0].uuid
    sched = Scheduler(session, extender.url)
    registered = json.loads(api.store.get("nodes", NODE)["metadata"]["annotations"][A.NVIDIA_REGISTER])
    assert registered[0]["mode"] == "mig" and registered[0]["count"] == 7
    assert [p["name"] for p in registered[0]["migProfiles"]] == ["1g.5gb", "2g.10gb", "3g.20gb", "7g.40gb"]

    pod = await schedule(api, sched, "mig-a")
    a = annos(api, "mig-a")
    # 8000 MiB -> the smallest allowed profile with a free placement: 2g.10gb (9984 MiB, 29 %) at 0
    assert a[A.NVIDIA_ALLOCATED] == f"{card},NVIDIA,9984,29:;"
    assert a[A.MIG_ALLOCATIONS] == (
        f'[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{card}","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2}}]'
    )
    resp = (await kubelet.admit_pod(pod, RESOURCE))["main"]
    ((_, _, gi, ci, mig),) = nv.instances(0)
    assert nv.instances(0) == [("2g.10gb", 0, gi, ci, mig)]
    assert env_of(resp) == {"NVIDIA_VISIBLE_DEVICES": mig}
    assert mounts_of(resp) == []  # the MIG instance isolates: no libvgpu
    a = annos(api, "mig-a")
    assert a[A.MIG_ALLOCATIONS] == (
        f'[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{card}","profile":"2g.10gb",'
        f'"placement":{{"start":0,"size":2}},"migUUID":"{mig}","gpuInstanceID":{gi},"computeInstanceID":{ci}}}]'
    )
    assert a[A.BIND_PHASE] == "success" and a[A.NVIDIA_TO_ALLOCATE] == ";"
    assert A.NODE_LOCK not in (api.store.get("nodes", NODE)["metadata"].get("annotations") or {})

    # a second pod takes the next 2g placement; both instances live side by side
    pod_b = await schedule(api, sched, "mig-b")
    resp_b = (await kubelet.admit_pod(pod_b, RESOURCE))["main"]
    assert [(i[0], i[1]) for i in nv.instances(0)] == [("2g.10gb", 0), ("2g.10gb", 2)]
    assert env_of(resp_b)["NVIDIA_VISIBLE_DEVICES"] != mig

    # the pod is gone: after a confirmed list its instance is destroyed, the other one stays
    api.store.delete("pods", "mig-a", namespace="default")
    await eventually(
        lambda: [(i[0], i[1]) for i in nv.instances(0)] == [("2g.10gb", 2)], what="instance removed"
    )
    # a busy instance of a finished pod is kept until its process is gone
    nv.run_process(env_of(resp_b)["NVIDIA_VISIBLE_DEVICES"], 777)
    api.store.set_pod_phase("default", "mig-b", "Succeeded")
    await asyncio.sleep(0.5)
    assert [(i[0], i[1]) for i in nv.instances(0)] == [("2g.10gb", 2)]
    nv.stop_processes(env_of(resp_b)["NVIDIA_VISIBLE_DEVICES"])
    await eventually(lambda: nv.instances(0) == [], what="busy instance removed once idle")
    assert nv.mig_mode_changes == 0


async def test_foreign_instances_take_the_card_out_of_service_until_removed(cluster, session):
    api, nv, plugin, kubelet, extender = cluster
    sched = Scheduler(session, extender.url)
    theirs = nv.admin_create(0, "1g.5gb", 6)

    def health() -> bool:
        return json.loads(api.store.get("nodes", NODE)["metadata"]["annotations"][A.NVIDIA_REGISTER])[0].get(
            "health", False
        )

    await eventually(lambda: not health(), what="card registered unhealthy")
    events = [
        e for e in api.store.list("events", namespace="default") if e["reason"] == "MigForeignInstances"
    ]
    assert events and theirs in events[0]["message"] and events[0]["involvedObject"]["kind"] == "Node"
    await eventually(
        lambda: extender.state.filter(mig_pod("probe"), [NODE]).node is None, what="extender saw it"
    )
    pod = create_pod(api, mig_pod("blocked"))
    result = await sched.filter(pod, [NODE])
    assert result["NodeNames"] == [] and "CardNotHealth" in result["FailedNodes"][NODE]
    assert [i[4] for i in nv.instances(0)] == [theirs]  # left exactly as it is
    # the administrator removes it: the card is back
    h = nv.nvmlDeviceGetHandleByIndex(0)
    plugin_nvml = plugin.backend.mig
    (inst,) = plugin_nvml.instances(h, nv.gpus[0].uuid, plugin.backend.mig_profiles[nv.gpus[0].uuid])
    plugin_nvml.destroy(h, inst.gi_id, inst.ci_id)
    await eventually(health, what="card back in service")


async def test_restart_adopts_live_instances_and_a_reboot_recreates_them(cluster, session, tmp_path):
    api, nv, plugin, kubelet, extender = cluster
    sched = Scheduler(session, extender.url)
    pod = await schedule(api, sched, "mig-r", mem=4000)
    await kubelet.admit_pod(pod, RESOURCE)
    ((profile, start, gi, ci, mig),) = nv.instances(0)
    assert (profile, start) == ("1g.5gb", 6)
    api.store.set_pod_phase("default", "mig-r", "Running")
    # the plugin restarts and its ledger is lost: the pod's record adopts the instance (not foreign)
    await plugin.stop()
    plugin.options.mig_ledger.unlink()
    again = DevicePluginApp(plugin.options, plugin.backend, plugin.kube)
    await again.start()
    try:
        await asyncio.sleep(0.3)
        assert nv.instances(0) == [(profile, start, gi, ci, mig)]
        assert again.state.blocked() == {}
        assert [i.mig_uuid for i in again.mig.manager.owned()] == [mig]
    finally:
        await again.stop()
    # a reboot: instances are gone; kubelet admits the running pod again (no lock held) and the
    # instance is made again at the reserved placement, its new identity recorded
    nv.reboot()
    api.store.patch("nodes", NODE, {"status": {"nodeInfo": {"bootID": "boot-2"}}}, subresource="status")
    kubelet2 = FakeKubelet(tmp_path / "device-plugins-2")
    await kubelet2.start()
    options = PluginOptions(**{**plugin.options.__dict__, "socket_dir": str(kubelet2.socket_dir)})
    booted = DevicePluginApp(options, plugin.backend, plugin.kube)
    await booted.start()
    try:
        await kubelet2.wait_registered(RESOURCE)
        resp = (await kubelet2.admit_pod(api.store.get("pods", "mig-r", namespace="default"), RESOURCE))[
            "main"
        ]
        ((profile2, start2, gi2, ci2, mig2),) = nv.instances(0)
        assert (profile2, start2) == ("1g.5gb", 6) and mig2 != mig
        assert env_of(resp) == {"NVIDIA_VISIBLE_DEVICES": mig2}
        (record,) = A.decode_mig_allocations(annos(api, "mig-r")[A.MIG_ALLOCATIONS])
        assert (record.mig_uuid, record.gpu_instance_id, record.compute_instance_id) == (mig2, gi2, ci2)
    finally:
        await booted.stop()
        await kubelet2.stop()


async def test_a_reservation_that_cannot_be_made_fails_the_pod_and_leaves_nothing(cluster, session):
    api, nv, plugin, kubelet, extender = cluster
    sched = Scheduler(session, extender.url)
    pod = await schedule(api, sched, "mig-f")
    nv.fail_next("nvmlGpuInstanceCreateComputeInstance", 23)  # NVML_ERROR_INSUFFICIENT_RESOURCES
    with pytest.raises(AdmissionError, match="NVML refused to create it"):
        await kubelet.admit_pod(pod, RESOURCE)
    assert nv.instances(0) == []
    assert annos(api, "mig-f")[A.BIND_PHASE] == "failed"


async def test_a_rewritten_mig_reservation_is_not_served(cluster, session):
    # The extender decided a 2g.10gb instance at placement 0; between Bind and Allocate the owner (where
    # nothing refused the write) rewrites hami.io/vgpu-mig-allocations to the whole card, 7g.40gb. The
    # device list still says 9984 MiB, but the instance the plugin makes is what the reservation names:
    # it must be the one the lock's stamp digests, so nothing is made and the pod is refused.
    api, nv, plugin, kubelet, extender = cluster
    card = nv.gpus[0].uuid
    sched = Scheduler(session, extender.url)
    pod = await schedule(api, sched, "mig-x")
    forged = (
        f'[{{"containerIndex":0,"deviceIndex":0,"gpuUUID":"{card}","profile":"7g.40gb",'
        '"placement":{"start":0,"size":8}}]'
    )
    api.store.patch(
        "pods", "mig-x", {"metadata": {"annotations": {A.MIG_ALLOCATIONS: forged}}}, namespace="default"
    )
    with pytest.raises(AdmissionError, match="not what the scheduler decided"):
        await kubelet.admit_pod(api.store.get("pods", "mig-x", namespace="default"), RESOURCE)
    assert nv.instances(0) == []
    assert annos(api, "mig-x")[A.BIND_PHASE] == "failed"
    # The stamp holds only the reservation: the runtime identity the plugin adds is no change.
    pod = await schedule(api, sched, "mig-y")
    [decided] = A.decode_mig_allocations(annos(api, "mig-y")[A.MIG_ALLOCATIONS])
    await kubelet.admit_pod(pod, RESOURCE)
    assert [(i[0], i[1]) for i in nv.instances(0)] == [(decided.profile, decided.placement.start)]
    assert annos(api, "mig-y")[A.BIND_PHASE] == "success"


def test_hami_simulate_replays_mig_cards(tmp_path):
    """The simulator runs the same core: one card of seven 1g placements takes seven 1g pods, not eight,
    and writes the reservations HAMi writes."""
    import subprocess
    import sys
    from pathlib import Path

    profile = {"name": "1g.5gb", "memoryMB": 4864, "core": 15, "sliceCount": 1,
               "placements": [{"start": i, "size": 1} for i in range(7)]}  # fmt: skip
    reg = json.dumps([{"id": "GPU-m", "count": 7, "devmem": 40960, "devcore": 100, "type": "NVIDIA A100-SXM4-40GB",
                       "mode": "mig", "migProfiles": [profile], "health": True}])  # fmt: skip
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        "kind: Node\nmetadata:\n  name: m1\n  annotations:\n    hami.io/node-nvidia-register: "
        f"'{reg}'\nstatus: {{allocatable: {{cpu: '64', memory: 256Gi}}}}\n"
    )
    pods = tmp_path / "pods.yaml"
    pods.write_text(
        "".join(
            f"---\nkind: Pod\nmetadata: {{name: p{i}, creationTimestamp: '2024-01-01T00:00:0{i}Z', "
            "annotations: {nvidia.com/vgpu-mode: mig}}\n"
            "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4000}}}]}\n"
            for i in range(8)
        )
    )
    annos = tmp_path / "a.jsonl"
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run(
        [sys.executable, "-m", "hami.cli", "simulate", "--no-progress", "--nodes", str(nodes), "--pods", str(pods),
         "--mode", "trace", "--json", "--annotations", str(annos)],
        capture_output=True, text=True, timeout=120, cwd=root,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["scheduled"] == 7
    starts = [
        json.loads(json.loads(line)["annotations"][A.MIG_ALLOCATIONS])[0]["placement"]["start"]
        for line in annos.read_text().splitlines()
    ]
    assert starts == [6, 5, 4, 3, 2, 1, 0]
