"""Regression tests for real HAMi user bug reports (../shared/reference/user-bug-log.md).

One test (or a few) per report that concerns scheduling, annotations, quantities, quotas or policies,
named after the report's local ID; each asserts the values the report says are correct.
"""

from __future__ import annotations

import copy
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from hami import annotations as A
from hami.cluster import ClusterState
from hami.fit import NodeView, fit_pod
from hami.model import ContainerDevice, ContainerRequest, Device, DeviceUsage, Selection
from hami.pods import ContainerKind, ContainerSpec, collapse_grants
from hami.registration import decode_node_devices_colon, encode_node_devices_colon
from hami.scoring import CardPolicy, NodePolicy, PolicyChoice
from hami.vendors import build_vendors
from tests.builders import cards, ctr, node, pod

GPU_A = "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448"


def placed(p, out, phase="Running"):
    """The pod as the API server holds it after the extender's patch."""
    p = copy.deepcopy(p)
    p["metadata"]["annotations"].update(out.annotations)
    p["metadata"].setdefault("labels", {}).update(out.labels)
    p["status"] = {"phase": phase}
    return p


def carrying(p, node_name, allocated, phase="Running"):
    """A pod carrying allocation annotations written by someone else (another HAMi version)."""
    p = copy.deepcopy(p)
    p["metadata"]["annotations"].update({A.ASSIGNED_NODE: node_name, A.NVIDIA_ALLOCATED: allocated})
    p["status"] = {"phase": phase}
    return p


def init_done(p):
    p = copy.deepcopy(p)
    p["status"]["initContainerStatuses"] = [
        {"name": c["name"], "state": {"terminated": {"exitCode": 0}}} for c in p["spec"]["initContainers"]
    ]
    return p


def quota(ns, **hard):
    return {"metadata": {"namespace": ns, "name": "gpu"}, "spec": {"hard": hard}}


def state(*nodes):
    cs = ClusterState()
    for n in nodes:
        assert cs.upsert_node(n) is None
    return cs


# --- 1a webhook reports that are about quantities -----------------------------------------------


