"""hami.simulate.start (which pods are already placed, the start state) and hami.simulate.whatif (the shape
grammar, the count per policy), on hand-built nodes and pods."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from hami import annotations as A
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.model import ContainerDevice
from hami.simulate import kubeyaml, whatif
from hami.simulate.engine import Mode, Policy, card_allocation, run
from hami.simulate.start import Placed, begin, placed_node, split, summarise
from hami.simulate.whatif import parse_shape, pod_cap, what_if
from hami.simulate.workload import DEFAULT_GPU_MODELS, SimPod, Workload, gpu_node

CFG = DeviceConfig()
T4 = DEFAULT_GPU_MODELS["T4"]  # 15360 MiB


def nodes(n: int = 2, gpus: int = 2) -> list[Any]:
    return [
        gpu_node(f"n{i}", cpu_milli=8000, memory_mib=65536, gpus=gpus, model="T4", card_mib=T4, config=CFG)
        for i in range(n)
    ]


def pod_obj(name: str, *, node: str | None = None, cards: list[tuple[str, int, int]] | None = None,
            phase: str | None = None, bind_phase: str | None = None, bound: bool = True,
            deleting: bool = False, cpu: str = "2") -> dict[str, Any]:  # fmt: skip
    annos: dict[str, str] = {}
    if cards is not None:
        annos[A.NVIDIA_ALLOCATED] = A.encode_pod_devices(
            [[ContainerDevice(u, "NVIDIA", m, c) for u, m, c in cards]]
        )
        annos[A.ASSIGNED_NODE] = node or ""
    if bind_phase is not None:
        annos[A.BIND_PHASE] = bind_phase
    meta: dict[str, Any] = {"name": name, "namespace": "default", "annotations": annos}
    if deleting:
        meta["deletionTimestamp"] = "2026-05-04T10:00:00Z"
    spec: dict[str, Any] = {
        "schedulerName": CFG.scheduler.schedulerName,
        "containers": [{"name": "c", "resources": {
            "limits": {"nvidia.com/gpu": str(max(1, len(cards or []))), "nvidia.com/gpumem": "4000",
                       "nvidia.com/gpucores": "25"},
            "requests": {"cpu": cpu, "memory": "1Gi"}}}],
    }  # fmt: skip
    if node is not None and bound:
        spec["nodeName"] = node
    obj = {"kind": "Pod", "metadata": meta, "spec": spec}
    if phase is not None:
        obj["status"] = {"phase": phase}
    return obj


def load(*objs: dict[str, Any]) -> list[SimPod]:
    return kubeyaml.load_pods(
        "pods.yaml", config=CFG, text=yaml.safe_dump({"kind": "List", "items": list(objs)})
    )


def test_which_pods_are_placed() -> None:
    card = [("n0-gpu0", 4000, 25)]
    assert placed_node(pod_obj("running", node="n0", cards=card, phase="Running")) == "n0"
    # Bound by kube-scheduler or another scheduler: on its node even without HAMi's annotations.
    assert placed_node(pod_obj("cpu-only", node="n1")) == "n1"
    # Being bound: the extender holds the cards before spec.nodeName is set.
    assert (
        placed_node(pod_obj("binding", node="n0", cards=card, bind_phase="allocating", bound=False)) == "n0"
    )
    assert placed_node(pod_obj("bound", node="n0", cards=card, bind_phase="success", bound=False)) == "n0"
    # Filtered, not bound yet (no bind phase), or refused by the device plugin: not placed.
    assert placed_node(pod_obj("filtered", node="n0", cards=card, bound=False)) is None
    assert placed_node(pod_obj("refused", node="n0", cards=card, bind_phase="failed", bound=False)) is None
    for phase in ("Succeeded", "Failed"):
        assert placed_node(pod_obj("done", node="n0", cards=card, phase=phase)) is None
    assert placed_node(pod_obj("going", node="n0", cards=card, deleting=True)) is None
    assert placed_node(pod_obj("pending", phase="Pending")) is None


def test_split_keeps_every_pod_as_a_shape_without_its_placement() -> None:
    loaded = load(
        pod_obj("a", node="n0", cards=[("n0-gpu0", 4000, 25)], phase="Running", bind_phase="success"),
        pod_obj("b", phase="Pending"),
    )
    placed, shapes = split(loaded, CFG)
    assert [(n, p.name) for n, p in placed] == [("n0", "a")]
    assert A.NVIDIA_ALLOCATED in placed[0][1].obj["metadata"]["annotations"]  # the state reads it
    assert [p.name for p in shapes] == ["a", "b"]
    a = shapes[0].obj
    assert "nodeName" not in a["spec"] and "status" not in a
    assert not set(a["metadata"]["annotations"]) & {A.NVIDIA_ALLOCATED, A.ASSIGNED_NODE, A.BIND_PHASE}
    assert (shapes[0].cpu_milli, shapes[0].gpu_demand) == (2000, 0.25)


def test_the_replay_counts_the_placed_pods_on_cards_cpu_and_slots() -> None:
    ns = nodes()
    uuid = ns[0].cards[0].uuid
    held = load(
        pod_obj("held", node="n0", cards=[(uuid, 12000, 75)], phase="Running", cpu="7"),
        pod_obj("elsewhere", node="gone", cards=[("gone-gpu0", 1000, 10)], phase="Running"),
    )
    placed, _ = split(held, CFG)
    start = summarise(ns, placed, config=CFG, source="pods.yaml")
    # 75 % of 400 %; 12000 of 4 x 15360 MiB; the pod on a node not in the input is skipped.
    assert (start.pods, start.skipped, start.card_pods, start.cards_used, start.cards) == (1, 1, 1, 1, 4)
    assert start.gpu_allocation_ratio == pytest.approx(75 / 400)
    assert start.memory_allocation_ratio == pytest.approx(12000 / (4 * T4))
    assert "1 placed pods skipped (their node is not in the input)" in start.text()
    # Pods of 4000 MiB / 25 % / 2 CPUs: n0 has 1 CPU left (8 - 7), so none goes there, n1 takes 4
    # (8 CPUs); with empty cards n0 takes 4 more.
    shape = parse_shape("nvidia.com/gpu=1,nvidia.com/gpumem=4000,nvidia.com/gpucores=25,cpu=2", config=CFG)
    r = run(Workload(ns, [shape.pod]), config=CFG, policy=Policy("binpack", "binpack"), mode=Mode.FILL,
            arrival=float("inf"), placed=placed, max_pods=100, stop_at_failure=True)  # fmt: skip
    assert (r.scheduled, r.failed) == (4, 1) and r.failure_reasons == {"Insufficient cpu/memory": 1}
    assert r.state is not None
    on_n0 = [s for s in r.state.card_stats() if s.node == "n0"]
    assert [(s.usedmem, s.usedcores, s.used) for s in on_n0] == [(12000, 75, 1), (0, 0, 0)]
    # The engine's incremental figures (placed pods included) are the core's own view.
    gpu, mem, _ = card_allocation(r.state)
    assert (r.gpu_allocation_ratio, r.memory_allocation_ratio) == (pytest.approx(gpu), pytest.approx(mem))
    assert gpu == pytest.approx((75 + 4 * 25) / 400)
    r = run(Workload(ns, [shape.pod]), config=CFG, policy=Policy("binpack", "binpack"), mode=Mode.FILL,
            arrival=float("inf"), max_pods=100, stop_at_failure=True)  # fmt: skip
    assert r.scheduled == 8


def test_arrivals_resampled_from_a_placed_pod_never_take_its_name() -> None:
    ns = nodes()
    uuid = ns[0].cards[0].uuid
    placed, shapes = split(load(pod_obj("nb", node="n0", cards=[(uuid, 1000, 10)], phase="Running")), CFG)
    r = run(Workload(ns, shapes), config=CFG, policy=Policy("binpack", "binpack"), mode=Mode.FILL,
            arrival=30, placed=placed, placements=True)  # fmt: skip
    names = [p.pod for p in r.placements]
    assert names[:3] == ["nb-2", "nb-3", "nb-4"] and "nb" not in names


def test_trace_mode_starts_empty_when_it_replays_the_placed_pods() -> None:
    ns = nodes()
    placed, _ = split(load(pod_obj("held", node="n0", cards=[(ns[0].cards[0].uuid, 4000, 25)])), CFG)
    on, start = begin(
        Placed(placed, "pods.yaml", in_workload=True), ns, config=CFG, trace=True, from_empty=False
    )
    assert (
        on == [] and start.replayed == 1 and start.text().startswith("start: empty cards (the trace replays")
    )
    on, start = begin(
        Placed(placed, "cluster", in_workload=False), ns, config=CFG, trace=True, from_empty=False
    )
    assert len(on) == 1 and start.pods == 1
    on, start = begin(Placed(placed, "cluster"), ns, config=CFG, trace=False, from_empty=True)
    assert on == [] and start.text() == "start: empty cards (--from-empty)"


def test_shape_grammar() -> None:
    s = parse_shape(" nvidia.com/gpu=2, nvidia.com/gpumem-percentage=50 ,cpu=500m,memory=2Gi", config=CFG)
    assert s.text == "nvidia.com/gpu=2,nvidia.com/gpumem-percentage=50,cpu=500m,memory=2Gi"
    (c,) = s.pod.obj["spec"]["containers"]
    assert c["resources"]["requests"] == {"cpu": "500m", "memory": "2Gi"}
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert (s.pod.cpu_milli, s.pod.memory_mib, s.pod.gpu_demand) == (500, 2048, 1.0)  # 2 x 50 %
    # A bare count is a whole card, as the webhook makes it.
    assert parse_shape("nvidia.com/gpu=1", config=CFG).pod.gpu_demand == 1.0
    with pytest.raises(InvalidRequest, match="--what-if-shape: nvidia.com/gpucores=-5 must not be negative"):
        parse_shape("nvidia.com/gpu=1,nvidia.com/gpucores=-5", config=CFG)


def test_the_cap_bounds_the_count_and_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    ns = nodes(1, 1)  # one T4: 10 slots, so at most 10 pods of any shape, then one more that fails
    assert pod_cap(ns) == 11
    tiny = parse_shape("nvidia.com/gpu=1,nvidia.com/gpumem=1,nvidia.com/gpucores=1", config=CFG)
    answer = what_if(ns, [], tiny, config=CFG, policies=[], current=Policy("binpack", "spread"))
    (o,) = answer.outcomes
    assert (o.fit, o.capped, o.stopped_by) == (10, False, "CardTimeSlicingExhausted")
    assert o.gpu_allocation_ratio == pytest.approx(0.1)
    monkeypatch.setattr(whatif, "MAX_PODS", 5)
    assert pod_cap(ns) == 5
    (o,) = what_if(ns, [], tiny, config=CFG, policies=[], current=Policy("binpack", "spread")).outcomes
    assert (o.fit, o.capped, o.stopped_by) == (5, True, None)


def test_a_cordoned_node_keeps_its_pods_and_takes_no_new_one() -> None:
    n0, n1 = nodes()
    n1 = replace(n1, obj={**n1.obj, "spec": {"unschedulable": True}})
    placed, _ = split(load(pod_obj("held", node="n1", cards=[(n1.cards[0].uuid, 4000, 25)])), CFG)
    shape = parse_shape("nvidia.com/gpu=1,nvidia.com/gpumem=4000,nvidia.com/gpucores=25", config=CFG)
    # Each T4 takes 3 pods of 4000 MiB (15360 // 4000); only n0's two cards are open.
    answer = what_if([n0, n1], placed, shape, config=CFG, policies=[], current=Policy("spread", "spread"))
    (o,) = answer.outcomes
    assert (o.fit, o.capped) == (6, False)
    assert o.memory_allocation_ratio == pytest.approx((6 + 1) * 4000 / (4 * T4))  # the held pod still counts
    # A pod that asks for no device (kube-scheduler alone) is refused by the cordon too.
    cpu_only = load(pod_obj("cpu", cpu="1"))[0]
    cpu_only = replace(
        cpu_only, gpu_demand=0.0, obj={**cpu_only.obj, "spec": {"containers": [{"name": "c"}]}}
    )
    r = run(Workload([n1], [cpu_only, shape.pod]), config=CFG, policy=Policy("binpack", "binpack"),
            mode=Mode.FILL, arrival=50, seed=1, placements=True)  # fmt: skip
    assert r.scheduled == 0 and r.failure_reasons["Insufficient cpu/memory"] == r.failed
    assert r.placements and {p.reason for p in r.placements} == {
        "0/1 nodes are available: 1 node(s) were unschedulable"
    }
