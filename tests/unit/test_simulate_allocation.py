"""What a replay reports its cards hold: allocation by cores, memory and slots, the capacity taken (per
card the largest of the three) as the headline, per vendor family, the failed pods and their GPU demand,
cordoned nodes apart from the most fragmented ones, and the ideal line from the start state."""

from __future__ import annotations

import json

import pytest

from hami import annotations as A
from hami.config import DeviceConfig
from hami.simulate.allocation import card_figures, families
from hami.simulate.engine import Mode, Policy, run
from hami.simulate.plots import ideal_line
from hami.simulate.report import result_json, summary_text
from hami.simulate.workload import DEFAULT_GPU_MODELS, SimNode, SimPod, Workload, gpu_node, openb_pod
from tests.vendor_fleet import ASCEND_910B3, CONFIG

CFG = DeviceConfig()
BINPACK = Policy("binpack", "binpack")


def t4_node(name: str, gpus: int = 1, **extra) -> SimNode:
    n = gpu_node(name, cpu_milli=16000, memory_mib=65536, gpus=gpus, model="T4", card_mib=15360, config=CFG)
    if extra:
        n = SimNode(n.name, n.cpu_milli, n.memory_mib, n.max_pods, {**n.obj, **extra}, n.cards)
    return n


def mem_pod(name: str, mib: int, demand: float, vendor_limits: dict[str, str] | None = None) -> SimPod:
    """A pod as HAMi users write one: `nvidia.com/gpumem` only, no `gpucores`."""
    limits = vendor_limits or {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(mib)}
    obj = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "annotations": {}},
        "spec": {"containers": [{"name": "main", "resources": {
            "requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": limits}}]},
    }  # fmt: skip
    return SimPod(name, 1000, 1024, demand, obj)


def test_memory_only_pods_take_the_capacity_their_memory_binds():
    # One T4 (15360 MiB): two 7680 MiB pods take all its memory and none of its cores; the third fails.
    w = Workload([t4_node("n")], [mem_pod("half", 7680, 0.5)], nodes_source="n", pods_source="p")
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=150, seed=0)
    assert (r.scheduled, r.failed, r.failed_gpu_pods) == (2, 1, 1)
    assert (r.capacity_allocation_ratio, r.gpu_allocation_ratio, r.memory_allocation_ratio) == (1.0, 0.0, 1.0)
    assert r.slot_allocation_ratio == 0.2  # 2 of the card's 10 sharer slots
    assert r.failed_gpu_demand == 0.5
    j = result_json(r, w)
    assert (j["capacity_allocation_ratio"], j["gpu_allocation_ratio"]) == (1.0, 0.0)
    assert (j["failed_gpu_demand"], j["failed_gpu_demand_pct"]) == (0.5, 50.0)
    assert j["per_family"]["nvidia"]["capacity_allocation_ratio"] == 1.0
    row = summary_text([r], w).splitlines()[6].split()
    # policy, pods, scheduled, failed, GPU pods failed, failed demand, capacity, cores, memory, slots
    assert row[:10] == ["binpack", "3", "2", "1", "1", "50.0%", "100.00%", "0.00%", "100.00%", "20.00%"]
    # the incremental figures are the core's own
    figures, per_model, per_family = card_figures(r.state, families(r.state.vendors))
    assert (figures.capacity, figures.cores, figures.memory, figures.slots) == (1.0, 0.0, 1.0, 0.2)
    assert per_model == r.per_model and per_family == r.per_family


def test_slots_bind_a_card_of_tiny_shares():
    # Ten 5 % shares take every sharer slot of the card: it takes no further pod.
    common = {"memory_mib": 1024, "config": CFG, "gpu_models": DEFAULT_GPU_MODELS, "gpu_spec": []}
    tiny = openb_pod("tiny", cpu_milli=100, num_gpu=1, gpu_milli=50, **common)
    w = Workload([t4_node("n")], [tiny], nodes_source="n", pods_source="p")
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=52, seed=0)  # 11 pods
    assert (r.scheduled, r.failed) == (10, 1)
    assert (r.slot_allocation_ratio, r.capacity_allocation_ratio) == (1.0, 1.0)
    assert r.gpu_allocation_ratio == pytest.approx(0.5)


def ascend_node(name: str) -> SimNode:
    obj = {"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": name, "annotations": {"hami.io/node-register-Ascend910B3": ASCEND_910B3}},
           "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}  # fmt: skip
    from hami.vendors import build_vendors

    cards = tuple(build_vendors(CONFIG)["Ascend910B3"].node_devices(obj))
    return SimNode(name, 64000, 262144, 110, obj, cards)