def test_W07_gpumem_with_a_unit_is_mib_never_zero_or_wrapped():
    cs = state(node("n", cards("n", 1)))
    out = cs.filter(pod(ctr(gpu=1, mem="16Gi")), ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == "GPU-n-0,NVIDIA,16384,0:;"
    # The API server stores `gpumem: 20000` in canonical form "20k": still 20000 MiB, as in HAMi.
    out = cs.filter(pod(ctr(gpu=1, mem="10k")), ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == "GPU-n-0,NVIDIA,10000,0:;"
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (2, 26384, 0)}
    out = cs.filter(pod(ctr("main", gpu=1, mem="16G"), name="p", ns="ml"), ["n"])
    assert out.node is None
    assert out.error == (
        "pod ml/p: container main: nvidia.com/gpumem: '16G' is 15258.789 MiB, not a whole number of MiB; "
        "write MiB as a bare number (e.g. 16384) or use Mi/Gi units"
    )


def test_W07_quota_limit_in_canonical_k_form_is_enforced():
    # `limits.nvidia.com/gpumem: 24000` is stored as "24k"; reading it as 24000 bytes dropped the quota.
    cs = state(node("n", cards("n", 2)))
    cs.upsert_quota(quota("team", **{"limits.nvidia.com/gpumem": "24k"}))
    assert cs.quota.limit("team", "nvidia.com/gpumem") == 24000
    assert cs.filter(pod(ctr(gpu=1, mem="20k"), ns="team"), ["n"]).node == "n"
    out = cs.filter(pod(ctr(gpu=1, mem="5k"), ns="team"), ["n"])
    assert out.node is None and out.failed_nodes == {"n": "2/2 ResourceQuotaNotFit"}


# --- 1b extender filter and score ---------------------------------------------------------------


def test_X01_bare_gpu_means_whole_card_and_the_reason_says_memory():
    cs = state(node("n", cards("n", 1, mem=24576)))
    assert cs.filter(pod(ctr(gpu=1, mem=3000)), ["n"]).node == "n"
    out = cs.filter(pod(ctr(gpu=1)), ["n"])
    assert out.node is None
    assert out.failed_nodes == {"n": "1/1 CardInsufficientMemory"}


def test_X02_gpucores_100_makes_the_card_exclusive():
    cs = state(node("n", cards("n", 1, count=3)))
    assert cs.filter(pod(ctr(gpu=1, mem=1000, cores=100)), ["n"]).node == "n"
    out = cs.filter(pod(ctr(gpu=1, mem=1000)), ["n"])
    assert out.node is None and out.failed_nodes == {"n": "1/1 CardComputeUnitsExhausted"}
    out = cs.filter(pod(ctr(gpu=1, mem=1000, cores=10)), ["n"])
    assert out.failed_nodes == {"n": "1/1 CardInsufficientCore"}
    # The other order: an exclusive pod needs an idle card.
    cs = state(node("n", cards("n", 1, count=3)))
    assert cs.filter(pod(ctr(gpu=1, mem=1000)), ["n"]).node == "n"
    out = cs.filter(pod(ctr(gpu=1, mem=1000, cores=100)), ["n"])
    assert out.failed_nodes == {"n": "1/1 ExclusiveDeviceAllocateConflict"}


def test_X05_one_canonical_entry_per_container_in_spec_order():
    cs = state(node("n", cards("n", 1)))
    p = pod(ctr("c0"), ctr("c1", gpu=1, mem=1000), ctr("c2"), ctr("c3"), ctr("c4"))
    out = cs.filter(p, ["n"])
    assert out.annotations[A.NVIDIA_TO_ALLOCATE] == ";GPU-n-0,NVIDIA,1000,0:;;;;"
    assert out.annotations[A.NVIDIA_ALLOCATED] == ";GPU-n-0,NVIDIA,1000,0:;;;;"


def test_X05_decoders_tolerate_the_variants_hami_wrote():
    dev = ContainerDevice(GPU_A, "NVIDIA", 1000, 0)
    # Empty slot as an empty device ",,0,0:".
    assert A.decode_pod_devices(f",,0,0:;{GPU_A},NVIDIA,1000,0:;") == [[], [dev]]
    # An extra leading ";" for a 2-container pod whose second container has the GPU.
    assert A.align_pod_devices(A.decode_pod_devices(f";;{GPU_A},NVIDIA,1000,0:;"), 2) == [[], [dev]]
    # A device with an empty uuid but real usage is still malformed, naming entry and device.
    with pytest.raises(A.AnnotationError, match=r"^container entry 0, device 0: empty uuid"):
        A.decode_pod_devices(",NVIDIA,1000,0:;")


def test_X05_pod_with_the_empty_device_variant_is_counted():
    cs = state(node("n", cards("n", 1)))
    p = pod(ctr("sidecar"), ctr("main", gpu=1, mem=1000, cores=10))
    cs.upsert_pod(carrying(p, "n", ",,0,0:;GPU-n-0,NVIDIA,1000,10:;"))
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 1000, 10)}


def test_X06_non_gpu_init_container_keeps_its_empty_slot_first():
    cs = state(node("n", cards("n", 2)))
    p = pod(ctr("a", gpu=1, mem=2500, cores=25), ctr("b", gpu=1, mem=2500, cores=25), init=[ctr("busybox")])
    out = cs.filter(p, ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == ";GPU-n-0,NVIDIA,2500,25:;GPU-n-1,NVIDIA,2500,25:;"
    q = placed(p, out)
    cs.upsert_pod(q)
    cs.upsert_pod(init_done(q))
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (1, 2500, 25), "GPU-n-1": (1, 2500, 25)}


def test_X06_list_written_by_hami_padding_regression_is_counted_per_app_container():
    # HAMi (§8.2) drops the init container's leading empty entry: 2 entries for 3 containers.
    cs = state(node("n", cards("n", 1)))
    p = pod(ctr("a", gpu=1, mem=2500, cores=25), ctr("b", gpu=1, mem=2500, cores=25), init=[ctr("busybox")])
    q = carrying(p, "n", "GPU-n-0,NVIDIA,2500,25:;GPU-n-0,NVIDIA,2500,25:;")
    cs.upsert_pod(q)
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (2, 5000, 50)}


