"""hami.simulate.engine: replays through the real ClusterState, on small hand-built and generated inputs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from hami import annotations as A
from hami.config import DeviceConfig
from hami.errors import InvalidRequest
from hami.simulate.engine import (
    Mode,
    Policy,
    card_allocation,
    parse_policy,
    run,
    summarise_failure,
)
from hami.simulate.generate import generate_default
from hami.simulate.workload import DEFAULT_GPU_MODELS, Workload, gpu_node, openb_pod

CFG = DeviceConfig()
BINPACK = Policy("binpack", "binpack")
SPREAD = Policy("spread", "spread")


def node(name, gpus=1, model="T4", cpu=64000, mem=262144):
    return gpu_node(
        name,
        cpu_milli=cpu,
        memory_mib=mem,
        gpus=gpus,
        model=model,
        card_mib=DEFAULT_GPU_MODELS.get(model, 0),
        config=CFG,
    )


def pod(name, num_gpu=1, milli=500, cpu=1000, mem=1024, spec=(), created=None, deleted=None):
    return openb_pod(
        name,
        cpu_milli=cpu,
        memory_mib=mem,
        num_gpu=num_gpu,
        gpu_milli=milli,
        gpu_spec=list(spec),
        config=CFG,
        gpu_models=DEFAULT_GPU_MODELS,
        creation_time=created,
        deletion_time=deleted,
    )


def test_fill_stops_at_the_arrival_target_and_reports_the_first_failure():
    w = Workload([node("n1")], [pod("half")])
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=130, placements=True)
    # 0.5 + 0.5 fit on the one T4; the third half-card pod (arrived 1.5 cards = 150 %) does not.
    assert (r.pods, r.gpu_pods, r.scheduled, r.failed, r.failed_gpu_pods) == (3, 3, 2, 1, 1)
    assert r.first_failure_arrival == pytest.approx(150.0)
    assert r.arrived_gpu_demand == pytest.approx(150.0)
    assert (r.gpu_allocation_ratio, r.memory_allocation_ratio) == (1.0, 1.0)
    assert [(c.arrival, c.gpu_allocation_ratio) for c in r.checkpoints] == [
        (10.0, 0.5), (20.0, 0.5), (30.0, 0.5), (40.0, 0.5), (50.0, 0.5),
        (60.0, 1.0), (70.0, 1.0), (80.0, 1.0), (90.0, 1.0), (100.0, 1.0),
        (110.0, 1.0), (120.0, 1.0), (130.0, 1.0),
    ]  # fmt: skip
    assert [
        (p.pod, p.node, p.card_uuid, p.card_model, p.mem_mib, p.cores, p.reason) for p in r.placements
    ] == [
        ("half", "n1", "GPU-n1-0", "NVIDIA-T4", 7680, 50, ""),
        ("half-2", "n1", "GPU-n1-0", "NVIDIA-T4", 7680, 50, ""),
        ("half-3", "", "", "", None, None, "0/1 nodes fit: 1 CardInsufficientMemory"),
    ]
    assert r.failure_reasons == {"CardInsufficientMemory": 1}
    assert len(r.decision_s) == 3


def test_annotations_are_what_the_extender_writes():
    w = Workload([node("n1")], [pod("half")])
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=130, annotations=True)
    entry = "GPU-n1-0,NVIDIA,7680,50:;"
    assert r.annotations == [
        (
            "half",
            {
                A.ASSIGNED_NODE: "n1",
                A.ASSIGNED_TIME: "0",
                A.NVIDIA_TO_ALLOCATE: entry,
                A.NVIDIA_ALLOCATED: entry,
            },
        ),
        (
            "half-2",
            {
                A.ASSIGNED_NODE: "n1",
                A.ASSIGNED_TIME: "1",
                A.NVIDIA_TO_ALLOCATE: entry,
                A.NVIDIA_ALLOCATED: entry,
            },
        ),
    ]


def test_fill_binpack_and_spread_use_cards_differently():
    w = Workload([node("a", gpus=2), node("b", gpus=2)], [pod("q", milli=250)])
    by = {}
    for pol in (BINPACK, SPREAD):
        r = run(w, config=CFG, policy=pol, mode=Mode.FILL, arrival=25, placements=True)
        by[pol.label] = [(p.node, p.card_uuid) for p in r.placements]
    # 4 cards, 25 % arrival = 1 card = four quarter-card pods.
    assert by["binpack"] == [("a", "GPU-a-0")] * 4
    assert by["spread"] == [("a", "GPU-a-0"), ("b", "GPU-b-0"), ("a", "GPU-a-1"), ("b", "GPU-b-1")]


def test_same_seed_same_pod_stream_for_every_policy():
    w = generate_default(config=CFG, seed=1, nodes=20, pods=200)
    a = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=60, seed=7, placements=True)
    b = run(w, config=CFG, policy=SPREAD, mode=Mode.FILL, arrival=60, seed=7, placements=True)
    assert [p.pod for p in a.placements] == [p.pod for p in b.placements]
    c = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=60, seed=8, placements=True)
    assert [p.pod for p in c.placements] != [p.pod for p in a.placements]


def test_unknown_model_pod_fails_with_its_reason_without_reaching_the_filter():
    w = Workload(
        [node("n1", gpus=4)], [pod("x", spec=["H100"], created=0, deleted=5), pod("ok", created=1, deleted=6)]
    )
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.TRACE, placements=True)
    assert (r.scheduled, r.failed, r.failed_gpu_pods) == (1, 1, 1)
    assert r.placements[0].reason.startswith("unknown GPU model H100 in gpu_spec (known: A10, G2")
    assert r.failure_reasons == {"unknown GPU model H100": 1}
    assert len(r.decision_s) == 1
    assert r.first_failure_arrival == pytest.approx(0.5 / 4 * 100)


def test_gpu_spec_restricts_the_model_through_use_gputype():
    w = Workload(
        [node("t4", gpus=2, model="T4"), node("v", gpus=2, model="V100M32")],
        [pod("want-v", milli=1000, spec=["V100M16", "V100M32"])],
    )
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=75, placements=True)
    # Three whole-card pods asking V100: two fit on the V100 node, the third cannot use the T4s.
    assert [(p.node, p.card_model) for p in r.placements[:2]] == [("v", "NVIDIA-V100M32")] * 2
    # The V100 cards are full, the T4s are the wrong model.
    assert r.placements[2].reason == "0/2 nodes fit: 1 CardInsufficientMemory; 1 CardTypeMismatch"
    assert r.failure_reasons == {"CardInsufficientMemory": 1}


def test_cpu_memory_fit_comes_first_and_cpu_only_pods_take_no_card():
    w = Workload(
        [node("small", cpu=2000, mem=4096), node("big", cpu=8000, mem=4096)],
        [
            pod("cpu-only", num_gpu=0, milli=0, cpu=3000, mem=1024, created=0),
            pod("gpu", cpu=4000, created=1),
            pod("huge", cpu=9000, created=2),
        ],
    )
    r = run(w, config=CFG, policy=SPREAD, mode=Mode.TRACE, placements=True)
    rows = [(p.pod, p.node, p.card_uuid, p.reason) for p in r.placements]
    assert rows == [
        ("cpu-only", "big", "", ""),
        ("gpu", "big", "GPU-big-0", ""),
        ("huge", "", "", "0/2 nodes are available: 2 Insufficient cpu"),
    ]
    assert (r.gpu_pods, r.pods, r.failure_reasons) == (2, 3, {"Insufficient cpu/memory": 1})


def test_trace_deletion_frees_the_card_through_the_core():
    w = Workload(
        [node("n1")],
        [
            pod("first", milli=1000, created=0, deleted=10),
            pod("blocked", milli=1000, created=5, deleted=20),
            pod("after", milli=1000, created=10, deleted=30),  # arrives the second `first` leaves
            pod("instant", milli=500, created=40, deleted=40),
        ],
    )
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.TRACE, placements=True)
    assert [(p.pod, p.node) for p in r.placements] == [
        ("first", "n1"),
        ("blocked", ""),
        ("after", "n1"),
        ("instant", "n1"),
    ]
    assert (r.scheduled, r.failed, r.deleted) == (3, 1, 3)
    assert (r.peak_gpu_allocation_ratio, r.peak_time) == (1.0, 0.0)
    assert (r.gpu_allocation_ratio, r.memory_allocation_ratio) == (0.0, 0.0)
    assert r.state.usage_snapshot() == {"n1": {}}
    assert r.first_failure_arrival == pytest.approx(200.0)


def test_fill_names_every_draw_apart_from_the_input_pods():
    w = Workload([node("n1", gpus=8)], [pod("a", milli=100), pod("a-2", milli=100)])
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=100, seed=1, placements=True)
    names = [p.pod for p in r.placements]
    assert len(names) == len(set(names)) == r.pods > 60
    assert "a~2" in names and "a-2-2" in names


def test_trace_curve_starts_at_the_first_event_and_keeps_every_peak():
    # 1 early pod, then a burst of 1200 short pods (over 500 events: the curve is sampled per bucket)
    # where one moment holds 4 whole cards; the curve must show the early pod and that moment.
    pods = [pod("early", milli=1000, created=0, deleted=100_000)]
    for i in range(600):
        t = 50_000 + 10 * i
        pods.append(pod(f"b{i}", milli=500, created=t, deleted=t + 5))
    pods += [pod(f"peak{i}", milli=1000, created=60_003, deleted=60_004) for i in range(3)]
    w = Workload([node("n1", gpus=8)], pods)
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.TRACE)
    first, last = r.curve[0], r.curve[-1]
    assert (first.time, first.gpu_allocation_ratio) == (0.0, 1 / 8)
    assert (last.time, last.gpu_allocation_ratio) == (100_000.0, 0.0)
    assert max(c.gpu_allocation_ratio for c in r.curve) == r.peak_gpu_allocation_ratio == 4 / 8
    assert r.peak_time == 60_003.0
    times = [c.time for c in r.curve]
    events = 2 * len(pods)
    buckets = -(-events // (events // 500))
    assert times == sorted(times) and len(r.curve) <= 2 * buckets + 2


def test_trace_mode_needs_creation_times():
    w = Workload([node("n1")], [pod("a")])
    with pytest.raises(
        InvalidRequest, match=r"--mode trace needs a creation time for every pod; 1 pods have none"
    ):
        run(w, config=CFG, policy=BINPACK, mode=Mode.TRACE)
    with pytest.raises(InvalidRequest, match="no GPU"):
        run(Workload([node("c", gpus=0)], [pod("a")]), config=CFG, policy=BINPACK)
    coreless = DeviceConfig(nvidia=replace(CFG.nvidia, deviceCoreScaling=0.001))
    n = gpu_node("z", cpu_milli=1, memory_mib=1, gpus=1, model="T4", card_mib=15360, config=coreless)
    assert n.cards[0].devcore == 0
    with pytest.raises(InvalidRequest, match="^every card registers devcore 0"):
        run(Workload([n], [pod("a", created=0)]), config=CFG, policy=BINPACK, mode=Mode.TRACE)
    with pytest.raises(InvalidRequest, match="at least one GPU pod"):
        run(Workload([node("n1")], [pod("c", num_gpu=0, milli=0)]), config=CFG, policy=BINPACK)


@pytest.mark.parametrize("mode", [Mode.FILL, Mode.TRACE])
@pytest.mark.parametrize(
    "policy",
    [
        BINPACK,
        SPREAD,
        Policy("binpack", "numa,binpack"),
        Policy("spread", "mutex"),
        Policy("fragmentation", "fragmentation"),
        Policy("spread", "fragmentation"),
    ],
    ids=["binpack", "spread", "numa-binpack", "spread-mutex", "fragmentation", "spread-fragmentation"],
)
def test_generated_replay_never_overcommits_and_matches_the_core_view(mode, policy):
    w = generate_default(config=CFG, seed=2, nodes=24, pods=400)
    r = run(w, config=CFG, policy=policy, mode=mode, arrival=120, seed=2, placements=True)
    cards = {c.uuid: c for n in w.nodes for c in n.cards}
    spec = {p.name: p.obj["metadata"]["annotations"].get("nvidia.com/use-gputype") for p in w.pods}
    if mode is Mode.FILL:
        used = defaultdict(lambda: [0, 0, 0])
        per_container = defaultdict(list)
        for p in r.placements:
            if not p.card_uuid:
                continue
            u = used[p.card_uuid]
            u[0] += 1
            u[1] += p.mem_mib
            u[2] += p.cores
            per_container[(p.pod, p.container)].append(p.card_uuid)
            allowed = spec[p.pod.rsplit("-", 1)[0] if p.pod.count("-") > 2 else p.pod]
            if allowed:
                assert any(m in p.card_model for m in allowed.split(",")), (p, allowed)
        for uuid, (slots, mem, cores) in used.items():
            c = cards[uuid]
            assert slots <= c.count and mem <= c.devmem and cores <= c.devcore, uuid
        for uuids in per_container.values():
            assert len(uuids) == len(set(uuids))
        assert r.scheduled + r.failed == r.pods > 0
        assert r.checkpoints[-1].arrival == 120.0
    g, m, per_model = card_allocation(r.state)
    assert (r.gpu_allocation_ratio, r.memory_allocation_ratio) == pytest.approx((g, m))
    assert r.per_model == per_model


def test_compare_yields_different_packing_on_the_same_stream():
    w = generate_default(config=CFG, seed=0, nodes=30, pods=500)
    rb = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=130, placements=True)
    rs = run(w, config=CFG, policy=SPREAD, mode=Mode.FILL, arrival=130, placements=True)
    assert rb.pods == rs.pods and rb.gpu_pods == rs.gpu_pods
    assert rb.arrived_gpu_demand == rs.arrived_gpu_demand >= 130
    assert rb.first_failure_arrival is not None and rs.first_failure_arrival is not None
    # The same pods, in the same order, packed differently: binpack fills few nodes, spread many.
    assert [p.pod for p in rb.placements] == [p.pod for p in rs.placements]
    node_of = [{p.pod: p.node for p in r.placements if p.card_uuid} for r in (rb, rs)]
    assert node_of[0] != node_of[1]
    early = [list(dict.fromkeys(p.pod for p in r.placements if p.card_uuid))[:20] for r in (rb, rs)]
    assert early[0] == early[1]
    spread_nodes = [len({node_of[k][pod] for pod in early[k]}) for k in (0, 1)]
    assert spread_nodes[0] < spread_nodes[1], spread_nodes


def test_parse_policy():
    assert parse_policy("binpack") == Policy("binpack", "binpack")
    assert parse_policy(" Spread ") == Policy("spread", "spread")
    assert parse_policy("numa") == Policy("binpack", "numa")
    assert parse_policy("topology-aware", default_node="spread") == Policy("spread", "topology-aware")
    assert parse_policy("spread/numa+binpack") == Policy("spread", "numa,binpack")
    assert parse_policy("binpack/spread").label == "binpack/spread"
    assert parse_policy("spread/numa+binpack").label == "spread/numa+binpack"
    assert parse_policy("spread").label == "spread"
    assert parse_policy("fragmentation") == Policy("fragmentation", "fragmentation")
    assert parse_policy("spread/fragmentation").label == "spread/fragmentation"
    # Empty links of a chain are dropped, so the label stays readable.
    assert parse_policy("binpack/numa++binpack") == Policy("binpack", "numa,binpack")
    for bad in ("fastest", "numa/binpack", "binpack/", "binpack/fast"):
        with pytest.raises(
            InvalidRequest, match=f"^--policy: '{bad}' is not a policy; valid: binpack, spread, numa"
        ):
            parse_policy(bad)
    with pytest.raises(InvalidRequest, match="^--compare: 'x' is not a policy"):
        parse_policy("x", flag="--compare")


def test_summarise_failure():
    text, category = summarise_failure(
        {
            "a": "1/8 CardInsufficientMemory, 7/8 CardTimeSlicingExhausted",
            "b": "2/2 CardInsufficientMemory",
            "c": "2/2 CardInsufficientMemory",
            "d": "NodeInsufficientDevice: no NVIDIA device",
            "e": "node unregistered: no device registration annotation",
        }
    )
    assert text == (
        "0/5 nodes fit: 2 CardInsufficientMemory; 1 CardInsufficientMemory, CardTimeSlicingExhausted; "
        "1 NodeInsufficientDevice; 1 other"
    )
    assert category == "CardInsufficientMemory"


def test_fractional_pod_holds_its_share_in_the_core():
    w = Workload([node("n1", gpus=2)], [pod("p", milli=320)])
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=10)
    assert r.scheduled == 1
    snap = r.state.usage_snapshot()
    # 32 % of a T4's 15360 MiB, 32 % of its cores, one slot.
    assert snap == {"n1": {"GPU-n1-0": (1, 4915, 32)}}


def test_core_warnings_are_counted_per_pod(tmp_path):
    from hami.simulate import kubeyaml

    f = tmp_path / "p.yaml"
    f.write_text(
        "kind: Pod\nmetadata: {name: a, annotations: {hami.io/gpu-scheduler-policy: tightest}}\n"
        "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpucores: 50}}}]}\n"
    )
    w = Workload([node("n1", gpus=2)], kubeyaml.load_pods(f, config=CFG))
    r = run(w, config=CFG, policy=BINPACK, mode=Mode.FILL, arrival=100)
    assert r.scheduled == 2
    assert r.warnings == {
        "hami.io/gpu-scheduler-policy: unknown policy 'tightest'; valid: binpack, spread, numa, mutex, "
        "topology-aware, fragmentation or a comma chain of them such as 'binpack,numa'; using the default 'binpack'": 4
    }


def test_full_core_pods_share_cards_registered_with_core_scaling(tmp_path):
    from hami.simulate import kubeyaml

    # deviceCoreScaling 2: every T4 registers 200 % of cores, so two gpucores: 100 pods share one card
    # (the fit's rule); the filter's prefilter used to refuse the second with ExclusiveDeviceAllocateConflict.
    scaled = DeviceConfig(nvidia=replace(CFG.nvidia, deviceCoreScaling=2.0))
    n = gpu_node("n1", cpu_milli=64000, memory_mib=262144, gpus=1, model="T4", card_mib=15360, config=scaled)
    f = tmp_path / "p.yaml"
    f.write_text(
        "kind: Pod\nmetadata: {name: a}\n"
        "spec: {containers: [{name: c, resources: {limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 4000, "
        "nvidia.com/gpucores: 100}}}]}\n"
    )
    w = Workload([n], kubeyaml.load_pods(f, config=scaled))
    r = run(w, config=scaled, policy=BINPACK, mode=Mode.FILL, arrival=150, placements=True)
    assert [(p.pod, p.card_uuid, p.cores, p.reason) for p in r.placements] == [
        ("a", "GPU-n1-0", 100, ""),
        ("a-2", "GPU-n1-0", 100, ""),
        ("a-3", "", None, "0/1 nodes fit: 1 CardInsufficientCore"),
    ]
    assert r.state.usage_snapshot() == {"n1": {"GPU-n1-0": (2, 8000, 200)}}


def test_node_selector_is_kube_schedulers_node_affinity_filter():
    labelled = node("pool-a")
    labelled.obj.setdefault("metadata", {}).setdefault("labels", {})["pool"] = "a"

    def pinned(name, created, selector):
        p = pod(name, cpu=1000, created=created)
        p.obj["spec"]["nodeSelector"] = selector
        return p

    w = Workload(
        [node("other"), labelled],
        [
            pinned("gpu-a", 0, {"pool": "a"}),
            pinned("cpu-a", 1, {"pool": "a"}),
            pinned("nowhere", 2, {"pool": "b"}),
        ],
    )
    w.pods[1] = replace(w.pods[1], gpu_demand=0.0)  # a CPU-only pod: kube-scheduler alone
    r = run(w, config=CFG, policy=SPREAD, mode=Mode.TRACE, placements=True)
    rows = [(p.pod, p.node, p.reason) for p in r.placements]
    # without the selector, spread and LeastAllocated would take the emptier node "other"
    assert rows == [
        ("gpu-a", "pool-a", ""),
        ("cpu-a", "pool-a", ""),
        ("nowhere", "", "0/2 nodes are available: 2 node(s) didn't match Pod's node affinity/selector"),
    ]
    assert r.failure_reasons == {"node affinity/selector": 1}
