# ruff: noqa: F811 - the fixtures are imported from the allocator tests and named as parameters
"""The device plugin serves only what the scheduler decided for the pod its lock names: a pod owner who
rewrites its annotations between Bind and Allocate (the webhook down or bypassed) gets a refusal, never
more memory or cores than its spec asks or its card has, nor another card.

The real plugin (fake backend: two 32768 MiB cards) with the fake kubelet and the in-memory API server;
pods are prepared as the extender leaves them (`schedule`), the node lock taken by `hami.nodelock`.
"""

from __future__ import annotations

import pytest

from hami import annotations as ann
from hami.nodelock import lock_node
from kubefakes.kubelet import AdmissionError, env_of
from tests.integration.test_device_plugin_allocator import (  # noqa: F401 - fixtures
    NODE,
    RESOURCE,
    A,
    B,
    apiserver,
    dev,
    hook,
    kube,
    kubelet,
    plugin,
    pod_annos,
    schedule,
)


def _rewrite(apiserver, name: str, **annotations: str) -> None:
    apiserver.store.patch("pods", name, {"metadata": {"annotations": annotations}}, namespace="default")


@pytest.mark.parametrize(
    ("forged", "why"),
    [
        (f"{A},NVIDIA,30000,30:;", "30000 MiB"),  # more memory than the spec's 1000
        (f"{A},NVIDIA,1000,100:;", "100 %"),  # more cores than the spec's 30
        (f"{A},NVIDIA,80000,100:;", "80000 MiB"),  # more than the 32768 MiB card has
    ],
)
async def test_more_than_the_spec_asks_is_refused(apiserver, kube, kubelet, plugin, forged, why) -> None:
    schedule(apiserver, kube, "greedy", [("main", [dev(A, 1000, 30)])])
    _rewrite(apiserver, "greedy", **{ann.NVIDIA_TO_ALLOCATE: forged, ann.NVIDIA_ALLOCATED: forged})
    with pytest.raises(AdmissionError) as err:
        await kubelet.admit_container(RESOURCE, 1)
    assert why in str(err.value) and "pod default/greedy container main" in str(err.value), str(err.value)
    assert pod_annos(apiserver, "greedy")[ann.BIND_PHASE] == "failed"


async def test_a_to_allocate_entry_that_differs_from_the_allocation_is_refused(
    apiserver, kube, kubelet, plugin
) -> None:
    schedule(apiserver, kube, "edited", [("main", [dev(A, 1000, 30)])])
    _rewrite(apiserver, "edited", **{ann.NVIDIA_TO_ALLOCATE: f"{B},NVIDIA,1000,30:;"})
    with pytest.raises(AdmissionError, match="differs from hami.io/vgpu-devices-allocated"):
        await kubelet.admit_container(RESOURCE, 1)


def _stamped(apiserver, kube, name: str, entry: list) -> dict:
    """`schedule` with the node lock taken as the extender takes it: stamped with UID and allocation."""
    pod = schedule(apiserver, kube, name, [("main", entry)], take_lock=False)
    value = ann.encode_pod_devices([entry])
    stamp = ann.encode_allocation_stamp(pod["metadata"]["uid"], {ann.NVIDIA_ALLOCATED: value})
    lock_node(kube, NODE, namespace="default", pod_name=name, stamp=stamp)
    return pod


async def test_an_allocation_moved_to_another_card_is_refused(apiserver, kube, kubelet, plugin) -> None:
    # Within the spec, but on card B while the scheduler decided (and accounted) card A.
    _stamped(apiserver, kube, "mover", [dev(A, 1000, 30)])
    moved = f"{B},NVIDIA,1000,30:;"
    _rewrite(apiserver, "mover", **{ann.NVIDIA_TO_ALLOCATE: moved, ann.NVIDIA_ALLOCATED: moved})
    with pytest.raises(AdmissionError, match="not what the scheduler decided"):
        await kubelet.admit_container(RESOURCE, 1)