def test_X06_regression_list_after_init_done_keeps_app_usage():
    cs = state(node("n", cards("n", 1)))
    p = pod(ctr("a", gpu=1, mem=2500, cores=25), ctr("b", gpu=1, mem=2500, cores=25), init=[ctr("busybox")])
    q = carrying(p, "n", "GPU-n-0,NVIDIA,2500,25:;GPU-n-0,NVIDIA,2500,25:;")
    cs.upsert_pod(init_done(q))
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (2, 5000, 50)}


def test_X07_shared_request_with_init_container_avoids_an_exclusive_card():
    cs = state(node("n", cards("n", 2)))
    a = pod(ctr("app", gpu=1, cores=100), init=[ctr("init")])
    out_a = cs.filter(a, ["n"])
    assert out_a.annotations[A.NVIDIA_ALLOCATED] == ";GPU-n-0,NVIDIA,32768,100:;"
    cs.upsert_pod(init_done(placed(a, out_a)))
    b = pod(ctr("app", gpu=1, mem=20000, cores=22), init=[ctr("init")])
    out_b = cs.filter(b, ["n"])
    assert out_b.annotations[A.NVIDIA_ALLOCATED] == ";GPU-n-1,NVIDIA,20000,22:;"
    # With only the exclusive card, B stays pending.
    cs = state(node("n", cards("n", 1)))
    cs.upsert_pod(init_done(placed(a, cs.filter(a, ["n"]))))
    assert cs.filter(b, ["n"]).failed_nodes == {"n": "1/1 CardInsufficientMemory"}


def test_X08_init_container_does_not_open_a_quota_bypass():
    devs = cards("n", 1, mem=40000)
    for init in ([], [ctr("setup")]):
        cs = state(node("n", devs))
        cs.upsert_quota(quota("team", **{"limits.nvidia.com/gpumem": "24k"}))
        p = pod(ctr("a", gpu=1, pct=40), ctr("b", gpu=1, pct=40), init=init, ns="team")
        out = cs.filter(p, ["n"])
        assert out.node is None
        assert out.failed_nodes == {"n": "1/1 ResourceQuotaNotFit"}
        assert cs.quota.used("team", "nvidia.com/gpumem") == 0


def test_X08_init_container_on_another_card_is_charged_as_collapsed():
    # Per card max(init, app): init 20000 on card 0 plus app 10000 on card 1 is 30000 charged.
    devs = cards("n", 2)
    view = NodeView("n", {"NVIDIA": devs}, {devs[1].uuid: DeviceUsage(1, 20000, 0)})
    containers = [
        ContainerSpec("init", ContainerKind.INIT, (ContainerRequest("NVIDIA", 1, memreq=20000),)),
        ContainerSpec("app", ContainerKind.APP, (ContainerRequest("NVIDIA", 1, memreq=10000),)),
    ]
    binpack = PolicyChoice(NodePolicy.BINPACK, (CardPolicy.BINPACK,))
    seen = []

    def under(limit):
        def check(vendor, mem, cores):
            seen.append(mem)
            return mem <= limit

        return check

    kw = dict(vendors=build_vendors(), selections={}, policy=binpack)
    ok = fit_pod(containers, view, quota=under(30000), **kw)
    assert ok.ok and [c[0].uuid for c in ok.devices["NVIDIA"]] == ["GPU-n-0", "GPU-n-1"]
    assert seen[-1] == 30000
    f = fit_pod(containers, view, quota=under(25000), **kw)
    assert not f.ok and f.reason_text() == "2/2 ResourceQuotaNotFit"


def test_X09_each_container_on_a_card_takes_one_slot():
    cs = state(node("n", cards("n", 1, count=2)))
    p = pod(ctr("a", gpu=1, mem=100), ctr("b", gpu=1, mem=100))
    out = cs.filter(p, ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == "GPU-n-0,NVIDIA,100,0:;GPU-n-0,NVIDIA,100,0:;"
    cs.upsert_pod(placed(p, out))
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (2, 200, 0)}
    rebuilt = ClusterState()
    rebuilt.rebuild([node("n", cards("n", 1, count=2))], [placed(p, out)])
    assert rebuilt.usage_snapshot() == cs.usage_snapshot()
    assert cs.filter(pod(ctr(gpu=1, mem=100)), ["n"]).failed_nodes == {"n": "1/1 CardTimeSlicingExhausted"}


