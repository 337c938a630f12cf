"""The control switch (``CUDA_DISABLE_CONTROL``) turns libvgpu off only where the scheduler saw it and
gave the container exclusive cards; the device plugin's read-only ``vgpu.config`` is the authority.

End to end on one API server: the device plugin registers its cards, the real extender filters and
binds, the fake kubelet admits the pod and the plugin answers Allocate; the test reads the file the
plugin wrote and the decision the scheduler recorded.

* literal ``env: CUDA_DISABLE_CONTROL=true``: the scheduler gives whole exclusive cards (100 % of the
  SMs, nothing else placed on them), the plugin writes ``CUDA_DISABLE_CONTROL=true`` into vgpu.config
  and mounts no ld.so.preload;
* the same value from ``envFrom`` / ``valueFrom`` (a ConfigMap the scheduler cannot read): the card
  stays shared and the file carries no such entry, so libvgpu keeps enforcing.
"""

# ruff: noqa: F811 - the fixtures are imported from the allocator tests and named as parameters
from __future__ import annotations

import asyncio

import aiohttp

from device_plugin import vgpu_config
from hami import annotations as ann
from kubefakes.kubelet import env_of, mounts_of
from tests.integration.extender_harness import Scheduler, start_extender, wait_ready
from tests.integration.test_device_plugin_allocator import (  # noqa: F401 - fixtures
    NODE,
    RESOURCE,
    A,
    apiserver,
    dev,
    hook,
    kube,
    kubelet,
    plugin,
    pod_annos,
    schedule,
)


def _pod(name: str, env: list[dict]) -> dict:
    limits = {RESOURCE: "1", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"}
    return {
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "schedulerName": "hami-scheduler",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}, **env[0]}],
        },
    }


async def _place_and_allocate(apiserver, kubelet, server, session, name: str, env: list[dict]):
    pod = apiserver.store.create("pods", _pod(name, env))
    sched = Scheduler(session, server.url)
    result = await sched.filter(pod, [NODE])
    assert Scheduler.chosen(result) == [NODE], result
    assert (await sched.bind(pod, NODE))["Error"] == ""
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    uid = pod["metadata"]["uid"]
    return pod_annos(apiserver, name), resp, uid


async def _extender(apiserver):
    def registered() -> bool:
        return ann.NVIDIA_REGISTER in (
            apiserver.store.get("nodes", NODE)["metadata"].get("annotations") or {}
        )

    for _ in range(200):
        if registered():
            break
        await asyncio.sleep(0.05)
    server = await start_extender(apiserver)
    await wait_ready(server)
    return server


def _config(hook, uid: str) -> dict[str, str]:
    return vgpu_config.parse((hook / "vgpu" / "containers" / f"{uid}_main" / "vgpu.config").read_text())


async def test_a_literal_switch_gets_exclusive_cards_and_the_file_entry(
    apiserver, kube, kubelet, plugin, hook
):
    server = await _extender(apiserver)
    try:
        async with aiohttp.ClientSession() as session:
            env = [{"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}]
            annos, resp, uid = await _place_and_allocate(apiserver, kubelet, server, session, "opt-out", env)
        [[card]] = ann.decode_pod_devices(annos[ann.NVIDIA_ALLOCATED])
        assert card.usedcores == 100  # the scheduler's decision: a whole, exclusive card
        assert _config(hook, uid)["CUDA_DISABLE_CONTROL"] == "true"
        assert "/etc/ld.so.preload" not in [m[0] for m in mounts_of(resp)]
        assert env_of(resp)["CUDA_DEVICE_SM_LIMIT"] == "100"
    finally:
        await server.stop()


async def test_a_switch_from_a_config_map_keeps_the_card_shared_and_enforced(
    apiserver, kube, kubelet, plugin, hook
):
    server = await _extender(apiserver)
    try:
        async with aiohttp.ClientSession() as session:
            for name, env in (
                ("from-envfrom", [{"envFrom": [{"configMapRef": {"name": "no-limits"}}]}]),
                (
                    "from-valuefrom",
                    [{"env": [{"name": "CUDA_DISABLE_CONTROL",
                               "valueFrom": {"configMapKeyRef": {"name": "no-limits", "key": "off"}}}]}],
                ),
            ):  # fmt: skip
                annos, resp, uid = await _place_and_allocate(apiserver, kubelet, server, session, name, env)
                [[card]] = ann.decode_pod_devices(annos[ann.NVIDIA_ALLOCATED])
                assert card.usedcores == 30, name  # shared: the scheduler saw no switch
                assert _config(hook, uid)["CUDA_DISABLE_CONTROL"] == "false", name  # stated, not left out
                assert "/etc/ld.so.preload" in [m[0] for m in mounts_of(resp)], name
                assert env_of(resp)["CUDA_DEVICE_SM_LIMIT"] == "30"
    finally:
        await server.stop()


async def test_a_literal_switch_on_a_shared_card_keeps_control(apiserver, kube, kubelet, plugin, hook):
    # The allocation says 30 % (not the scheduler's exclusive mark; another scheduler or an edit):
    # the container shares the card, so libvgpu keeps enforcing whatever its env says.
    pod = schedule(
        apiserver,
        kube,
        "half",
        [("main", [dev(A, 1000, 30)])],
        env={"main": {"CUDA_DISABLE_CONTROL": "true"}},
    )
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    assert _config(hook, pod["metadata"]["uid"])["CUDA_DISABLE_CONTROL"] == "false"
    assert "/etc/ld.so.preload" in [m[0] for m in mounts_of(resp)]
