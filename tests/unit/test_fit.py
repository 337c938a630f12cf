from collections import Counter

import pytest

from hami.cluster import ClusterState
from hami.fit import NodeFit, NodeView, fit_pod
from hami.model import ContainerDevice, ContainerRequest, DeviceUsage, Selection
from hami.pods import ContainerKind, ContainerSpec, collapse_grants
from hami.reason_words import Reason
from hami.scoring import CardPolicy, NodePolicy, PolicyChoice
from hami.vendors import build_vendors
from tests.builders import cards, ctr, node, pod

VENDORS = build_vendors()
SPREAD = PolicyChoice(node=NodePolicy.BINPACK, cards=(CardPolicy.SPREAD,))
BINPACK = PolicyChoice(node=NodePolicy.BINPACK, cards=(CardPolicy.BINPACK,))


def req(nums=1, mem=0, pct=101, cores=0):
    return ContainerRequest(vendor="NVIDIA", nums=nums, memreq=mem, mem_percentage=pct, coresreq=cores)


def one(r, **kw):
    return [ContainerSpec("c", ContainerKind.APP, (r,))]


def fit(containers, devices, usage=None, policy=SPREAD, selection=None, **kw) -> NodeFit:
    view = NodeView("n", {"NVIDIA": devices}, usage or {}, **kw)
    return fit_pod(
        containers, view, vendors=VENDORS, selections={"NVIDIA": selection or Selection()}, policy=policy
    )


def test_failure_text_counts_per_card_reasons_sorted():
    devs = cards("n", 4)
    usage = {devs[0].uuid: DeviceUsage(1, 30000, 10)} | {d.uuid: DeviceUsage(10, 100, 10) for d in devs[1:]}
    f = fit(one(req(mem=8000)), devs, usage)
    assert not f.ok
    assert f.reason_text() == "1/4 CardInsufficientMemory, 3/4 CardTimeSlicingExhausted"


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        (dict(devices=cards("n", 1, health=False)), Reason.CARD_NOT_HEALTH),
        (dict(cordoned=frozenset({"GPU-n-0"})), Reason.CARD_CORDONED),
        (dict(selection=Selection(use_types=("A100",))), Reason.CARD_TYPE_MISMATCH),
        (dict(selection=Selection(nouse_types=("v100",))), Reason.CARD_TYPE_MISMATCH),
        (dict(selection=Selection(mode="mig")), Reason.CARD_TYPE_MISMATCH),
        (dict(selection=Selection(use_uuids=("GPU-other",))), Reason.CARD_UUID_MISMATCH),
        (dict(selection=Selection(nouse_uuids=("GPU-n-0",))), Reason.CARD_UUID_MISMATCH),
        (dict(usage={"GPU-n-0": DeviceUsage(10, 0, 0)}), Reason.CARD_TIME_SLICING_EXHAUSTED),
        (dict(usage={"GPU-n-0": DeviceUsage(1, 0, 0)}, policy=PolicyChoice(NodePolicy.BINPACK, (CardPolicy.MUTEX,))),
         Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),
        (dict(usage={"GPU-n-0": DeviceUsage(1, 30000, 0)}), Reason.CARD_INSUFFICIENT_MEMORY),
        (dict(usage={"GPU-n-0": DeviceUsage(1, 0, 95)}), Reason.CARD_INSUFFICIENT_CORE),
        (dict(usage={"GPU-n-0": DeviceUsage(1, 0, 100)}, request=req(mem=10, cores=0)), Reason.CARD_COMPUTE_UNITS_EXHAUSTED),
        (dict(usage={"GPU-n-0": DeviceUsage(1, 0, 0)}, request=req(mem=10, cores=100)), Reason.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT),
        (dict(request=req(nums=2)), Reason.NODE_INSUFFICIENT_DEVICE),
    ],
    ids=["unhealthy", "cordoned", "use-type", "nouse-type", "mig-mode", "use-uuid", "nouse-uuid", "slices-exhausted", "mutex-busy", "memory", "core", "compute-units", "exclusive-busy", "too-few-cards"],
)  # fmt: skip
def test_every_card_reason(setup, reason):
    devices = setup.pop("devices", cards("n", 1))
    r = setup.pop("request", req(mem=8000, cores=10))
    f = fit(one(r), devices, **setup)
    assert not f.ok
    assert f.reasons == Counter({reason: 1})
    assert f.reason_text() == f"1/1 {reason.value}"