def test_X10_concurrent_burst_never_exceeds_the_split_count():
    cs = state(*(node(f"n{i}", cards(f"n{i}", 4)) for i in range(2)))
    pods = [pod(ctr(gpu=1, mem=100, cores=1)) for _ in range(81)]
    with ThreadPoolExecutor(8) as ex:
        outs = list(ex.map(lambda p: cs.filter(p, ["n0", "n1"]), pods))
    assert sum(o.node is not None for o in outs) == 80
    assert [o.failed_nodes for o in outs if o.node is None] == [
        {"n0": "4/4 CardTimeSlicingExhausted", "n1": "4/4 CardTimeSlicingExhausted"}
    ]
    per_card = Counter(o.devices["NVIDIA"][0][0].uuid for o in outs if o.node)
    assert set(per_card.values()) == {10} and len(per_card) == 8
    assert {s.used for s in cs.card_stats()} == {10}


def test_X11_n_gpus_means_n_distinct_cards():
    cs = state(node("n", cards("n", 1, count=10)))
    out = cs.filter(pod(ctr(gpu=2, mem=1000)), ["n"])
    assert out.node is None and out.failed_nodes == {"n": "1/1 NodeInsufficientDevice"}
    cs = state(node("n", cards("n", 2, count=10)))
    out = cs.filter(pod(ctr(gpu=2, mem=1000)), ["n"])
    assert sorted(d.uuid for d in out.devices["NVIDIA"][0]) == ["GPU-n-0", "GPU-n-1"]


def test_X12_full_split_count_is_rejected_at_filter():
    t4 = cards("t4", 1, mem=15360, count=3, type="NVIDIA-Tesla T4")
    cs = state(node("t4", t4))
    for _ in range(3):
        assert cs.filter(pod(ctr(gpu=1, mem=1000)), ["t4"]).node == "t4"
    out = cs.filter(pod(ctr(gpu=1, mem=1000)), ["t4"])
    assert out.node is None and out.failed_nodes == {"t4": "1/1 CardTimeSlicingExhausted"}


def dcu_node(name, n=2):
    devs = [Device(f"DCU-{name}-{i}", i, 4, 16368, 100, "DCU-Z100", i, vendor="DCU") for i in range(n)]
    return {
        "metadata": {
            "name": name,
            "annotations": {"hami.io/node-dcu-register": encode_node_devices_colon(devs)},
        }
    }


def dcu_pod(policy):
    c = {"name": "c", "resources": {"limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "1000",
                                               "hygon.com/dcucores": "10"}}}  # fmt: skip
    return pod(c, annotations={"hami.io/gpu-scheduler-policy": policy})


@pytest.mark.parametrize(("policy", "cards_used"), [("binpack", 1), ("spread", 2)])
def test_X14_policy_direction_is_the_same_for_every_vendor(policy, cards_used):
    cs = state(dcu_node("d"))
    outs = [cs.filter(dcu_pod(policy), ["d"]) for _ in range(2)]
    assert [o.annotations["hami.io/dcu-devices-allocated"] for o in outs][0] == "DCU-d-0,DCU,1000,10:;"
    assert len({o.devices["DCU"][0][0].uuid for o in outs}) == cards_used
    cs = state(node("n", cards("n", 2)))
    nv = [cs.filter(pod(ctr(gpu=1, mem=1000, cores=10), annotations={"hami.io/gpu-scheduler-policy": policy}),
                    ["n"]) for _ in range(2)]  # fmt: skip
    assert len({o.devices["NVIDIA"][0][0].uuid for o in nv}) == cards_used