def test_a_mixed_fleet_reports_each_vendor_family():
    # Whole Ascend chips (vNPU template mode) hold all their memory and no cores: the chips are taken.
    nodes = [t4_node("gpu"), ascend_node("npu")]
    npu = mem_pod("npu", 0, 0.2, {"huawei.com/Ascend910B3": "1"})
    w = Workload(nodes, [npu], nodes_source="n", pods_source="p")
    r = run(w, config=CONFIG, policy=BINPACK, mode=Mode.FILL, arrival=35, seed=0)
    assert r.scheduled == 2
    npus = r.per_family["ascend"]
    assert (npus.cards, npus.usedcores, npus.taken) == (2, 0, 2.0)
    assert r.per_family["nvidia"].taken == 0.0
    assert r.capacity_allocation_ratio == pytest.approx(2 / 3)
    text = summary_text([r], w)
    assert "allocation per vendor family (at the end):" in text
    fam = [x.split() for x in text.splitlines() if x.startswith("binpack ") and " ascend " in x]
    assert fam == [["binpack", "ascend", "2", "100.00%", "0.00%", "100.00%", "14.29%"]]  # 2 of 14 slots
    assert (
        json.loads(json.dumps(result_json(r, w)))["per_family"]["ascend"]["capacity_allocation_ratio"] == 1.0
    )


def test_cordoned_nodes_are_shown_apart_from_the_most_fragmented():
    # "closed" is cordoned: all its free capacity counts as fragmented, yet no pod can go there.
    nodes = [t4_node("open", 2), t4_node("closed", 2, spec={"unschedulable": True})]
    common = {"memory_mib": 1024, "config": CFG, "gpu_models": DEFAULT_GPU_MODELS, "gpu_spec": []}
    w = Workload(nodes, [openb_pod("p", cpu_milli=1000, num_gpu=1, gpu_milli=300, **common)],
                 nodes_source="n", pods_source="p")  # fmt: skip
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=60, seed=0)
    closed = next(x for x in r.node_fragmentation if x.node == "closed")
    assert closed.cordoned and closed.fragmented == closed.free == 2.0
    nodes_json = result_json(r, w)["fragmentation"]["nodes"]
    assert [x["node"] for x in nodes_json["top"]] == ["open"]
    assert nodes_json["cordoned"]["nodes"] == 1 and nodes_json["cordoned"]["top"][0]["node"] == "closed"
    lines = summary_text([r], w).splitlines()
    at = lines.index("most fragmented nodes, binpack (at the end of the run):")
    table = lines[at + 3 :]
    assert table[0].split()[0] == "open"
    assert any(x.startswith("  cordoned (take no new pod, left out above): 1 nodes, 2.00 free cards: closed")
               for x in table)  # fmt: skip


def test_cards_cordoned_by_annotation_are_free_capacity_no_pod_can_use():
    n = t4_node("n", 2)
    n.obj["metadata"]["annotations"][A.DEVICE_CORDON] = n.cards[1].uuid
    w = Workload([n], [mem_pod("m", 1024, 0.1)], nodes_source="n", pods_source="p")
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=5, seed=0)
    (row,) = r.node_fragmentation
    # the pod takes 1 of the first card's 10 slots (more than its 1024 of 15360 MiB)
    assert row.free == pytest.approx(2.0 - 0.1, abs=1e-6)
    assert row.fragmented >= 1.0  # at least the cordoned card


def test_the_ideal_line_starts_from_the_pods_already_placed():
    import yaml

    from hami.model import ContainerDevice
    from hami.simulate import kubeyaml
    from hami.simulate.start import split

    nodes = [t4_node("n0", 2)]
    held = {
        "kind": "Pod",
        "metadata": {"name": "held", "namespace": "default", "annotations": {
            A.NVIDIA_ALLOCATED: A.encode_pod_devices([[ContainerDevice(nodes[0].cards[0].uuid, "NVIDIA", 15360, 0)]]),
            A.ASSIGNED_NODE: "n0"}},
        "spec": {"schedulerName": CFG.scheduler.schedulerName, "nodeName": "n0", "containers": [{
            "name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip
    placed, _ = split(kubeyaml.load_pods("p.yaml", config=CFG, text=yaml.safe_dump(held)), CFG)
    w = Workload(nodes, [mem_pod("m", 7680, 0.5)], nodes_source="n", pods_source="p")
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=100, seed=0, placed=placed)
    # one of the two cards is held (all its memory, no cores): half the capacity taken before any arrival
    assert r.start_allocation.capacity == 0.5 and r.start_allocation.cores == 0.0
    assert ideal_line(50.0, 130.0) == ([0.0, 50.0, 130.0], [50.0, 100.0, 100.0])
    assert ideal_line(0.0, 130.0) == ([0.0, 100.0, 130.0], [0.0, 100.0, 100.0])
    assert r.capacity_allocation_ratio == 1.0  # the two arrivals fill the other card