def test_checks_run_in_hami_order_health_before_memory():
    devs = cards("n", 1, health=False)
    f = fit(one(req(mem=10**6)), devs)
    assert f.reason_text() == "1/1 CardNotHealth"


def test_quota_reason():
    devs = cards("n", 2)
    view = NodeView("n", {"NVIDIA": devs}, {})
    f = fit_pod(one(req(mem=8000)), view, vendors=VENDORS, selections={}, policy=SPREAD,
                quota=lambda vendor, mem, cores: mem <= 4000)  # fmt: skip
    assert f.reason_text() == "2/2 ResourceQuotaNotFit"


def test_numa_bind_groups_and_reports_numa_not_fit():
    devs = cards("n", 3, numa=[0, 1, 1])
    sel = Selection(numa_bind=True)
    f = fit(one(req(nums=2, mem=1000)), devs, selection=sel)
    assert f.ok
    assert {d.uuid for d in f.devices["NVIDIA"][0]} == {"GPU-n-1", "GPU-n-2"}
    f = fit(one(req(nums=2, mem=1000)), cards("n", 2, numa=[0, 1]), selection=sel)
    assert not f.ok
    assert f.reason_text() == "2/2 NumaNotFit"


def test_numa_bind_under_spread_prefers_idle_numa_group():
    # HAMi groups by NUMA first and would fill NUMA 0 although it is busy; utilisation must win under spread.
    devs = cards("n", 4, numa=[0, 0, 1, 1])
    usage = {"GPU-n-0": DeviceUsage(3, 20000, 60), "GPU-n-1": DeviceUsage(3, 20000, 60)}
    f = fit(one(req(nums=2, mem=1000, cores=10)), devs, usage, selection=Selection(numa_bind=True))
    assert {d.uuid for d in f.devices["NVIDIA"][0]} == {"GPU-n-2", "GPU-n-3"}
    f = fit(
        one(req(nums=2, mem=1000, cores=10)), devs, usage, policy=BINPACK, selection=Selection(numa_bind=True)
    )
    assert {d.uuid for d in f.devices["NVIDIA"][0]} == {"GPU-n-0", "GPU-n-1"}


def test_allocated_cards_insufficient_request():
    devs = cards("n", 3)
    usage = {"GPU-n-0": DeviceUsage(10, 0, 0)}
    f = fit(one(req(nums=3, mem=1000)), devs, usage)
    assert f.reason_text() == "1/3 CardTimeSlicingExhausted, 2/3 AllocatedCardsInsufficientRequest"


def test_multi_gpu_container_gets_distinct_cards_and_percentage_memory():
    devs = cards("n", 4, mem=16384)
    f = fit(one(req(nums=3, pct=50, cores=20)), devs)
    got = f.devices["NVIDIA"][0]
    assert len({d.uuid for d in got}) == 3
    assert all(d.usedmem == 8192 and d.usedcores == 20 and d.type == "NVIDIA" for d in got)


def test_containers_share_a_card_one_slot_each():
    devs = cards("n", 1, count=2)
    containers = [ContainerSpec(f"c{i}", ContainerKind.APP, (req(mem=1000, cores=10),)) for i in range(2)]
    f = fit(containers, devs)
    assert [c[0].uuid for c in f.devices["NVIDIA"]] == ["GPU-n-0", "GPU-n-0"]
    containers.append(ContainerSpec("c2", ContainerKind.APP, (req(mem=1000, cores=10),)))
    f = fit(containers, devs)
    assert f.reason_text() == "1/1 CardTimeSlicingExhausted"


def test_init_containers_fit_on_fresh_usage_and_collapse_to_peak():
    devs = cards("n", 1)
    containers = [
        ContainerSpec("init", ContainerKind.INIT, (req(mem=30000, cores=50),)),
        ContainerSpec("a", ContainerKind.APP, (req(mem=20000, cores=40),)),
        ContainerSpec("b", ContainerKind.APP, (req(mem=10000, cores=40),)),
    ]
    f = fit(containers, devs)
    assert f.ok
    (g,) = collapse_grants(f.devices, [c.kind for c in containers])
    assert (g.usedmem, g.usedcores, g.slots) == (30000, 80, 2)