def test_X15_uuid_pin_is_honoured_and_a_misspelled_policy_is_reported():
    cs = state(node("n", cards("n", 4)))
    out = cs.filter(pod(ctr(gpu=1, mem=1000), annotations={"nvidia.com/use-gpuuuid": " GPU-n-3 "}), ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == "GPU-n-3,NVIDIA,1000,0:;"
    out = cs.filter(pod(ctr(gpu=1, mem=1000), annotations={"hami.io/gpu-scheduler-policy": "binpak"}), ["n"])
    assert out.node == "n"
    assert out.warnings == (
        "hami.io/gpu-scheduler-policy: unknown policy 'binpak'; valid: binpack, spread, numa, mutex, "
        "topology-aware, fragmentation or a comma chain of them such as 'binpack,numa'; using the default 'spread'",
    )
    assert out.policy.cards == (CardPolicy.SPREAD,)


@pytest.mark.parametrize(
    ("annotations", "reason"),
    [
        ({A.NVIDIA_REGISTER: '[{"id":"GPU-1","count":10,"devmem":"32768"}]'},
         "hami.io/node-nvidia-register: device 0 (GPU-1): field 'devmem' must be an integer, got '32768'"),
        ({A.NVIDIA_REGISTER: '[{"count":10}]'},
         "hami.io/node-nvidia-register: device 0: field 'id' must be a non-empty string"),
        ({"hami.io/node-dcu-register": "DCU-1,4,16368,100,DCU-Z100,0:"},
         "hami.io/node-dcu-register: device 0: 6 fields, want 7 (id,count,devmem,devcore,type,numa,health) "
         "or 9 (+index,mode)"),
    ],
    ids=["nvidia-devmem-string", "nvidia-no-id", "dcu-six-fields"],
)  # fmt: skip
def test_X17_malformed_registration_marks_the_node_unusable_without_crashing(annotations, reason):
    cs = ClusterState()
    assert cs.upsert_node({"metadata": {"name": "bad", "annotations": annotations}}) == reason
    cs.upsert_node(node("good", cards("good", 1)))
    out = cs.filter(pod(ctr(gpu=1, mem=1000)), ["bad", "good"])
    assert out.node == "good" and out.failed_nodes == {"bad": reason}


def test_X18_deleted_or_finished_pod_releases_its_cards():
    h100 = cards("h", 8, mem=81559, type="NVIDIA-H100-80GB-HBM3")
    cs = state(node("h", h100))
    first = pod(ctr(gpu=8, pct=100))
    q = placed(first, cs.filter(first, ["h"]))
    cs.upsert_pod(q)
    out = cs.filter(pod(ctr(gpu=8, pct=100)), ["h"])
    assert out.failed_nodes == {"h": "8/8 CardInsufficientMemory"}
    assert cs.remove_pod(q["metadata"]["uid"]) is True
    second = pod(ctr(gpu=8, pct=100))
    out = cs.filter(second, ["h"])
    assert out.node == "h" and cs.usage_snapshot()["h"]["GPU-h-7"] == (1, 81559, 0)
    # A rolling update: the old pod finishes (terminal phase), its replacement fits on the same cards.
    cs.upsert_pod(placed(second, out, phase="Succeeded"))
    assert cs.usage_snapshot()["h"] == {}
    assert cs.filter(pod(ctr(gpu=8, mem=40000)), ["h"]).node == "h"


# --- 1i quota ------------------------------------------------------------------------------------


def test_Q01_quota_counts_memory_and_cores_once_per_card():
    cs = state(node("n", cards("n", 4)))
    cs.upsert_quota(quota("team", **{"limits.nvidia.com/gpumem": "4096", "limits.nvidia.com/gpucores": "40"}))
    out = cs.filter(pod(ctr(gpu=2, mem=2048, cores=20), ns="team"), ["n"])
    assert out.node == "n"
    assert cs.quota.used("team", "nvidia.com/gpumem") == 4096
    assert cs.quota.used("team", "nvidia.com/gpucores") == 40
    assert cs.filter(pod(ctr(gpu=1, mem=1), ns="team"), ["n"]).failed_nodes == {
        "n": "4/4 ResourceQuotaNotFit"
    }


def test_Q01_a_multi_card_container_cannot_exceed_the_quota_per_card():
    cs = state(node("n", cards("n", 4)))
    cs.upsert_quota(quota("team", **{"limits.nvidia.com/gpumem": "4096"}))
    out = cs.filter(pod(ctr(gpu=2, mem=3000), ns="team"), ["n"])
    assert out.node is None
    assert out.failed_nodes == {"n": "1/4 AllocatedCardsInsufficientRequest, 3/4 ResourceQuotaNotFit"}
    assert cs.quota.used("team", "nvidia.com/gpumem") == 0


# --- W05: forged allocations (scheduler side) ------------------------------------------------------


def test_W05_forged_allocation_on_another_schedulers_pod_is_never_counted():
    cs = state(node("n", cards("n", 1)))
    forged = pod(ctr(gpu=1), scheduler="default-scheduler")
    forged["metadata"]["annotations"].update({A.BIND_PHASE: "allocating", A.BIND_TIME: "1715328930"})
    cs.upsert_pod(carrying(forged, "n", "GPU-n-0,NVIDIA,20000,100:;"))
    assert cs.usage_snapshot()["n"] == {}
    assert cs.filter(pod(ctr(gpu=1, mem=30000, cores=100)), ["n"]).node == "n"


# --- 1j sister projects -----------------------------------------------------------------------------


def test_S01_request_larger_than_the_card_stays_pending():
    cs = state(node("n", cards("n", 1, mem=7168)))
    out = cs.filter(pod(ctr(gpu=1, mem="8Gi")), ["n"])
    assert out.node is None and out.failed_nodes == {"n": "1/1 CardInsufficientMemory"}


# --- the filter's pre-check must not reject nodes the fit accepts ------------------------------------


def test_summary_precheck_does_not_merge_different_containers_demands():
    cs = state(node("n", cards("n", 2, mem=16384)))
    busy = pod(ctr(gpu=1, mem=8000, cores=10))
    cs.upsert_pod(carrying(busy, "n", "GPU-n-1,NVIDIA,8000,10:;"))
    # a: 2 small cards; b: 15000 MiB on one card. The fit places both (b on GPU-n-0).
    p = pod(ctr("a", gpu=2, mem=1000), ctr("b", gpu=1, mem=15000))
    out = cs.filter(p, ["n"])
    assert out.node == "n"
    assert out.annotations[A.NVIDIA_ALLOCATED] == (
        "GPU-n-0,NVIDIA,1000,0:GPU-n-1,NVIDIA,1000,0:;GPU-n-0,NVIDIA,15000,0:;"
    )


def test_numa_bind_with_a_bare_numa_policy_prefers_the_lowest_numa_group():
    # NUMA 0 is the busier group: a bare `numa` policy still takes it, `spread,numa` takes NUMA 1.
    devs = cards("n", 4, numa=[0, 0, 1, 1])
    view = NodeView("n", {"NVIDIA": devs}, {"GPU-n-0": DeviceUsage(1, 1000, 10)})
    r = ContainerRequest("NVIDIA", 2, memreq=1000)
    kw = dict(vendors=build_vendors(), selections={"NVIDIA": Selection(numa_bind=True)})
    got = {}
    for chain in ((CardPolicy.NUMA,), (CardPolicy.SPREAD, CardPolicy.NUMA), (CardPolicy.BINPACK,)):
        f = fit_pod(
            [ContainerSpec("c", ContainerKind.APP, (r,))],
            view,
            policy=PolicyChoice(NodePolicy.BINPACK, chain),
            **kw,
        )
        got[chain] = [d.uuid for d in f.devices["NVIDIA"][0]]
    assert got == {
        (CardPolicy.NUMA,): ["GPU-n-0", "GPU-n-1"],
        (CardPolicy.SPREAD, CardPolicy.NUMA): ["GPU-n-2", "GPU-n-3"],
        (CardPolicy.BINPACK,): ["GPU-n-0", "GPU-n-1"],
    }


# --- review findings beyond the bug log -------------------------------------------------------------


def test_every_vendor_key_has_one_entry_per_container_init_first():
    nv = node("m", cards("m", 1))
    nv["metadata"]["annotations"].update(dcu_node("m", 1)["metadata"]["annotations"])
    cs = state(nv)
    dcu = {"name": "d", "resources": {"limits": {"hygon.com/dcunum": "1", "hygon.com/dcumem": "2000"}}}
    p = pod(ctr("g", gpu=1, mem=1000, cores=10), dcu, init=[ctr("setup")])
    out = cs.filter(p, ["m"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == ";GPU-m-0,NVIDIA,1000,10:;;"
    assert out.annotations["hami.io/dcu-devices-allocated"] == ";;DCU-m-0,DCU,2000,100:;"
    assert out.annotations["hami.io/dcu-devices-to-allocate"] == ";;DCU-m-0,DCU,2000,100:;"


def test_finished_init_container_is_released_while_a_native_sidecar_runs():
    cs = state(node("n", cards("n", 1)))
    side = ctr("side", gpu=1, mem=1000, cores=10) | {"restartPolicy": "Always"}
    p = pod(ctr("a", gpu=1, mem=2000, cores=10), init=[ctr("init", gpu=1, mem=20000, cores=50), side])
    q = placed(p, cs.filter(p, ["n"]))
    q["status"]["initContainerStatuses"] = [
        {"name": "init", "state": {"terminated": {"exitCode": 0}}},
        {"name": "side", "state": {"running": {}}},
    ]
    cs.upsert_pod(q)
    assert cs.usage_snapshot()["n"] == {"GPU-n-0": (2, 3000, 20)}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"hygon": {"memoryFactor": 0}}, "hygon.memoryFactor: 0 is invalid; valid: an integer >= 1"),
        ({"nodeconfig": [{"name": "a", "devicememoryscaling": -1}]},
         "nodeconfig[a].devicememoryscaling: -1.0 is invalid; valid: a number > 0"),
        ({"nodeconfig": [{"name": "a", "devicecorescaling": -2}]},
         "nodeconfig[a].devicecorescaling: -2.0 is invalid; valid: a number > 0"),
    ],
    ids=["hygon-memory-factor-0", "node-memory-scaling-negative", "node-core-scaling-negative"],
)  # fmt: skip
def test_config_rejects_factors_that_would_zero_or_negate_capacity(data, message):
    from hami.config import load_config
    from hami.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(data)
    assert str(e.value) == message