async def test_a_pod_recreated_under_the_lock_holders_name_is_refused(
    apiserver, kube, kubelet, plugin
) -> None:
    # The owner deletes its bound pod and creates one of the same name with spec.nodeName and copied
    # annotations: the lock names it, but it is not the pod the lock was taken for.
    bound = _stamped(apiserver, kube, "twin", [dev(A, 1000, 30)])
    apiserver.store.delete("pods", "twin", namespace="default")
    decoy = {k: v for k, v in bound.items() if k in ("metadata", "spec")}
    decoy["metadata"] = {
        k: v for k, v in bound["metadata"].items() if k in ("name", "namespace", "annotations", "labels")
    }
    decoy["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = "30000"
    decoy["metadata"]["annotations"][ann.NVIDIA_TO_ALLOCATE] = f"{A},NVIDIA,30000,30:;"
    decoy["metadata"]["annotations"][ann.NVIDIA_ALLOCATED] = f"{A},NVIDIA,30000,30:;"
    apiserver.store.create("pods", decoy)
    with pytest.raises(AdmissionError, match="taken for pod UID"):
        await kubelet.admit_container(RESOURCE, 1)


async def test_the_stamped_allocation_is_served(apiserver, kube, kubelet, plugin) -> None:
    _stamped(apiserver, kube, "honest", [dev(A, 1000, 30)])
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    env = env_of(resp)
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (
        A, "1000m", "30",
    )  # fmt: skip
    node = apiserver.store.get("nodes", NODE)["metadata"].get("annotations") or {}
    assert ann.NODE_LOCK not in node and ann.NODE_LOCK_ALLOCATION not in node  # released together


async def test_two_pods_between_bind_and_allocate_are_never_guessed_between(
    apiserver, kube, kubelet, plugin
) -> None:
    # HAMi#3096: pod a's lock expired before kubelet asked for it and pod b took the lock over. An
    # Allocate now may be a's or b's: neither gets the other's limits; the plugin refuses.
    schedule(apiserver, kube, "a", [("main", [dev(A, 1000, 30)])])
    apiserver.store.patch("nodes", NODE, {"metadata": {"annotations": {ann.NODE_LOCK: None}}})
    schedule(apiserver, kube, "b", [("main", [dev(B, 5000, 50)])])
    with pytest.raises(AdmissionError, match="both between Bind and Allocate"):
        await kubelet.admit_container(RESOURCE, 1)
    assert pod_annos(apiserver, "b")[ann.BIND_PHASE] == "allocating"  # nobody marked failed on a guess
    # Once a is gone (kubelet failed its admission), b is served its own limits.
    apiserver.store.set_pod_phase("default", "a", "Failed")
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    assert (env_of(resp)["NVIDIA_VISIBLE_DEVICES"], env_of(resp)["CUDA_DEVICE_MEMORY_LIMIT_0"]) == (
        B,
        "5000m",
    )


# ----- no lock held: only a proven reboot, only this plugin's record, never another pod's card


def _decoy(apiserver, victim: dict, *, scheduler: str = "default-scheduler", mem: str = "1000") -> dict:
    """A pod bound to the node by its owner (spec.nodeName), with the victim's annotations copied."""
    pod = {
        "metadata": {
            "name": "decoy",
            "namespace": "default",
            "annotations": dict(victim["metadata"]["annotations"]),
        },
        "spec": {
            "schedulerName": scheduler,
            "nodeName": NODE,
            "containers": [
                {
                    "name": "main",
                    "image": "cuda",
                    "resources": {"limits": {RESOURCE: "1", "nvidia.com/gpumem": mem}},
                }
            ],
        },
    }
    return apiserver.store.create("pods", pod, keep_status=False)


async def _served_victim(apiserver, kube, kubelet, hook) -> tuple[dict, object]:
    victim = schedule(apiserver, kube, "victim", [("main", [dev(A, 1000, 30)])])
    await kubelet.admit_pod(victim, RESOURCE)
    apiserver.store.set_pod_phase("default", "victim", "Running")
    cache = hook / "vgpu" / "containers" / f"{victim['metadata']['uid']}_main"
    (cache / "usage.cache").write_text("the victim's usage")
    return apiserver.store.get("pods", "victim", namespace="default"), cache


@pytest.mark.parametrize("scheduler", ["default-scheduler", "hami-scheduler"])
async def test_a_decoy_bound_by_hand_never_gets_the_running_pods_card(
    apiserver, kube, kubelet, plugin, hook, scheduler
) -> None:
    victim, cache = await _served_victim(apiserver, kube, kubelet, hook)
    _decoy(apiserver, victim, scheduler=scheduler)
    with pytest.raises(AdmissionError, match="no pod holds the node lock"):
        await kubelet.admit_container(RESOURCE, 1)
    assert (cache / "usage.cache").read_text() == "the victim's usage"  # not wiped for the decoy
    assert "hami_device_plugin_allocation_readmissions_total 0.0" in plugin.metrics.render().decode()


async def test_after_a_reboot_a_decoy_on_the_node_stops_every_readmission(
    apiserver, kube, kubelet, plugin, hook
) -> None:
    from tests.integration.test_device_plugin_allocator import reboot

    victim, cache = await _served_victim(apiserver, kube, kubelet, hook)
    _decoy(apiserver, victim, mem="30000")
    reboot(kubelet, apiserver)
    with pytest.raises(
        AdmissionError, match="default/decoy on node node1 limit nvidia.com/gpu but were never served"
    ):
        await kubelet.admit_container(RESOURCE, 1)
    # kubelet failed the decoy's admission; the victim's container is served its own record again.
    apiserver.store.set_pod_phase("default", "decoy", "Failed")
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    env = env_of(resp)
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (
        A, "1000m", "30",
    )  # fmt: skip
    assert (cache / "usage.cache").read_text() == "the victim's usage"  # its own directory, kept


async def test_after_a_reboot_the_record_is_served_not_the_rewritten_annotations(
    apiserver, kube, kubelet, plugin, hook
) -> None:
    from tests.integration.test_device_plugin_allocator import reboot

    await _served_victim(apiserver, kube, kubelet, hook)
    greedy = f"{B},NVIDIA,30000,100:;"
    _rewrite(apiserver, "victim", **{ann.NVIDIA_ALLOCATED: greedy, ann.NVIDIA_TO_ALLOCATE: ";"})
    reboot(kubelet, apiserver)
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    env = env_of(resp)
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_DEVICE_MEMORY_LIMIT_0"], env["CUDA_DEVICE_SM_LIMIT"]) == (
        A, "1000m", "30",
    )  # fmt: skip
    # Served again once in this boot; a second reboot allows it once more.
    with pytest.raises(AdmissionError):
        await kubelet.admit_container(RESOURCE, 1)
    reboot(kubelet, apiserver, boot_id="boot-3")
    _ids, resp = await kubelet.admit_container(RESOURCE, 1)
    assert env_of(resp)["NVIDIA_VISIBLE_DEVICES"] == A