def test_sidecar_counts_with_app_containers():
    devs = cards("n", 1)
    containers = [
        ContainerSpec("side", ContainerKind.SIDECAR, (req(mem=20000, cores=10),)),
        ContainerSpec("a", ContainerKind.APP, (req(mem=20000, cores=10),)),
    ]
    f = fit(containers, devs)
    assert f.reason_text() == "1/1 CardInsufficientMemory"


def test_exclusive_card_needs_idle_card():
    devs = cards("n", 2)
    usage = {"GPU-n-0": DeviceUsage(1, 100, 5)}
    f = fit(one(req(cores=100, pct=100)), devs, usage)
    assert [d.uuid for d in f.devices["NVIDIA"][0]] == ["GPU-n-1"]
    assert f.devices["NVIDIA"][0][0] == ContainerDevice("GPU-n-1", "NVIDIA", 32768, 100)


def test_card_policy_order_binpack_vs_spread():
    devs = cards("n", 3)
    usage = {"GPU-n-1": DeviceUsage(2, 16000, 40), "GPU-n-2": DeviceUsage(1, 4000, 10)}
    assert (
        fit(one(req(mem=1000, cores=10)), devs, usage, policy=BINPACK).devices["NVIDIA"][0][0].uuid
        == "GPU-n-1"
    )
    assert (
        fit(one(req(mem=1000, cores=10)), devs, usage, policy=SPREAD).devices["NVIDIA"][0][0].uuid
        == "GPU-n-0"
    )


def test_topology_aware_picks_best_connected_pair():
    devs = cards("n", 4)
    scores = {
        "GPU-n-0": {"GPU-n-1": 10, "GPU-n-2": 10, "GPU-n-3": 10},
        "GPU-n-1": {"GPU-n-0": 10, "GPU-n-2": 200, "GPU-n-3": 10},
        "GPU-n-2": {"GPU-n-0": 10, "GPU-n-1": 200, "GPU-n-3": 10},
        "GPU-n-3": {"GPU-n-0": 10, "GPU-n-1": 10, "GPU-n-2": 10},
    }
    topo = PolicyChoice(NodePolicy.BINPACK, (CardPolicy.TOPOLOGY_AWARE,))
    f = fit(one(req(nums=2, mem=1000)), devs, policy=topo, pair_scores=scores)
    assert {d.uuid for d in f.devices["NVIDIA"][0]} == {"GPU-n-1", "GPU-n-2"}
    # One card: keep the well-connected ones free. GPU-n-0 and GPU-n-3 tie (30 each); the tie goes to
    # the card the card order prefers: the lower index on idle cards ...
    f = fit(one(req(nums=1, mem=1000)), devs, policy=topo, pair_scores=scores)
    assert f.devices["NVIDIA"][0][0].uuid == "GPU-n-0"
    # ... and, in a chain, the card the utilisation policy prefers once GPU-n-0 is busier.
    usage = {"GPU-n-0": DeviceUsage(1, 1000, 10)}
    for first, winner in ((CardPolicy.SPREAD, "GPU-n-3"), (CardPolicy.BINPACK, "GPU-n-0")):
        chain = PolicyChoice(NodePolicy.BINPACK, (first, CardPolicy.TOPOLOGY_AWARE))
        f = fit(one(req(nums=1, mem=1000)), devs, usage, policy=chain, pair_scores=scores)
        assert f.devices["NVIDIA"][0][0].uuid == winner, first


def test_cordon_annotation_and_use_gputype_through_cluster_state():
    cs = ClusterState()
    cs.upsert_node(node("a", cards("a", 2), **{"hami.io/device-cordon": "GPU-a-0, GPU-a-1"}))
    cs.upsert_node(node("b", cards("b", 1, type="NVIDIA-A100-SXM4-80GB", mem=81920)))
    out = cs.filter(pod(ctr(gpu=1, mem=1000)), ["a"])
    assert out.node is None and out.failed_nodes == {"a": "2/2 CardCordoned"}
    out = cs.filter(pod(ctr(gpu=1, mem=1000), annotations={"nvidia.com/use-gputype": "a100"}), ["a", "b"])
    assert out.node == "b"