def test_init_container_after_a_native_sidecar_is_fitted_next_to_it():
    # Kubernetes starts a sidecar before the init containers that follow it; both hold the card at once.
    side = ContainerSpec(
        "side", ContainerKind.SIDECAR, (ContainerRequest("NVIDIA", 1, memreq=20000, coresreq=10),)
    )
    init = ContainerSpec(
        "init", ContainerKind.INIT, (ContainerRequest("NVIDIA", 1, memreq=20000, coresreq=30),)
    )
    app = ContainerSpec("app", ContainerKind.APP, (ContainerRequest("NVIDIA", 1, memreq=1000, coresreq=10),))
    kw = dict(
        vendors=build_vendors(), selections={}, policy=PolicyChoice(NodePolicy.BINPACK, (CardPolicy.SPREAD,))
    )
    one = NodeView("n", {"NVIDIA": cards("n", 1)}, {})
    f = fit_pod([side, init, app], one, **kw)
    assert not f.ok and f.reason_text() == "1/1 CardInsufficientMemory"
    two = NodeView("n", {"NVIDIA": cards("n", 2)}, {})
    f = fit_pod([side, init, app], two, **kw)
    assert [c[0].uuid for c in f.devices["NVIDIA"]] == ["GPU-n-0", "GPU-n-1", "GPU-n-1"]
    # Declared before the sidecar, an init container runs alone and may share its card.
    f = fit_pod([init, side, app], one, **kw)
    assert f.ok
    grants = collapse_grants(f.devices, [ContainerKind.INIT, ContainerKind.SIDECAR, ContainerKind.APP])
    assert [(g.usedmem, g.usedcores, g.slots) for g in grants] == [(21000, 30, 2)]
    # After the sidecar: the init peak includes the sidecar on the same card.
    devs = {
        "NVIDIA": [
            [ContainerDevice("GPU-x", "NVIDIA", 1000, 10)],
            [ContainerDevice("GPU-x", "NVIDIA", 20000, 30)],
            [],
        ]
    }
    grants = collapse_grants(devs, [ContainerKind.SIDECAR, ContainerKind.INIT, ContainerKind.APP])
    assert [(g.usedmem, g.usedcores, g.slots) for g in grants] == [(21000, 40, 2)]


def test_blank_policy_annotations_mean_default_without_a_warning():
    from hami.scoring import choose_policies

    blank = {
        "hami.io/node-scheduler-policy": "",
        "hami.io/gpu-scheduler-policy": " ",
        "hami.io/device-scoring-weights": "",
    }
    c = choose_policies(blank, node_default="spread", card_default="binpack,numa")
    assert (c.node, c.cards, c.warnings) == (NodePolicy.SPREAD, (CardPolicy.BINPACK, CardPolicy.NUMA), ())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("DCU-1,4,-16368,100,DCU-Z100,0,true:", "device 0: field 'devmem' must be >= 0, got -16368"),
        ("DCU-1,4,16368,100,DCU-Z100,0,true,-1,hami-core:", "device 0: field 'index' must be >= 0, got -1"),
        (",4,16368,100,DCU-Z100,0,true:", "device 0: empty id"),
    ],
)
def test_colon_registration_rejects_negative_capacity_like_the_json_form(value, message):
    with pytest.raises(A.AnnotationError) as e:
        decode_node_devices_colon(value, vendor="DCU")
    assert str(e.value) == message


def test_unusable_quota_value_is_logged_not_silently_dropped(caplog):
    cs = ClusterState()
    with caplog.at_level("WARNING", logger="hami.quota"):
        cs.upsert_quota(
            quota("team", **{"limits.nvidia.com/gpumem": "1500m", "limits.nvidia.com/gpucores": "50"})
        )
    assert cs.quota.limit("team", "nvidia.com/gpumem") is None
    assert cs.quota.limit("team", "nvidia.com/gpucores") == 50
    assert caplog.messages == [
        "ResourceQuota team/gpu: limits.nvidia.com/gpumem not enforced: "
        "limits.nvidia.com/gpumem: '1500m' is not a whole number of MiB"
    ]


def test_huge_exponent_is_an_error_not_a_hang():
    from hami.errors import InvalidRequest
    from hami.quantity import to_mib

    with pytest.raises(InvalidRequest) as e:
        to_mib("1e999999999", resource="nvidia.com/gpumem")
    assert str(e.value) == "nvidia.com/gpumem: '1e999999999' is out of range (exponent beyond +-30)"


def test_zero_core_task_is_refused_on_an_overbooked_card():
    # Cores booked beyond the card (annotations from an older, larger devcore): the core check refuses.
    devs = cards("n", 1)
    view = NodeView("n", {"NVIDIA": devs}, {"GPU-n-0": DeviceUsage(2, 1000, 120)})
    f = fit_pod(
        [ContainerSpec("c", ContainerKind.APP, (ContainerRequest("NVIDIA", 1, memreq=100),))],
        view,
        vendors=build_vendors(),
        selections={},
        policy=PolicyChoice(NodePolicy.BINPACK, (CardPolicy.SPREAD,)),
    )
    assert f.reason_text() == "1/1 CardInsufficientCore"


def test_X03_container_without_enforcement_is_not_co_located():
    cs = state(node("n", cards("n", 1)))
    free = ctr("a", gpu=1, mem=4096) | {"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}
    out = cs.filter(pod(free), ["n"])
    assert out.annotations[A.NVIDIA_ALLOCATED] == "GPU-n-0,NVIDIA,4096,100:;"
    assert cs.filter(pod(ctr("b", gpu=1, mem=4096)), ["n"]).failed_nodes == {
        "n": "1/1 CardComputeUnitsExhausted"
    }
    # The other order: it needs an idle card. "false" (by value) keeps enforcement on and shares.
    cs = state(node("n", cards("n", 1)))
    assert cs.filter(pod(ctr("b", gpu=1, mem=4096)), ["n"]).node == "n"
    assert cs.filter(pod(free), ["n"]).failed_nodes == {"n": "1/1 ExclusiveDeviceAllocateConflict"}
    on = ctr("c", gpu=1, mem=4096) | {"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "false"}]}
    assert cs.filter(pod(on), ["n"]).annotations[A.NVIDIA_ALLOCATED] == "GPU-n-0,NVIDIA,4096,0:;"
